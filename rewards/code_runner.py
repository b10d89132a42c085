"""The test process of a function test: the dataset's trusted test code, run in a clean interpreter that never
sees the candidate's code. Standard library only; nothing runs at import.

Started by the host (:mod:`toolgym.rewards.code_grader`) as ``python -I -c BOOT WIRE REMOTE PROXY THIS FD``
(each module compiled once by the host and marshalled: the same interpreter runs both); ``BOOT`` loads
:mod:`toolgym.rewards.code_wire`, :mod:`toolgym.rewards.code_remote` and :mod:`toolgym.rewards.code_proxy` as
modules ``_tg_wire``, ``_tg_remote`` and ``_tg_proxy`` and calls :func:`main`. The job (one JSON line) and then
the host's replies arrive on stdin; requests and the single final report go out on fd ``FD``, a pipe only
the host holds the other end of. The test code's own stdin, stdout and stderr are /dev/null.

The candidate's functions, classes and objects are proxies (:mod:`toolgym.rewards.code_proxy`): a call
sends its arguments as plain data, the host runs it in the candidate's sandbox session, and the result comes
back as exact built-in types or as another proxy, so every comparison the tests make runs here. Names the
tests use without defining resolve, in order: the test's own globals (prelude included), builtins, then
the candidate's top-level functions and classes and the modules it imported under its own names (``np``:
this process imports numpy itself), as in MBPP's harness (the candidate's code, then the asserts, in one
namespace: a candidate's ``def heapq`` is the ``heapq`` the asserts call), then the standard library's
modules. One exception keeps the tests' modules theirs: a name the tests use only as a module (``math.``
something, never called or passed on its own) is the standard module even when the candidate defined a
class of that name (a ``class math`` whose ``isclose`` says True fools nothing). ``import solution`` gives
the candidate's module.
"""

from __future__ import annotations

from typing import Any

BOOT = (
    "import base64, marshal, sys, types\n"
    "for name, blob in zip(('_tg_wire', '_tg_remote', '_tg_proxy'), sys.argv[1:4]):\n"
    "    m = types.ModuleType(name)\n"
    "    exec(marshal.loads(base64.b64decode(blob)), m.__dict__)\n"
    "    sys.modules[name] = m\n"
    "ns = {'__name__': '_tg_runner'}\n"
    "exec(marshal.loads(base64.b64decode(sys.argv[4])), ns)\n"
    "ns['main']()\n"
)
# modules the candidate imported that this process imports for the tests by the same name: the standard
# library (less what opens windows or browsers) and common numeric libraries
NOT_IMPORTED = frozenset(
    {"antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser", "pydoc", "ensurepip",
     "venv", "lib2to3", "__main__", "solution"}
)  # fmt: skip
THIRD_PARTY = frozenset(
    {"numpy", "scipy", "pandas", "sympy", "networkx", "sortedcontainers", "more_itertools"}
)


