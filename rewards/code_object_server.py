"""The candidate's side of a function test: an "object server" inside a sandbox session.

Sent as source into the session (after :mod:`toolgym.rewards.code_wire`, whose functions it uses), then
driven by the host one request per session run:

- ``_tg_load()``: runs the candidate's code (``{"code", "byval"}`` on stdin) as module ``solution`` and
  reports its public names: functions and classes as references, imported modules by their real name;
- ``_tg_call()``: one request ``{"op", "ref", "name", "args", "kwargs", "memo", "objs"}`` from stdin: call a
  function, method or class, read/set/delete an attribute, apply an operator (``len``, ``getitem``, ``add``,
  ...), or report objects' state; it reports the result, or the exception's type and message, or a call
  back into the tests that it needs answered first (``need``).

Values cross as plain data (:mod:`toolgym.rewards.code_wire`). What is not plain data stays here and crosses
as a reference (``$ref``: an id in ``_REG``, its class, and the plain state of its attributes), which the
test process turns into a proxy; instances of the tests' own classes (``byval``: ``ListNode`` from a
prelude) cross by value as a table of objects (``$obj``) the other side rebuilds with its own class. The
tests' functions arrive as ``$cb`` stubs: calling one asks the tests, and the request is replayed from its
start with the answers so far (``memo``), so no test code ever runs here.

Each report is one line ``\\x1eTGR <json>`` written to fd 1 after everything the candidate printed (its own
prints during a call go to a discarded buffer). Nothing here is trusted: this process is the candidate's, and
whatever it reports is simply the candidate's answer, checked by the tests in another process.
"""

from __future__ import annotations

import contextlib
from typing import Any

MARK = "\x1eTGR "
STATE_CAP = 2000  # objects whose state one reply carries unasked (a linked list walked without round trips)
STATE_BYTES = 256 << 10  # of states one reply carries unasked
MAX_CALLBACKS = 10_000  # calls back into the tests during one request
_TG: dict[str, Any] = {}  # the wire module and the candidate's module, set by the session's boot code
_REG: dict[int, Any] = {}  # reference id -> the candidate's object (kept alive: ids stay valid)
_RID: dict[int, int] = {}  # id(object) -> reference id
_BUILTIN_BASES = (bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset)


class _Pending(BaseException):
    """Unwinds a request whose call into the tests has no answer yet."""


class _Cb:
    """A function of the tests, as the candidate sees it: each call is answered by the tests (replayed)."""

    __slots__ = ("cbid",)

    def __init__(self, cbid: int) -> None:
        self.cbid = cbid

    def __repr__(self) -> str:
        return f"<test function {self.cbid}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        replay = _TG["replay"]
        i = replay["i"]
        replay["i"] = i + 1
        if i < len(replay["memo"]):
            answer = replay["memo"][i]
            if "exc" in answer:
                import builtins

                kind = builtins.__dict__.get(str(answer["exc"]))
                exc = None
                if isinstance(kind, type) and issubclass(kind, Exception):
                    with contextlib.suppress(Exception):  # a type that needs other arguments
                        exc = kind(str(answer.get("msg", "")))
                if exc is not None:
                    raise exc
                raise RuntimeError(f"{answer['exc']}: {answer.get('msg', '')}")
            return answer["value"]
        if replay["need"] is None:
            replay["need"] = (self.cbid, list(args), dict(kwargs))
        raise _Pending()


