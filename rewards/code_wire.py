"""Plain data on the wire between the candidate's process and the test process (tagged JSON).

Every value that crosses is rebuilt on the receiving side from exact built-in types, so no object of the
candidate's ever reaches a comparison: a rigged ``__eq__``, an ``int`` subclass or a ``__sub__`` that returns
0 cannot survive the trip. What crosses, and what it becomes:

- ``None``, ``bool``, ``int``, ``float`` (``nan``/``inf`` too), ``str``, ``bytes``, ``bytearray``, ``complex``;
- ``list``, ``tuple`` (namedtuples become tuples), ``dict``, ``set``, ``frozenset``, ``range``;
- by value: ``Decimal``, ``Fraction``; ``OrderedDict``, ``Counter``, ``deque`` keep their type (their
  comparisons differ from a plain dict's or list's), ``defaultdict`` becomes a dict;
- numpy scalars become Python numbers; numpy arrays of numbers, bools or text cross as dtype, shape and raw
  bytes and are rebuilt by the receiver's own numpy (other arrays become lists);
- namedtuples are rebuilt as namedtuples of the same name and fields (the receiver's own class: tuple
  equality, field access);
- an iterator or generator is drained (at most ``MAX_ITEMS`` items) and arrives as an iterator over them, so
  ``list(f(x))`` works and ``f(x) == [...]`` stays False, as it would have been.

Anything else (a class instance, a function) goes to the caller's ``hook`` (the graders turn objects into
references and proxies, :mod:`toolgym.rewards.code_object_server` and
:mod:`toolgym.rewards.code_runner`); without
one it does not cross. Subclasses of the types above are read through the base type's own methods, never
their overrides. The encoder runs in the candidate's process and is not trusted; only the decoder matters,
and it builds exact types only (a tag it does not know goes to its own ``hook``, or fails).

Standard library only and self-contained: its source is sent into the sandbox and into the test process.
"""

from __future__ import annotations

import base64
import collections
import decimal
import fractions
import json
import math
from typing import Any

MAX_DEPTH = 100  # nesting levels a value may have
MAX_ITEMS = 100_000  # items drained from an iterator
_HUGE_DIGITS = 4000  # ints with more digits travel as hex (json's decimal conversion is capped at 4300)
_ND_KINDS = frozenset("biufcSU")  # numpy dtype kinds that cross as raw bytes: never objects, records or voids
_NAMEDTUPLES: dict[tuple[str, tuple[str, ...]], Any] = {}
NO = object()  # a hook's answer: "not mine", the value is handled (or refused) as if there were no hook


class WireError(ValueError):
    """A value that cannot cross (on encoding) or a message that is not well-formed data (on decoding)."""


def _encode_float(x: float) -> Any:
    if math.isfinite(x):
        return x
    return {"$float": "nan" if x != x else ("inf" if x > 0 else "-inf")}


def _encode_int(x: int) -> Any:
    if -(10**_HUGE_DIGITS) < x < 10**_HUGE_DIGITS:
        return x
    return {"$int": hex(x)}