def main() -> None:
    import ast
    import builtins
    import contextlib
    import json
    import os
    import sys
    import types

    import _tg_proxy as proxy  # type: ignore[import-not-found]
    import _tg_wire as wire  # type: ignore[import-not-found]

    with contextlib.suppress(Exception):  # no same-uid process may read this one's memory or ptrace it
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    rx = os.fdopen(os.dup(0), "rb")
    tx = int(sys.argv[5])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    job = json.loads(rx.readline())
    with contextlib.suppress(Exception):
        import resource

        limit = int(job.get("memory_mb", 2048)) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def send(obj: Any) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(tx, data) :]

    def recv() -> Any:
        line = rx.readline()
        if not line:
            os._exit(3)  # the host is gone
        return json.loads(line)

    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())

    def module(name: str) -> Any:
        import importlib

        top = name.split(".")[0]
        if top in NOT_IMPORTED or not (top in stdlib or top in THIRD_PARTY):
            raise proxy.NotPlainData(f"the tests do not import {name!r} for the candidate")
        return importlib.import_module(name)

    def module_only(sources: list[str]) -> set[str]:
        """Names the test code uses only as the base of an attribute (``math.isclose``): modules to it."""
        bases: set[str] = set()
        other: set[str] = set()
        for src in sources:
            try:
                tree = ast.parse(src or "")
            except (SyntaxError, ValueError):
                continue
            attr_bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Name):
                    (bases if id(n) in attr_bases else other).add(n.id)
        return bases - other

    link = proxy.Link(wire, send, recv, {}, module)
    names: dict[str, Any] = {}
    try:  # the candidate's names, as it reported them (its answer: garbage means it defines nothing)
        load = json.loads(job.get("load") or "{}")
        link_hook = link._decoder(load, [])
        for key, raw in (load.get("names") or {}).items():
            if type(key) is not str or key.startswith("_"):
                continue
            if type(raw) is dict and "$ref" in raw:
                names[key] = wire.from_wire(raw, 0, link_hook)
            elif type(raw) is dict and type(raw.get("$mod")) is str:
                names[key] = raw["$mod"]  # imported when the tests use it
    except Exception:
        names.clear()

    def candidate_name(key: str) -> Any:
        value = names[key]
        if type(value) is str:
            value = names[key] = module(value)
        if isinstance(value, proxy.RemoteClass):
            link.named.add(object.__getattribute__(value, "_rid"))  # the tests build it: its operators count
        return value

    test_sources = [job.get("prelude") or "", job.get("source") or ""]
    test_sources += list(job["cases"]) if job.get("kind") == "asserts" else []
    as_modules = module_only(test_sources)

    def candidate_first(key: str) -> bool:
        """The candidate's top-level name wins over a standard module of that name (MBPP's one namespace),
        unless the tests use the name only as a module."""
        return key in names and key not in as_modules

    class Globals(dict):  # type: ignore[type-arg]
        """The test's globals: a name it never bound resolves to the candidate, then the standard library
        (a name the tests use only as a module: the standard library first)."""

        def __missing__(self, key: str) -> Any:
            if key in builtins.__dict__:
                raise KeyError(key)  # the builtin is found next: a candidate's `abs` never shadows it
            if candidate_first(key):
                value = candidate_name(key)
                self[key] = value
                return value
            if key in stdlib:
                import importlib

                with contextlib.suppress(ImportError):
                    module = importlib.import_module(key)
                    self[key] = module
                    return module
            if key in names:
                value = candidate_name(key)
                self[key] = value
                return value
            raise KeyError(key)

    class Solution(types.ModuleType):
        """``import solution``: the candidate's module, its names as the tests' globals would give them."""

        def __getattr__(self, key: str) -> Any:
            if key.startswith("__"):
                raise AttributeError(key)
            if key in names:
                return candidate_name(key)
            return link.request("get", None, key)

    solution = Solution("solution")
    # a star import never rebinds a builtin, nor a standard module the tests use as one (a candidate's `abs`,
    # its `class math`); a candidate's `def heapq` the tests call it does bring
    solution.__all__ = sorted(  # type: ignore[attr-defined]
        n for n in names if n not in builtins.__dict__ and (n not in stdlib or candidate_first(n))
    )
    sys.modules["solution"] = solution

    ns = Globals({"__name__": "__test__", "__builtins__": builtins})
    sys.modules["__test__"] = types.ModuleType("__test__")  # dataclasses look their module up
    byval = set(job.get("byval") or ())
    entry = job.get("entry_point")
    results: list[dict[str, Any]] = []

    def outcome(exc: BaseException | None) -> dict[str, Any]:
        if exc is None:
            return {"passed": True, "why": ""}
        return {"passed": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"}

    try:
        if job.get("prelude"):
            exec(compile(job["prelude"], "prelude.py", "exec"), ns)
        kind = job["kind"]
        if kind in ("module", "check"):
            exec(compile(job["source"], "test.py", "exec"), ns)
        for name in byval:  # the tests' own classes: their instances cross by value
            cls = dict.get(ns, name)
            if isinstance(cls, type) and cls.__module__ == "__test__":
                link.byval[name] = cls
        if entry:
            if entry not in names:
                raise proxy.CandidateCrashed(f"the candidate defines no {entry}")
            ns[entry] = candidate_name(entry)
        if kind == "check" and not callable(ns.get("check")):
            raise NameError("the test defines no check(candidate) function")
        compiled = []
        for case in job["cases"]:
            compiled.append(
                compile(ast.parse(case, "test.py"), "test.py", "exec") if kind == "asserts" else None
            )
    except proxy.CandidateCrashed as exc:
        send({"report": [outcome(exc) for _ in job["cases"]]})
        os._exit(0)
    except BaseException as exc:
        if link.calls:  # module-level test code called the candidate: every case fails with it
            send({"report": [outcome(exc) for _ in job["cases"]]})
        else:  # the dataset's test code is broken: not the candidate's doing
            send({"setup_error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        os._exit(0)
    for i, case in enumerate(job["cases"]):
        link.case = i
        try:
            if kind == "asserts":
                exec(compiled[i] or "", ns)
            elif kind == "module":
                fn = ns.get(case)
                if not callable(fn):
                    raise NameError(f"test function {case} not found")
                fn()
            else:
                ns["check"](ns[entry])
            results.append(outcome(None))
        except BaseException as exc:  # a skipped test, a SystemExit, a crash: all failures
            results.append(outcome(exc))
    send({"report": results})
    os._exit(0)