def _tg_report(obj: Any) -> None:
    import json
    import os

    data = ("\n" + MARK + json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _ref(obj: Any) -> int:
    rid = _RID.get(id(obj))
    if rid is None or _REG.get(rid) is not obj:
        rid = len(_REG) + 1
        _REG[rid] = obj
        _RID[id(obj)] = rid
    return rid


def _own_methods(cls: type) -> bool:
    """Whether a subclass of a built-in type adds public methods of its own (then it crosses as a reference)."""
    for klass in cls.__mro__:
        if klass in _BUILTIN_BASES or klass is object:
            break
        if any(not n.startswith("_") and callable(v) for n, v in vars(klass).items()):
            return True
    return False


def _class_info(cls: Any) -> dict[str, Any]:
    names = []
    for n in dir(cls):
        if n.startswith("_"):
            continue
        try:
            attr = getattr(cls, n)
        except Exception:
            continue
        if callable(attr) and not isinstance(attr, type):
            names.append(n)
    return {
        "name": str(getattr(cls, "__qualname__", "?"))[:200],
        "m": names[:500],
        "eq": getattr(cls, "__eq__", None) is not object.__eq__,
        "truth": hasattr(cls, "__bool__") or hasattr(cls, "__len__"),
    }


def _attrs(obj: Any) -> dict[str, Any]:
    """The object's own attributes (``__dict__`` and slots), public or not, dunders left out."""
    out: dict[str, Any] = {}
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        d = {}
    if type(d) is dict:
        out.update((k, v) for k, v in d.items() if type(k) is str and not k.startswith("__"))
    for klass in type(obj).__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if type(name) is str and not name.startswith("__") and name not in out:
                with contextlib.suppress(Exception):
                    out[name] = object.__getattribute__(obj, name)
    return out


class _Encoder:
    """The candidate's values in wire form, with the tables the other side rebuilds them from."""

    def __init__(self, byval: set[str], incoming: dict[int, int]) -> None:
        self.wire = _TG["wire"]
        self.byval, self.incoming = byval, incoming
        self.objs: list[Any] = []  # by-value table: [class name, attrs]
        self.obj_index: dict[int, int] = {}
        self.pending: list[Any] = []
        self.classes: dict[str, Any] = {}
        self.states: dict[str, Any] = {}
        self.queue: list[int] = []  # references whose state goes along
        self.state_bytes = 0

    def value(self, v: Any) -> Any:
        out = self.wire.to_wire(v, 0, self.hook)
        self.flush()
        return out

    def hook(self, v: Any, depth: int) -> Any:
        import types

        wire = self.wire
        t = type(v)
        if t is _Cb:
            return {"$cb": v.cbid}
        if id(v) in self.incoming:
            return {"$arg": self.incoming[id(v)]}
        if isinstance(v, types.ModuleType):
            raise wire.WireError("a module is not plain data")
        if t.__name__ in self.byval and not isinstance(v, (type, *_BUILTIN_BASES)):
            idx = self.obj_index.get(id(v))
            if idx is None:
                idx = self.obj_index[id(v)] = len(self.objs)
                self.objs.append(None)
                self.pending.append(v)
            return {"$obj": idx}
        if str(getattr(t, "__module__", "")).split(".")[0] == "numpy":
            return wire.NO
        if isinstance(v, _BUILTIN_BASES) and not _own_methods(t):
            return wire.NO
        if hasattr(t, "__next__") and hasattr(t, "__iter__") and not isinstance(v, type):
            return wire.NO  # iterators and generators are drained
        rid = _ref(v)
        if isinstance(v, type):
            cid, kind = rid, "c"
        else:
            cid, kind = _ref(t), ("f" if callable(v) else "o")
        infos = _TG.setdefault("infos", {})
        info = infos.get(cid)
        if info is None:
            info = infos[cid] = _class_info(_REG[cid])
            if kind == "o" and str(rid) not in self.states:
                self.queue.append(rid)
        self.classes[str(cid)] = info
        return {"$ref": [rid, cid, kind]}

    def flush(self) -> None:
        """Encodes the by-value objects and the states of references met so far (which may meet more)."""
        wire = self.wire
        done = 0
        while self.pending or (self.queue and done < STATE_CAP):
            if self.pending:
                v = self.pending.pop(0)
                attrs = {}
                for k, a in _attrs(v).items():
                    try:
                        attrs[k] = wire.to_wire(a, 1, self.hook)
                    except (wire.WireError, RecursionError):
                        continue
                self.objs[self.obj_index[id(v)]] = [type(v).__name__, attrs]
                continue
            self.state(self.queue.pop(0), eager=True)
            done += 1

    def state(self, rid: int, eager: bool = False) -> None:
        """Adds the object's plain attributes to the reply; one sent unasked (``eager``) only while small:
        the reply must stay within the sandbox's output limit."""
        wire = self.wire
        if str(rid) in self.states or rid not in _REG:
            return
        obj = _REG[rid]
        self.states[str(rid)] = {}  # a cycle back to this object is already on its way
        attrs = {}
        for k, a in _attrs(obj).items():
            try:
                attrs[k] = wire.to_wire(a, 1, self.hook)
            except (wire.WireError, RecursionError):
                continue
        if isinstance(obj, _BUILTIN_BASES):
            with contextlib.suppress(wire.WireError, RecursionError):
                attrs["$base"] = wire._encode_other(obj, 1, None)
        if eager:
            import json

            size = len(json.dumps(attrs, separators=(",", ":")))
            if size > STATE_BYTES // 4 or self.state_bytes + size > STATE_BYTES:
                del self.states[str(rid)]
                return
            self.state_bytes += size
        self.states[str(rid)] = attrs

    def tables(self) -> dict[str, Any]:
        self.flush()
        return {"objs": self.objs, "classes": self.classes, "states": self.states}


class _Decoder:
    """The tests' values as the candidate gets them: references resolved, by-value objects rebuilt with the
    candidate's class of the same name, the tests' functions as stubs."""

    def __init__(self, table: Any) -> None:
        import types

        wire = _TG["wire"]
        if type(table) is not list:
            raise wire.WireError("bad object table")
        module = _TG["module"]
        self.objs: list[Any] = []
        for entry in table:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str:
                raise wire.WireError("bad object table")
            cls = module.__dict__.get(entry[0])
            if not isinstance(cls, type) or issubclass(cls, _BUILTIN_BASES):
                cls = _TG.setdefault("made", {}).get(entry[0])
                if cls is None:
                    cls = _TG["made"][entry[0]] = types.new_class(entry[0])
            self.objs.append(object.__new__(cls))
        for obj, entry in zip(self.objs, table, strict=True):
            if type(entry[1]) is not dict:
                raise wire.WireError("bad object table")
            for k, raw in entry[1].items():
                if type(k) is str and k.isidentifier() and not k.startswith("__"):
                    with contextlib.suppress(AttributeError):
                        object.__setattr__(obj, k, wire.from_wire(raw, 1, self.hook))

    def hook(self, tag: str, body: Any, depth: int) -> Any:
        wire = _TG["wire"]
        if tag == "$ref" and type(body) is int:
            if body not in _REG:
                raise wire.WireError("a reference to an object this interpreter does not hold")
            return _REG[body]
        if tag == "$obj" and type(body) is int and 0 <= body < len(self.objs):
            return self.objs[body]
        if tag == "$cb" and type(body) is int:
            return _TG.setdefault("cbs", {}).setdefault(body, _Cb(body))
        if tag == "$bi" and type(body) is str and body.split(".")[0] in ("builtins", "math", "operator"):
            import importlib

            parts = body.split(".")
            found = importlib.import_module(parts[0])
            for part in parts[1:]:
                found = getattr(found, part)
            return found
        raise wire.WireError(f"unknown tag {tag!r}")


def _tg_load() -> None:
    import json
    import sys
    import types

    job = json.loads(sys.stdin.read())
    _TG["byval"] = set(job.get("byval") or ())
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    _TG["module"] = module
    try:
        exec(compile(job["code"], "solution.py", "exec"), module.__dict__)
    except BaseException as exc:  # SystemExit too: a module that leaves early defines nothing usable
        sys.stdout.flush()
        _tg_report({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        return
    sys.stdout.flush()
    _TG["replay"] = {"i": 0, "memo": [], "need": None}
    enc = _Encoder(_TG["byval"], {})
    names: dict[str, Any] = {}
    for name in sorted(module.__dict__):  # sorted: a reload gives the same names the same ids
        value = module.__dict__[name]
        if name.startswith("_") or type(name) is not str:
            continue
        if isinstance(value, types.ModuleType):
            real = getattr(value, "__name__", None)
            if type(real) is str and sys.modules.get(real) is value:
                names[name] = {"$mod": real}
        elif callable(value):
            try:
                names[name] = enc.value(value)
            except Exception:
                continue
    _tg_report({"names": names, **enc.tables()})


_OPS: dict[str, Any] = {}


def _ops() -> dict[str, Any]:
    import itertools
    import operator

    if _OPS:
        return _OPS
    wire = _TG["wire"]

    def drain(obj: Any) -> list[Any]:
        items = list(itertools.islice(iter(obj), wire.MAX_ITEMS + 1))
        if len(items) > wire.MAX_ITEMS:
            raise wire.WireError(f"iterator longer than {wire.MAX_ITEMS} items")
        return items

    _OPS.update(len=len, bool=bool, str=str, iter=drain, contains=lambda o, x: x in o, int=int, float=float)
    for name in (
        "getitem",
        "setitem",
        "delitem",
        "neg",
        "pos",
        "abs",
        "invert",
        "index",
        "lt",
        "le",
        "gt",
        "ge",
    ):
        _OPS[name] = getattr(operator, name)
    binary = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift")
    for name in (*binary, "and_", "or_", "xor"):
        fn = getattr(operator, name)
        key = name.rstrip("_")
        _OPS[key] = fn
        _OPS["r" + key] = lambda o, x, fn=fn: fn(x, o)
    return _OPS


def _snapshots(args: list[Any], incoming: dict[int, int]) -> dict[int, str]:
    """The wire text of each list, dict, set or bytearray argument (to find those the call changed)."""
    wire = _TG["wire"]
    out = {}
    for i, arg in enumerate(args):
        if type(arg) in (list, dict, set, bytearray):
            with contextlib.suppress(wire.WireError, RecursionError):
                out[i] = wire.dumps(arg, _Encoder(set(), incoming).hook)
    return out


def _apply(op: str, target: Any, name: Any, args: list[Any], kwargs: dict[str, Any], enc: _Encoder) -> Any:
    if op == "call":
        fn = getattr(target, name) if type(name) is str else target
        return fn(*args, **kwargs)
    if op == "get":
        return getattr(target, str(name))
    if op == "set":
        return setattr(target, str(name), args[0])
    if op == "del":
        return delattr(target, str(name))
    if op == "op":
        return _ops()[str(name)](target, *args)
    if op == "state":
        for rid in args:
            if type(rid) is int:
                enc.state(rid)
        return None
    raise ValueError(f"unknown request {op!r}")


def _tg_call() -> None:
    import io
    import json
    import sys

    wire = _TG["wire"]
    try:
        request = json.loads(sys.stdin.read())
        dec = _Decoder(request.get("objs", []))
        args = list(wire.from_wire(request.get("args", []), 0, dec.hook))
        kwargs = dict(wire.from_wire(request.get("kwargs", {"$dict": []}), 0, dec.hook))
        memo = []
        for raw in request.get("memo", [])[:MAX_CALLBACKS]:
            if "exc" in raw:
                memo.append({"exc": str(raw["exc"]), "msg": str(raw.get("msg", ""))})
            else:
                memo.append({"value": wire.from_wire(raw["value"], 0, dec.hook)})
        ref, name, op = request.get("ref"), request.get("name"), str(request["op"])
        if ref is None:
            target = _TG["module"]
        elif type(ref) is int and ref in _REG:
            target = _REG[ref]
        else:
            raise wire.WireError("a reference to an object this interpreter does not hold")
    except (wire.WireError, RecursionError, ValueError, KeyError, TypeError) as exc:
        _tg_report({"exc": "NotPlainData", "msg": f"the request did not cross: {exc}"[:200]})
        return
    incoming = {id(o): i for i, o in enumerate(dec.objs)}
    before = _snapshots(args, incoming)
    replay = _TG["replay"] = {"i": 0, "memo": memo, "need": None}
    enc = _Encoder(_TG.get("byval", set()), incoming)
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()  # the candidate's prints: kept out of the report stream
    value: Any = None
    try:
        try:
            result = _apply(op, target, name, args, kwargs, enc)
        finally:
            sys.stdout = real_stdout
        if replay["need"] is None:  # a caught _Pending still waits for its answer
            value = enc.value(result)
    except _Pending:
        pass
    except (wire.WireError, RecursionError) as exc:
        if replay["need"] is None:
            _tg_report({"exc": "NotPlainData", "msg": str(exc)[:200]})
            return
    except Exception as exc:
        if replay["need"] is None:
            _tg_report({"exc": type(exc).__name__, "msg": str(exc)[:500]})
            return
    try:
        if replay["need"] is not None:
            cbid, cargs, ckw = replay["need"]
            need = {"cb": cbid, "args": enc.value(cargs), "kwargs": enc.value(ckw)}
            _tg_report({"need": need, **enc.tables()})
            return
        after = _snapshots(args, incoming)
        changed = {str(i): enc.value(args[i]) for i, text in before.items() if after.get(i) != text}
        changed_objs = {}
        for i, obj in enumerate(dec.objs):
            attrs = {}
            for k, a in _attrs(obj).items():
                try:
                    attrs[k] = wire.to_wire(a, 1, enc.hook)
                except (wire.WireError, RecursionError):
                    continue
            changed_objs[str(i)] = attrs
        _tg_report({"value": value, "changed": changed, "args": changed_objs, **enc.tables()})
    except (wire.WireError, RecursionError, ValueError, TypeError) as exc:
        _tg_report({"exc": "NotPlainData", "msg": str(exc)[:200]})
