"""Tool specifications (the OpenAI function schema), declared once from a typed Python function.

>>> def add(a: int, b: int = 0) -> str:
...     '''Add two integers.
...
...     Args:
...         a: the first term.
...         b: the second term.
...     '''
...     return str(a + b)
>>> spec = ToolSpec.from_function(add)
>>> spec.parameters["required"], spec.parameters["properties"]["a"]
(['a'], {'type': 'integer', 'description': 'the first term.'})
>>> spec.check_arguments({"a": "x"})
["argument 'a' must be integer, got string"]
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}
_PY_CHECK: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _schema_for(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES.get(type(values[0]), "string"), "enum": values}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _schema_for(args[0])
        return {"anyOf": [_schema_for(a) for a in args]}
    if origin in (list, tuple):
        (item,) = typing.get_args(annotation)[:1] or (str,)
        return {"type": "array", "items": _schema_for(item)}
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {"type": "string"}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Summary (text before `Args:`) and per-argument descriptions from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    parts = re.split(r"^\s*(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1, flags=re.M)
    summary = " ".join(parts[0].split())
    params: dict[str, str] = {}
    if len(parts) == 2:
        current = None
        for line in parts[1].splitlines():
            if re.match(r"^\s*(Returns|Raises|Yields|Examples?):", line):
                break
            m = re.match(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if m:
                current = m.group(1)
                params[current] = m.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return summary, params


class ToolSpec(BaseModel):
    """An OpenAI function-tool schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}, "required": []}
    )

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None) -> ToolSpec:
        """Build the schema from a function's type hints and Google-style docstring."""
        summary, docs = _parse_docstring(fn.__doc__ or "")
        hints = typing.get_type_hints(fn)
        props: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            schema = _schema_for(hints.get(pname, str))
            if pname in docs:
                schema["description"] = docs[pname]
            props[pname] = schema
            if param.default is inspect.Parameter.empty:
                required.append(pname)
        return cls(
            name=name or fn.__name__,
            description=summary,
            parameters={"type": "object", "properties": props, "required": required},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolSpec:
        fn = data.get("function", data)
        return cls(
            name=fn["name"], description=fn.get("description", ""), parameters=fn.get("parameters", {})
        )

    def check_arguments(self, arguments: dict[str, Any]) -> list[str]:
        """Problems with `arguments` against this schema (empty when they fit)."""
        props: dict[str, Any] = self.parameters.get("properties", {})
        errors = [
            f"missing required argument '{r}'"
            for r in self.parameters.get("required", [])
            if r not in arguments
        ]
        for key, value in arguments.items():
            if key not in props:
                errors.append(f"unknown argument '{key}' (expected one of {sorted(props)})")
                continue
            expected = props[key].get("type")
            allowed = _PY_CHECK.get(expected or "")
            ok = allowed is None or (
                isinstance(value, allowed) and not (expected != "boolean" and isinstance(value, bool))
            )
            if not ok:
                errors.append(
                    f"argument '{key}' must be {expected}, got {_JSON_TYPES.get(type(value), type(value).__name__)}"
                )
            elif "enum" in props[key] and value not in props[key]["enum"]:
                errors.append(f"argument '{key}' must be one of {props[key]['enum']}")
        return errors


class Tool:
    """A callable tool: its spec and the Python function that runs it (returns the observation text)."""

    def __init__(self, fn: Callable[..., str], name: str | None = None) -> None:
        self.fn = fn
        self.spec = ToolSpec.from_function(fn, name=name)

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, **arguments: Any) -> str:
        return self.fn(**arguments)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"
