"""Chat messages and tool calls in the OpenAI chat format.

Pydantic validates inside toolgym; whatever crosses the API (observations, transcripts, JSONL) is a plain
JSON-ready dict (`Message.to_dict()`), so it can go straight into `tokenizer.apply_chat_template` or an
OpenAI client.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(BaseModel):
    """One call of a named tool with JSON arguments.

    >>> ToolCall(id="call_0", name="calculator", arguments={"expression": "1+1"}).to_dict()["function"]
    {'name': 'calculator', 'arguments': '{"expression": "1+1"}'}
    """

    model_config = ConfigDict(frozen=True)

    id: str = "call_0"
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI wire form: arguments are a JSON string."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        """Accepts the OpenAI form (`function.arguments` a JSON string or dict) or a flat `{name, arguments}`."""
        fn = data.get("function", data)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError(f"tool call arguments must be a JSON object, got {type(args).__name__}")
        return cls(id=str(data.get("id") or "call_0"), name=str(fn["name"]), arguments=args)


class Message(BaseModel):
    """One chat message.

    >>> m = Message(role="user", content="hi")
    >>> Message.from_dict(m.to_dict()) == m
    True
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str | list[dict[str, Any]] | None = ""
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _calls(cls, value: Any) -> Any:
        if value is None:
            return None
        return tuple(v if isinstance(v, ToolCall) else ToolCall.from_dict(v) for v in value)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; keys that are unset are left out."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | Message) -> Message:
        if isinstance(data, Message):
            return data
        return cls.model_validate(data)

    @property
    def text(self) -> str:
        """The content as text (parts of type text joined; images dropped)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


def as_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]
