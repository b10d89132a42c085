"""The candidate's objects as the test process sees them: proxies whose comparisons run here.

Loaded into the test process (:mod:`toolgym.rewards.code_runner`) as module ``_tg_proxy``, after the proxy
classes (:mod:`toolgym.rewards.code_remote`, as ``_tg_remote``); standard library only, nothing runs at
import. A :class:`Link` sends requests (call, attribute, operator, state) through the
host to the candidate's object server (:mod:`toolgym.rewards.code_object_server`) and rebuilds the answers:

- plain data as exact built-in types (:mod:`toolgym.rewards.code_wire`);
- the candidate's objects as :class:`Remote` proxies (equal when they are the same object): attributes and
  method calls go to the candidate, whose answers are again plain data or proxies;
- instances of the tests' own classes (``byval``: a prelude's ``ListNode``) as instances of the tests' class,
  built here from the attributes' plain data; the tests' functions as callbacks the candidate may call.

What the candidate never decides: whether its object equals anything. ``==``, ``!=`` and ``hash`` are
computed here from the objects' plain state: a dataclass compares its fields, a class with its own ``__eq__``
its attributes, any other class by identity, a subclass of a built-in type its built-in value; a proxy never
equals plain data (except that built-in value). Operators, ``len``, ``bool``, iteration, indexing and
``str`` go to the candidate only for objects the tests built themselves from a candidate class they named
(``s = Stack(); len(s)``) and for what operators on those return; on anything else (an object returned where
a number was expected) they raise :class:`NotPlainData`, so a ``__sub__`` that returns 0 or a ``__bool__``
that returns True never reaches a verdict. ``bool()`` of an object whose class defines neither ``__bool__``
nor ``__len__`` is True here, as Python has it (``while node:`` walks a linked list).
"""

from __future__ import annotations

import contextlib
from typing import Any

try:  # the test process loads it as _tg_remote; the package (and its type checking) as usual
    from _tg_remote import (  # type: ignore[import-not-found]
        CandidateCrashed,
        CandidateError,
        NotPlainData,
        Remote,
        RemoteClass,
    )
except ImportError:
    from toolgym.rewards.code_remote import (
        CandidateCrashed,
        CandidateError,
        NotPlainData,
        Remote,
        RemoteClass,
    )

__all__ = ["CandidateCrashed", "CandidateError", "Link", "NotPlainData", "Remote", "RemoteClass"]
MAX_CALLBACKS = 10_000


def _raise_candidate(name: str, msg: str) -> None:
    import builtins

    known = builtins.__dict__.get(name)
    if name == "NotPlainData":
        raise NotPlainData(msg)
    # a StopIteration would end a map() or generator early: all(map(f, xs)) == True
    if (
        isinstance(known, type)
        and issubclass(known, Exception)
        and not issubclass(known, (StopIteration, StopAsyncIteration))
    ):
        try:
            exc = known(msg)
        except Exception:  # a type that needs other arguments (UnicodeDecodeError)
            exc = CandidateError(f"{name}: {msg}")
        raise exc
    raise CandidateError(f"{name}: {msg}")