def to_wire(value: Any, depth: int = 0, hook: Any = None) -> Any:
    """A JSON-ready form of ``value`` (JSON objects are always tags); WireError when it is not plain data.
    ``hook(value, depth)``, when given, encodes what is not plain data (or answers ``NO``)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deep")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return _encode_int(value)
    if t is float:
        return _encode_float(value)
    if t is list:
        return [to_wire(v, depth + 1, hook) for v in value]
    if t is tuple:
        return {"$tuple": [to_wire(v, depth + 1, hook) for v in value]}
    if t is dict:
        return {
            "$dict": [[to_wire(k, depth + 1, hook), to_wire(v, depth + 1, hook)] for k, v in value.items()]
        }
    if t is set or t is frozenset:
        return {"$" + t.__name__: [to_wire(v, depth + 1, hook) for v in value]}
    if t is bytes or t is bytearray:
        return {"$" + t.__name__: base64.b64encode(value).decode("ascii")}
    if t is complex:
        return {"$complex": [_encode_float(value.real), _encode_float(value.imag)]}
    if t is range:
        return {"$range": [value.start, value.stop, value.step]}
    if t is decimal.Decimal:
        return {"$decimal": str(value)}
    if t is fractions.Fraction:
        return {"$fraction": [_encode_int(value.numerator), _encode_int(value.denominator)]}
    if t is collections.OrderedDict or t is collections.Counter:
        tag = "$odict" if t is collections.OrderedDict else "$counter"
        return {
            tag: [[to_wire(k, depth + 1, hook), to_wire(v, depth + 1, hook)] for k, v in dict.items(value)]
        }
    if t is collections.deque:
        return {"$deque": [to_wire(v, depth + 1, hook) for v in value]}
    return _encode_other(value, depth, hook)


def _encode_other(value: Any, depth: int, hook: Any) -> Any:
    """Subclasses (read through the base type), numpy values, namedtuples, iterators; the hook first."""
    if hook is not None:
        out = hook(value, depth)
        if out is not NO:
            return out
    if isinstance(value, bool):
        return bool.__bool__(value)
    if isinstance(value, int):
        return _encode_int(int.__index__(value))
    if isinstance(value, float):
        return _encode_float(float.__float__(value))
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, tuple):
        members = [to_wire(v, depth + 1, hook) for v in tuple.__iter__(value)]
        fields = getattr(type(value), "_fields", None)
        if type(fields) is tuple and len(fields) == len(members) and all(type(f) is str for f in fields):
            return {"$nt": [str(type(value).__name__), list(fields), members]}
        return {"$tuple": members}
    if isinstance(value, list):
        return [to_wire(v, depth + 1, hook) for v in list.__iter__(value)]
    if isinstance(value, (collections.OrderedDict, collections.Counter)):
        base = collections.OrderedDict if isinstance(value, collections.OrderedDict) else collections.Counter
        return to_wire(base(dict.items(value)), depth, hook)
    if isinstance(value, dict):  # defaultdict and other mappings built on dict
        return to_wire(dict(dict.items(value)), depth, hook)
    if isinstance(value, (set, frozenset)):
        base_set = frozenset if isinstance(value, frozenset) else set
        return to_wire(
            base_set(set.__iter__(value) if isinstance(value, set) else frozenset.__iter__(value)),
            depth,
            hook,
        )
    module = type(value).__module__
    if module == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        dtype: Any = getattr(value, "dtype", None)
        if type(value).__name__ == "ndarray" and getattr(dtype, "kind", "") in _ND_KINDS:
            data = value.tobytes()  # C order
            return {"$nd": [str(dtype.str), [int(n) for n in value.shape], base64.b64encode(data).decode()]}
        return to_wire(value.tolist(), depth, hook)
    if hasattr(type(value), "__next__") and hasattr(type(value), "__iter__"):  # generators, map, zip, ...
        items: list[Any] = []
        for item in value:
            if len(items) >= MAX_ITEMS:
                raise WireError(f"iterator longer than {MAX_ITEMS} items")
            items.append(to_wire(item, depth + 1, hook))
        return {"$iter": items}
    raise WireError(f"a {type(value).__name__} is not plain data")


def dumps(value: Any, hook: Any = None) -> str:
    return json.dumps(to_wire(value, 0, hook), allow_nan=False, separators=(",", ":"))


def _int(raw: Any) -> int:
    if type(raw) is int:
        return raw
    if type(raw) is dict and set(raw) == {"$int"} and type(raw["$int"]) is str:
        return int(raw["$int"], 16)
    raise WireError("not an integer")


def _float(raw: Any) -> float:
    if type(raw) is float or type(raw) is int:
        return float(raw)
    if type(raw) is dict and raw.get("$float") in ("nan", "inf", "-inf"):
        return float(raw["$float"])
    raise WireError("not a float")


def _pairs(raw: Any, depth: int, hook: Any = None) -> list[tuple[Any, Any]]:
    if type(raw) is not list:
        raise WireError("a mapping must be a list of pairs")
    out = []
    for pair in raw:
        if type(pair) is not list or len(pair) != 2:
            raise WireError("a mapping must be a list of pairs")
        out.append((from_wire(pair[0], depth + 1, hook), from_wire(pair[1], depth + 1, hook)))
    return out


def _items(raw: Any, depth: int, hook: Any = None) -> list[Any]:
    if type(raw) is not list:
        raise WireError("a sequence must be a list")
    return [from_wire(v, depth + 1, hook) for v in raw]


def from_wire(raw: Any, depth: int = 0, hook: Any = None) -> Any:
    """Rebuilds a value from its JSON form using exact built-in types only; WireError on anything else.
    ``hook(tag, body, depth)``, when given, rebuilds tags this module does not know."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deep")
    t = type(raw)
    if raw is None or t is bool or t is str or t is int:
        return raw
    if t is float:
        return raw
    if t is list:
        return [from_wire(v, depth + 1, hook) for v in raw]
    if t is not dict or len(raw) != 1:
        raise WireError("unknown value")
    ((tag, body),) = raw.items()
    try:
        if tag == "$tuple":
            return tuple(_items(body, depth, hook))
        if tag == "$dict":
            return dict(_pairs(body, depth, hook))
        if tag == "$set":
            return set(_items(body, depth, hook))
        if tag == "$frozenset":
            return frozenset(_items(body, depth, hook))
        if tag in ("$bytes", "$bytearray"):
            if type(body) is not str:
                raise WireError("bytes must be base64 text")
            data = base64.b64decode(body.encode("ascii"), validate=True)
            return data if tag == "$bytes" else bytearray(data)
        if tag in ("$int", "$float"):
            return _int(raw) if tag == "$int" else _float(raw)
        if tag == "$complex" and type(body) is list and len(body) == 2:
            return complex(_float(body[0]), _float(body[1]))
        if tag == "$range" and type(body) is list and len(body) == 3:
            return range(_int(body[0]), _int(body[1]), _int(body[2]))
        if tag == "$decimal" and type(body) is str and len(body) < 10_000:
            return decimal.Decimal(body)
        if tag == "$fraction" and type(body) is list and len(body) == 2:
            return fractions.Fraction(_int(body[0]), _int(body[1]))
        if tag == "$odict":
            return collections.OrderedDict(_pairs(body, depth, hook))
        if tag == "$counter":
            return collections.Counter(dict(_pairs(body, depth, hook)))
        if tag == "$deque":
            return collections.deque(_items(body, depth, hook))
        if tag == "$iter":
            return iter(_items(body, depth, hook))
        if tag == "$nd" and type(body) is list and len(body) == 3:
            return _ndarray(*body)
        if tag == "$nt" and type(body) is list and len(body) == 3:
            return _namedtuple(body[0], body[1], _items(body[2], depth, hook))
        if hook is not None and type(tag) is str:
            return hook(tag, body, depth)
    except WireError:
        raise
    except (TypeError, ValueError, ArithmeticError, RecursionError) as exc:  # unhashable keys, bad numbers
        raise WireError(f"malformed {tag}: {type(exc).__name__}") from None
    raise WireError(f"unknown tag {tag!r}")


