"""The candidate's objects in the test process: :class:`Remote` proxies (and :class:`RemoteClass`,
:class:`Method`), loaded there as module ``_tg_remote`` before :mod:`toolgym.rewards.code_proxy`, whose
``Link`` makes them and answers what they ask. Standard library only, nothing runs at import.

Attribute reads, method calls and calls go to the candidate. ``==``, ``!=`` and ``hash`` are the link's,
computed from plain state. Operators, ``len``, ``bool``, iteration, indexing, ``int``/``float`` and ``str``
reach the candidate only for a proxy the tests own (they built the object from a candidate class they named,
or got it from an operator on one); on any other they raise :class:`NotPlainData`.
"""

from __future__ import annotations

from typing import Any


class CandidateCrashed(BaseException):
    """The candidate gave no valid answer (it died, timed out, exited, or sent garbage). A BaseException,
    so a test's ``except Exception`` cannot turn it into a pass."""


class NotPlainData(BaseException):
    """A value that cannot cross between the processes, or an operation the tests may not apply to it."""


class CandidateError(Exception):
    """An exception the candidate's code raised whose type is not a built-in exception."""


_BINARY = (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "matmul",
    "lshift",
    "rshift",
    "and",
    "or",
    "xor",
)


def _rid(p: Remote) -> int:
    return int(object.__getattribute__(p, "_rid"))


def _op(p: Remote, name: str, *args: Any) -> Any:
    if not object.__getattribute__(p, "_owned"):
        link = object.__getattribute__(p, "_link")
        cls = link.classes.get(object.__getattribute__(p, "_cid"), {}).get("name", "?")
        raise NotPlainData(
            f"{name}() on a {cls} object the tests did not build: the candidate's objects are not plain data"
        )
    link = object.__getattribute__(p, "_link")
    out = link.request("op", object.__getattribute__(p, "_rid"), name, args)
    if isinstance(out, Remote) and object.__getattribute__(out, "_cid") in link.named:
        object.__setattr__(out, "_owned", True)  # v1 + v2 on the tests' own vectors is theirs too
    return out


class Remote:
    """One of the candidate's objects (or functions): attribute access and calls go to the candidate;
    equality and hashing are decided here from plain state (see the module docstring)."""

    __slots__ = ("__weakref__", "_cid", "_link", "_owned", "_rid")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        link = object.__getattribute__(self, "_link")
        rid, cid = object.__getattribute__(self, "_rid"), object.__getattribute__(self, "_cid")
        if name in link.classes.get(cid, {}).get("m", ()):
            return Method(self, name)
        got = link.states.get(rid)
        if got is not None and got[0] == link.epoch and name in got[1]:
            return got[1][name]
        return link.request("get", rid, name)

    def __setattr__(self, name: str, value: Any) -> None:
        link = object.__getattribute__(self, "_link")
        link.request("set", object.__getattribute__(self, "_rid"), name, [value])

    def __delattr__(self, name: str) -> None:
        link = object.__getattribute__(self, "_link")
        link.request("del", object.__getattribute__(self, "_rid"), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        link = object.__getattribute__(self, "_link")
        return link.request("call", object.__getattribute__(self, "_rid"), None, args, kwargs)

    def __repr__(self) -> str:
        link = object.__getattribute__(self, "_link")
        cls = link.classes.get(object.__getattribute__(self, "_cid"), {}).get("name", "?")
        return f"<candidate {cls} object #{object.__getattribute__(self, '_rid')}>"

    def __eq__(self, other: object) -> Any:
        return object.__getattribute__(self, "_link").equal(self, other)

    def __ne__(self, other: object) -> Any:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return int(object.__getattribute__(self, "_link").hash_of(self))

    def __bool__(self) -> bool:
        link = object.__getattribute__(self, "_link")
        if not link.classes.get(object.__getattribute__(self, "_cid"), {}).get("truth", True):
            return True
        out = _op(self, "bool")
        if type(out) is not bool:
            raise TypeError("__bool__ should return bool")
        return out

    def __len__(self) -> int:
        out = _op(self, "len")
        if type(out) is not int or out < 0:
            raise TypeError("__len__ should return an int >= 0")
        return out

    def __iter__(self) -> Any:
        out = _op(self, "iter")
        return iter(out if type(out) is list else [])

    def __contains__(self, item: Any) -> bool:
        out = _op(self, "contains", item)
        if type(out) is not bool:
            raise TypeError("__contains__ should answer a bool")
        return out

    def __str__(self) -> str:
        if not object.__getattribute__(self, "_owned"):
            return repr(self)
        out = _op(self, "str")
        if type(out) is not str:
            raise TypeError("__str__ should return str")
        return out

    def __getitem__(self, key: Any) -> Any:
        return _op(self, "getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        _op(self, "setitem", key, value)

    def __delitem__(self, key: Any) -> None:
        _op(self, "delitem", key)

    def __lt__(self, other: Any) -> Any:
        return _op(self, "lt", other)

    def __le__(self, other: Any) -> Any:
        return _op(self, "le", other)

    def __gt__(self, other: Any) -> Any:
        return _op(self, "gt", other)

    def __ge__(self, other: Any) -> Any:
        return _op(self, "ge", other)

    def __neg__(self) -> Any:
        return _op(self, "neg")

    def __pos__(self) -> Any:
        return _op(self, "pos")

    def __abs__(self) -> Any:
        return _op(self, "abs")

    def __int__(self) -> int:
        out = _op(self, "int")
        if type(out) is not int:
            raise TypeError("__int__ should return an int")
        return out

    def __float__(self) -> float:
        out = _op(self, "float")
        if type(out) is not float:
            raise TypeError("__float__ should return a float")
        return out

    def __index__(self) -> int:
        out = _op(self, "index")
        if type(out) is not int:
            raise TypeError("__index__ should return an int")
        return out


def _binary(name: str) -> tuple[Any, Any]:
    def forward(self: Remote, other: Any) -> Any:
        return _op(self, name, other)

    def reflected(self: Remote, other: Any) -> Any:
        return _op(self, "r" + name, other)

    return forward, reflected


for _name in _BINARY:
    _f, _r = _binary(_name)
    setattr(Remote, f"__{_name}__", _f)
    setattr(Remote, f"__r{_name}__", _r)


class Method:
    """``obj.name`` for a method of the candidate's class: calling it is one request."""

    __slots__ = ("name", "obj")

    def __init__(self, obj: Remote, name: str) -> None:
        self.obj, self.name = obj, name

    def __repr__(self) -> str:
        return f"<candidate method {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        link = object.__getattribute__(self.obj, "_link")
        return link.request("call", object.__getattribute__(self.obj, "_rid"), self.name, args, kwargs)


class RemoteClass(Remote):
    """One of the candidate's classes; instances the tests build from it (when they named it) are theirs:
    operators and ``len``/``iter``/... on them reach the candidate."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        link = object.__getattribute__(self, "_link")
        rid = object.__getattribute__(self, "_rid")
        out = link.request("call", rid, None, args, kwargs)
        if isinstance(out, Remote) and rid in link.named and object.__getattribute__(out, "_cid") == rid:
            object.__setattr__(out, "_owned", True)
        return out

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, Remote) and object.__getattribute__(obj, "_cid") == object.__getattribute__(
            self, "_rid"
        )

    def __repr__(self) -> str:
        link = object.__getattribute__(self, "_link")
        return f"<candidate class {link.classes.get(object.__getattribute__(self, '_rid'), {}).get('name', '?')}>"