class Link:
    """The test process's end of the candidate's object server; ``send``/``recv`` reach the host."""

    def __init__(self, wire: Any, send: Any, recv: Any, byval: dict[str, type], modules: Any) -> None:
        self.wire, self.send, self.recv = wire, send, recv
        self.byval = byval  # the tests' own classes, by name
        self.modules = modules  # imports a module the candidate's code uses (allow-listed) or raises
        self.case = 0
        self.calls = 0
        self.epoch = 0
        self.classes: dict[int, dict[str, Any]] = {}
        self.states: dict[int, tuple[int, dict[str, Any]]] = {}
        self.named: set[int] = set()
        self.cbs: list[Any] = []
        self.cb_ids: dict[int, int] = {}

    # --- values the tests send -------------------------------------------------------------------
    def _encoder(self) -> tuple[Any, list[Any], list[Any]]:
        wire = self.wire
        table: list[Any] = []
        objects: list[Any] = []
        index: dict[int, int] = {}
        pending: list[Any] = []

        def hook(v: Any, depth: int) -> Any:
            if isinstance(v, Remote):
                return {"$ref": object.__getattribute__(v, "_rid")}
            t = type(v)
            if self.byval.get(t.__name__) is t:
                i = index.get(id(v))
                if i is None:
                    i = index[id(v)] = len(table)
                    table.append(None)
                    objects.append(v)
                    pending.append(v)
                return {"$obj": i}
            pure = _builtin_name(v)
            if pure is not None:  # len, str.upper, math.sqrt: the candidate's own copy, no round trips
                return {"$bi": pure}
            if callable(v):
                i = self.cb_ids.get(id(v))
                if i is None or self.cbs[i] is not v:
                    i = self.cb_ids[id(v)] = len(self.cbs)
                    self.cbs.append(v)
                return {"$cb": i}
            return wire.NO

        def flush() -> None:
            while pending:
                v = pending.pop(0)
                attrs = {}
                for k, a in _attrs(v).items():
                    attrs[k] = wire.to_wire(a, 1, hook)
                table[index[id(v)]] = [type(v).__name__, attrs]

        hook.flush = flush  # type: ignore[attr-defined]
        return hook, table, objects

    # --- values the candidate sends ----------------------------------------------------------------
    def _decoder(self, answer: dict[str, Any], sent: list[Any]) -> Any:
        wire = self.wire
        classes = answer.get("classes") or {}
        if type(classes) is not dict:
            raise wire.WireError("bad class table")
        for key, info in classes.items():
            if type(info) is dict and type(info.get("m")) is list:
                self.classes[int(key)] = {
                    "name": str(info.get("name", "?"))[:200],
                    "m": frozenset(str(m) for m in info["m"]),
                    "eq": info.get("eq") is True,
                    "truth": info.get("truth") is not False,
                }
        table = answer.get("objs") or []
        if type(table) is not list:
            raise wire.WireError("bad object table")
        built: list[Any] = []
        for entry in table:
            if (
                type(entry) is not list
                or len(entry) != 2
                or type(entry[0]) is not str
                or type(entry[1]) is not dict
            ):
                raise wire.WireError("bad object table")
            cls = self.byval.get(entry[0])
            if cls is None:
                raise wire.WireError(f"no class {entry[0]!r} in the tests")
            built.append(object.__new__(cls))

        def hook(tag: str, body: Any, depth: int) -> Any:
            if tag == "$ref" and type(body) is list and len(body) == 3:
                rid, cid, kind = body
                if type(rid) is not int or type(cid) is not int or cid not in self.classes:
                    raise wire.WireError("bad reference")
                return self.proxy(rid, cid, str(kind))
            if tag == "$obj" and type(body) is int and 0 <= body < len(built):
                return built[body]
            if tag == "$arg" and type(body) is int and 0 <= body < len(sent):
                return sent[body]
            if tag == "$cb" and type(body) is int and 0 <= body < len(self.cbs):
                return self.cbs[body]
            if tag == "$mod" and type(body) is str:
                return self.modules(body)
            raise wire.WireError(f"unknown tag {tag!r}")

        for obj, entry in zip(built, table, strict=True):
            _fill(obj, entry[1], wire, hook)
        updates = answer.get("args") or {}
        if type(updates) is dict:
            for key, attrs in updates.items():
                i = int(key)
                if 0 <= i < len(sent) and type(attrs) is dict:
                    _fill(sent[i], attrs, wire, hook)
        states = answer.get("states") or {}
        if type(states) is not dict:
            raise wire.WireError("bad states")
        for key, attrs in states.items():
            if type(attrs) is dict:
                self.states[int(key)] = (
                    self.epoch,
                    {str(k): wire.from_wire(v, 1, hook) for k, v in attrs.items()},
                )
        return hook

    def proxy(self, rid: int, cid: int, kind: str) -> Remote:
        """A new proxy each time the object crosses: only the proxy the tests got by building the object
        themselves is theirs (``_owned``); the same object returned by a method is not (a ``Solution`` whose
        method returns ``self`` with ``__sub__`` rigged stays refused)."""
        cls = RemoteClass if kind == "c" else Remote
        p = cls.__new__(cls)
        object.__setattr__(p, "_rid", rid)
        object.__setattr__(p, "_cid", cid)
        object.__setattr__(p, "_link", self)
        object.__setattr__(p, "_owned", False)
        return p

    # --- one request -------------------------------------------------------------------------------
    def request(
        self, op: str, ref: int | None, name: str | None = None, args: Any = (), kwargs: Any = None
    ) -> Any:
        wire = self.wire
        memo: list[Any] = []
        while True:
            hook, table, objects = self._encoder()
            try:
                msg = {
                    "op": op,
                    "ref": ref,
                    "name": name,
                    "args": [wire.to_wire(a, 0, hook) for a in args],
                    "kwargs": wire.to_wire(dict(kwargs or {}), 0, hook),
                    "memo": [
                        {"value": wire.to_wire(m[1], 0, hook)} if m[0] == "v" else {"exc": m[1], "msg": m[2]}
                        for m in memo
                    ],
                }
                hook.flush()  # type: ignore[attr-defined]
                msg["objs"] = table
                text = wire.json.dumps(msg, allow_nan=False, separators=(",", ":"))
            except (wire.WireError, RecursionError) as exc:
                raise NotPlainData(f"an argument does not cross: {exc}") from None
            self.calls += 1
            self.send({"call": text, "case": self.case, "branch": bool(self.cbs)})
            reply = self.recv()
            if "crash" in reply:
                raise CandidateCrashed(str(reply["crash"]))
            if op != "state":
                self.epoch += 1  # the candidate's code ran: every state seen so far may be stale
            try:
                answer = wire.json.loads(reply["raw"])
                if type(answer) is not dict:
                    raise wire.WireError("not a report")
                if "exc" in answer:
                    failure = (str(answer["exc"]), str(answer.get("msg", "")))
                else:
                    failure = None
                    hook_in = self._decoder(answer, objects)
                    if "need" in answer:
                        need = answer["need"]
                        fn = hook_in("$cb", need["cb"], 0)
                        cargs = wire.from_wire(need["args"], 0, hook_in)
                        ckw = wire.from_wire(need["kwargs"], 0, hook_in)
                        if type(cargs) is not list or type(ckw) is not dict or len(memo) >= MAX_CALLBACKS:
                            raise wire.WireError("bad call back")
                    else:
                        value = wire.from_wire(answer["value"], 0, hook_in)
                        changed = answer.get("changed") or {}
                        if type(changed) is not dict:
                            raise wire.WireError("bad changed arguments")
                        for key, raw in changed.items():
                            _copy_back(list(args), int(key), wire.from_wire(raw, 0, hook_in))
                        return value
            except (wire.WireError, KeyError, ValueError, IndexError, TypeError, RecursionError) as exc:
                raise CandidateCrashed(f"malformed answer: {type(exc).__name__}: {exc}") from None
            if failure is not None:
                _raise_candidate(*failure)
            try:  # the tests' own function, called here with the candidate's arguments
                memo.append(("v", fn(*cargs, **{str(k): v for k, v in ckw.items()})))
            except Exception as exc:
                memo.append(("e", type(exc).__name__, str(exc)[:500]))

    def state(self, p: Remote) -> dict[str, Any]:
        rid = object.__getattribute__(p, "_rid")
        got = self.states.get(rid)
        if got is None or got[0] != self.epoch:
            self.request("state", None, None, [rid])
            got = self.states.get(rid)
            if got is None or got[0] != self.epoch:
                raise CandidateCrashed("the candidate did not report an object's state")
        return got[1]

    def equal(self, a: Remote, b: Any) -> Any:
        same = isinstance(b, Remote) and object.__getattribute__(a, "_rid") == object.__getattribute__(
            b, "_rid"
        )
        if a is b or same:
            return True
        if not isinstance(b, Remote):
            st = self.state(a)
            return st["$base"] == b if "$base" in st else NotImplemented
        ca, cb = object.__getattribute__(a, "_cid"), object.__getattribute__(b, "_cid")
        info = self.classes.get(ca)
        if ca != cb or info is None:
            return False
        if info["eq"]:  # a value class (a dataclass, or its own __eq__): equal when every attribute is
            return self.state(a) == self.state(b)
        return False

    def hash_of(self, p: Remote) -> int:
        cid = object.__getattribute__(p, "_cid")
        info = self.classes.get(cid)
        if info is not None and info["eq"]:
            st = self.state(p)
            return hash(st["$base"]) if "$base" in st else hash(("tg", cid))
        return hash(("tg", object.__getattribute__(p, "_rid")))


