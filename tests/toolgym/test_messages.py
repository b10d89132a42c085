import json

import pytest
from pydantic import ValidationError

from toolgym.messages import Message, ToolCall
from toolgym.tools import Tool, ToolSpec


def test_message_round_trip_openai_format():
    raw = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "calc", "arguments": '{"expression": "1+2"}'},
            }
        ],
    }
    msg = Message.from_dict(raw)
    assert msg.tool_calls == (ToolCall(id="call_7", name="calc", arguments={"expression": "1+2"}),)
    out = msg.to_dict()
    assert json.loads(out["tool_calls"][0]["function"]["arguments"]) == {"expression": "1+2"}
    assert Message.from_dict(out) == msg
    assert json.loads(json.dumps(out)) == out


def test_tool_message_keeps_ids():
    msg = Message(role="tool", content="3", tool_call_id="call_7", name="calc")
    assert msg.to_dict() == {"role": "tool", "content": "3", "tool_call_id": "call_7", "name": "calc"}


def test_content_parts_text():
    msg = Message(
        role="user", content=[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]
    )
    assert msg.text == "a"


def test_bad_role_is_rejected():
    with pytest.raises(ValidationError):
        Message.from_dict({"role": "robot", "content": "x"})


def test_tool_call_arguments_must_be_object():
    with pytest.raises(ValueError):
        ToolCall.from_dict({"function": {"name": "f", "arguments": "[1, 2]"}})


def greet(name: str, times: int = 1, loud: bool | None = None, tags: list[str] | None = None) -> str:
    """Greet someone.

    Args:
        name: who to greet.
        times: how many times,
            at least one.
        loud: shout or not.
        tags: labels.

    Returns:
        the greeting.
    """
    return " ".join([f"hi {name}"] * times)


def test_tool_spec_from_function():
    spec = ToolSpec.from_function(greet)
    fn = spec.to_dict()["function"]
    assert fn["name"] == "greet"
    assert fn["description"] == "Greet someone."
    props = fn["parameters"]["properties"]
    assert props["name"] == {"type": "string", "description": "who to greet."}
    assert props["times"] == {"type": "integer", "description": "how many times, at least one."}
    assert props["loud"]["type"] == "boolean"
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "labels."}
    assert fn["parameters"]["required"] == ["name"]
    assert ToolSpec.from_dict(spec.to_dict()) == spec


def test_check_arguments():
    spec = ToolSpec.from_function(greet)
    assert spec.check_arguments({"name": "a", "times": 2}) == []
    assert spec.check_arguments({}) == ["missing required argument 'name'"]
    assert spec.check_arguments({"name": "a", "times": True}) == [
        "argument 'times' must be integer, got boolean"
    ]
    assert "unknown argument 'x'" in spec.check_arguments({"name": "a", "x": 1})[0]


def test_tool_calls_function():
    tool = Tool(greet)
    assert tool(name="b", times=2) == "hi b hi b"
