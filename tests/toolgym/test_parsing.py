import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolgym.messages import Message
from toolgym.parsing import parse_action
from toolgym.tools import ToolSpec


def calculator(expression: str) -> str:
    """Evaluate.

    Args:
        expression: arithmetic.
    """
    return expression


def python(code: str) -> str:
    """Run Python.

    Args:
        code: the program.
    """
    return code


TOOLS = [ToolSpec.from_function(calculator), ToolSpec.from_function(python)]


def call(name, args):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "bad_json"),
        ("<tool_call>[1, 2]</tool_call>", "bad_json"),
        ('<tool_call>{"name": "calculator", "arguments": "[1]"}</tool_call>', "bad_json"),
        ("<tool_call>{}", "bad_json"),
        (call("search", {"query": "x"}), "unknown_tool"),
        (call("calculator", {"expression": 3}), "bad_arguments"),
        (call("calculator", {}), "bad_arguments"),
        (call("calculator", {"expression": "1", "extra": 2}), "bad_arguments"),
        ("I think it is 4", "no_action"),
        ("<think><answer>3</answer></think>", "no_action"),
        ("<answer>1</answer> and <answer>2</answer>", "two_answers"),
        (call("calculator", {"expression": "1"}) + "<answer>1</answer>", "mixed"),
    ],
)
def test_hermes_errors(text, kind):
    result = parse_action(text, TOOLS)
    assert not result.ok
    assert result.error_kind == kind
    assert result.error


def test_hermes_several_calls_and_arguments_as_string():
    text = (
        "Let me compute. "
        + call("calculator", {"expression": "1+1"})
        + '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    result = parse_action(text, TOOLS)
    assert result.ok
    assert [c.name for c in result.tool_calls] == ["calculator", "python"]
    assert result.tool_calls[1].arguments == {"code": "print(1)"}
    assert [c.id for c in result.tool_calls] == ["call_0", "call_1"]


def test_answer_tag_and_answer_tool():
    assert parse_action("<think>maybe 5</think><answer> 6 </answer>", TOOLS).answer == "6"
    assert parse_action(call("answer", {"answer": "7"}), TOOLS).answer == "7"


def test_tags_format():
    result = parse_action("<python>print(2)</python>", TOOLS, "tags")
    assert result.tool_calls[0].name == "python"
    assert result.tool_calls[0].arguments == {"code": "print(2)"}
    result = parse_action("Here:\n```python\nx = 1\n```\n<calculator>2*3</calculator>", TOOLS, "tags")
    assert [c.name for c in result.tool_calls] == ["python", "calculator"]
    assert parse_action("<answer>9</answer>", TOOLS, "tags").answer == "9"
    assert parse_action("<search>q</search>", TOOLS, "tags").error_kind == "unknown_tool"


def test_command_format():
    assert parse_action("  take apple from table ", None, "command").command == "take apple from table"
    assert parse_action("<think>hmm</think>", None, "command").error_kind == "no_action"


def test_structured_message_skips_parsing():
    msg = Message(
        role="assistant",
        content="<tool_call>ignored</tool_call>",
        tool_calls=[{"id": "abc", "function": {"name": "calculator", "arguments": '{"expression": "2"}'}}],
    )
    result = parse_action(msg, TOOLS)
    assert result.ok
    assert result.tool_calls[0].id == "abc"
    assert result.assistant_message() == msg
    assert parse_action({"role": "user", "content": "x"}, TOOLS).error_kind == "bad_message"
    assert parse_action({"role": "assistant", "tool_calls": [{"bad": 1}]}, TOOLS).error_kind == "bad_message"


def test_non_text_actions():
    for action in (None, 3, b"bytes", ["a"]):
        assert parse_action(action, TOOLS).error_kind == "bad_message"  # type: ignore[arg-type]
    assert parse_action("x" * 300_000, TOOLS).error_kind == "too_long"


FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<answer>",
        "</answer>",
        "<think>",
        "</think>",
        "<python>",
        "</python>",
        "```python\n",
        "```",
        '{"name": "calculator", "arguments": {"expression": "1"}}',
        '{"name":',
        "{",
        "}",
        "[",
        '"',
        "\\",
        "null",
        "\x00",
        "\ud7ff",
        "9" * 50,
        "[" * 200,
    ]
)
TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=20)), max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=TEXT, fmt=st.sampled_from(["hermes", "tags", "command"]))
def test_fuzz_text_never_raises(text, fmt):
    result = parse_action(text, TOOLS, fmt)
    assert result.ok == (result.error is None)
    if result.ok:
        assert (result.answer is not None) + bool(result.tool_calls) + (result.command is not None) == 1


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(payload=JSONISH)
def test_fuzz_json_payloads_never_raise(payload):
    text = "<tool_call>" + json.dumps(payload) + "</tool_call>"
    result = parse_action(text, TOOLS)
    assert result.ok or result.error_kind in {"bad_json", "unknown_tool", "bad_arguments"}


@settings(max_examples=200, deadline=None)
@given(
    message=st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "name"]), JSONISH, max_size=4)
)
def test_fuzz_messages_never_raise(message):
    parse_action(message, TOOLS)