PURE_MODULES = ("builtins", "math", "operator")


def _builtin_name(v: Any) -> str | None:
    """``builtins.len``, ``builtins.str.upper``, ``math.sqrt``: a C function of a module whose functions hold
    no state of the tests, named so the candidate can call its own copy of it."""
    import sys

    try:
        if isinstance(v, type):
            owner, name = v.__module__, v.__qualname__
        elif type(v).__name__ == "builtin_function_or_method" and isinstance(
            getattr(v, "__self__", None), type(sys)
        ):
            owner, name = v.__self__.__name__, v.__name__
        elif type(v).__name__ in ("method_descriptor", "classmethod_descriptor", "wrapper_descriptor"):
            owner, name = v.__objclass__.__module__, f"{v.__objclass__.__qualname__}.{v.__name__}"
        else:
            return None
        owner = "operator" if owner == "_operator" else owner
        if owner not in PURE_MODULES:
            return None
        found: Any = sys.modules[owner]
        for part in name.split("."):
            found = getattr(found, part)
        return f"{owner}.{name}" if found is v else None
    except Exception:
        return None


def _attrs(obj: Any) -> dict[str, Any]:
    out = {k: v for k, v in getattr(obj, "__dict__", {}).items() if type(k) is str and not k.startswith("__")}
    for klass in type(obj).__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if not name.startswith("__") and name not in out and hasattr(obj, name):
                out[name] = getattr(obj, name)
    return out


def _fill(obj: Any, attrs: dict[str, Any], wire: Any, hook: Any) -> None:
    """Sets the attributes of one of the tests' objects from the candidate's plain data; never one that
    would shadow something of the class (a method the tests call, a property)."""
    cls = type(obj)
    for k, raw in attrs.items():
        if type(k) is not str or not k.isidentifier() or k.startswith("__"):
            continue
        there = getattr(cls, k, _attrs)
        if (
            there is _attrs
            or type(there).__name__ == "member_descriptor"
            or not (callable(there) or hasattr(type(there), "__get__"))
        ):
            with contextlib.suppress(AttributeError):
                object.__setattr__(obj, k, wire.from_wire(raw, 1, hook))


def _copy_back(args: list[Any], i: int, new: Any) -> None:
    arg = args[i]
    if type(arg) is not type(new):
        return
    if type(arg) in (list, bytearray):
        arg[:] = new
    elif type(arg) in (dict, set):
        arg.clear()
        arg.update(new)