def loads(text: str, hook: Any = None) -> Any:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {type(exc).__name__}") from None
    return from_wire(raw, 0, hook)


def _ndarray(dtype: Any, shape: Any, data: Any) -> Any:
    import numpy as np  # the receiver's own numpy

    if type(dtype) is not str or type(data) is not str or type(shape) is not list or len(dtype) > 20:
        raise WireError("malformed array")
    if len(shape) > 32 or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError("malformed array shape")
    kind = np.dtype(dtype)
    if kind.kind not in _ND_KINDS or kind.hasobject or kind.fields is not None or kind.subdtype is not None:
        raise WireError("an array of that dtype does not cross")
    raw = base64.b64decode(data.encode("ascii"), validate=True)
    count = math.prod(shape)
    if count * kind.itemsize != len(raw):
        raise WireError("array data does not match its shape")
    return np.frombuffer(raw, dtype=kind, count=count).reshape(shape).copy()


def _namedtuple(name: Any, fields: Any, items: list[Any]) -> Any:
    if type(name) is not str or type(fields) is not list or not all(type(f) is str for f in fields):
        raise WireError("malformed namedtuple")
    if len(fields) != len(items) or len(fields) > 256:
        raise WireError("malformed namedtuple")
    key = (name, tuple(fields))
    cls = _NAMEDTUPLES.get(key)
    if cls is None:  # validates the names (identifiers, no keywords, no leading underscore)
        cls = _NAMEDTUPLES[key] = collections.namedtuple(name, fields)  # type: ignore[misc]
    return cls(*items)
