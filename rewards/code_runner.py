"""The test process of a function test: the dataset's trusted test code, run in a clean interpreter that never
sees the candidate's code. Standard library only; nothing runs at import.

Started by the host (:mod:`toolgym.rewards.code_grader`) as ``python -I -c BOOT WIRE_SOURCE THIS_SOURCE FD``;
``BOOT`` loads :mod:`toolgym.rewards.code_wire` as module ``_tg_wire`` and calls :func:`main`. The job (one
JSON line) and then the host's replies arrive on stdin; requests and the single final report go out on
fd ``FD``, a pipe only the host holds the other end of. The test code's own stdin, stdout and stderr are
/dev/null.

The candidate's functions are proxies (:class:`Remote`): a call sends its arguments as plain data, the host
runs it in the candidate's sandbox session, and the result comes back rebuilt from exact built-in types, so
every comparison the tests make is between plain values. Names the tests use without defining resolve, in
order: the test's own globals (prelude included), builtins, the standard library's modules (``math`` is the
real one even if the candidate defined a class named ``math``), then the candidate's top-level functions.
"""

from __future__ import annotations

from typing import Any

BOOT = (
    "import sys, types\n"
    "w = types.ModuleType('_tg_wire')\n"
    "exec(compile(sys.argv[1], 'code_wire.py', 'exec'), w.__dict__)\n"
    "sys.modules['_tg_wire'] = w\n"
    "ns = {'__name__': '_tg_runner'}\n"
    "exec(compile(sys.argv[2], 'code_runner.py', 'exec'), ns)\n"
    "ns['main']()\n"
)


class CandidateCrashed(BaseException):
    """The candidate gave no valid answer (it died, timed out, exited, or sent garbage). A BaseException,
    so a test's ``except Exception`` cannot turn it into a pass."""


class NotPlainData(BaseException):
    """A value that cannot cross between the processes (an argument or the candidate's result)."""


class CandidateError(Exception):
    """An exception the candidate's function raised whose type is not a built-in exception."""


def main() -> None:
    import ast
    import builtins
    import contextlib
    import json
    import os
    import sys

    import _tg_wire as wire  # type: ignore[import-not-found]

    with contextlib.suppress(Exception):  # no same-uid process may read this one's memory or ptrace it
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    rx = os.fdopen(os.dup(0), "rb")
    tx = int(sys.argv[3])
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

    state = {"case": 0, "calls": 0}
    names = set(job.get("names", ()))

    class Remote:
        """One of the candidate's functions, called across the process boundary with plain data."""

        def __init__(self, name: str) -> None:
            self.__name__ = self.__qualname__ = name

        def __repr__(self) -> str:
            return f"<candidate function {self.__name__}>"

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            try:
                request = wire.dumps({"fn": self.__name__, "args": list(args), "kwargs": kwargs})
            except (wire.WireError, RecursionError) as exc:
                raise NotPlainData(f"argument of {self.__name__}: {exc}") from None
            state["calls"] += 1
            send({"call": request, "case": state["case"]})
            reply = recv()
            if "crash" in reply:
                raise CandidateCrashed(str(reply["crash"]))
            raised: BaseException | None = None
            try:
                answer = json.loads(reply["raw"])
                if type(answer) is not dict:
                    raise wire.WireError("not a report")
                if "exc" in answer:
                    name, msg = str(answer["exc"]), str(answer.get("msg", ""))
                    known = builtins.__dict__.get(name)
                    if name == "NotPlainData":
                        raised = NotPlainData(msg)
                    elif (
                        isinstance(known, type)
                        and issubclass(known, Exception)
                        and not issubclass(known, (StopIteration, StopAsyncIteration))
                    ):  # a StopIteration would end a map() or generator early: all(map(f, xs)) == True
                        try:
                            raised = known(msg)
                        except Exception:  # a type that needs other arguments (UnicodeDecodeError)
                            raised = CandidateError(f"{name}: {msg}")
                    else:
                        raised = CandidateError(f"{name}: {msg}")
                    raise raised
                value = wire.from_wire(answer["value"])
                changed = answer.get("changed") or {}
                if type(changed) is not dict:
                    raise wire.WireError("bad changed arguments")
                for key, raw in changed.items():
                    i = int(key)
                    arg, new = args[i], wire.from_wire(raw)
                    if type(arg) is not type(new):
                        continue
                    if type(arg) in (list, bytearray):
                        arg[:] = new
                    elif type(arg) in (dict, set):
                        arg.clear()
                        arg.update(new)
            except (wire.WireError, KeyError, ValueError, IndexError, TypeError, RecursionError) as exc:
                if exc is raised:
                    raise
                raise CandidateCrashed(f"malformed answer: {type(exc).__name__}") from None
            return value

    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())

    class Globals(dict):  # type: ignore[type-arg]
        """The test's globals: a name it never bound resolves to the standard library, then the candidate."""

        def __missing__(self, key: str) -> Any:
            if key in builtins.__dict__:
                raise KeyError(key)  # the builtin is found next: a candidate's `abs` never shadows it
            if key in stdlib:
                import importlib

                with contextlib.suppress(ImportError):
                    module = importlib.import_module(key)
                    self[key] = module
                    return module
            if key in names:
                remote = Remote(key)
                self[key] = remote
                return remote
            raise KeyError(key)

    ns = Globals({"__name__": "__test__", "__builtins__": builtins})
    entry = job.get("entry_point")
    results: list[dict[str, Any]] = []

    def outcome(exc: BaseException | None) -> dict[str, Any]:
        if exc is None:
            return {"passed": True, "why": ""}
        return {"passed": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"}

    try:
        if job.get("prelude"):
            exec(compile(job["prelude"], "prelude.py", "exec"), ns)
        if entry:
            ns[entry] = Remote(entry)
        kind = job["kind"]
        if kind == "module":
            exec(compile(job["source"], "test.py", "exec"), ns)
        elif kind == "check":
            exec(compile(job["source"], "test.py", "exec"), ns)
            if not callable(ns.get("check")):
                raise NameError("the test defines no check(candidate) function")
        compiled = []
        for case in job["cases"]:
            compiled.append(
                compile(ast.parse(case, "test.py"), "test.py", "exec") if kind == "asserts" else None
            )
    except BaseException as exc:
        if state["calls"]:  # module-level test code called the candidate: every case fails with it
            send({"report": [outcome(exc) for _ in job["cases"]]})
        else:  # the dataset's test code is broken: not the candidate's doing
            send({"setup_error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        os._exit(0)
    for i, case in enumerate(job["cases"]):
        state["case"] = i
        try:
            if kind == "asserts":
                exec(compiled[i] or "", ns)
            elif kind == "module":
                fn = ns.get(case)
                if not callable(fn):
                    raise NameError(f"test function {case} not found")
                fn()
            else:
                ns["check"](Remote(entry))
            results.append(outcome(None))
        except BaseException as exc:  # a skipped test, a SystemExit, a crash: all failures
            results.append(outcome(exc))
    send({"report": results})
    os._exit(0)
