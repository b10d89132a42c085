"""Turn raw model text (or a structured assistant message) into an action.

Formats:
- ``hermes`` (default): Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per
  turn allowed; the final answer is ``<answer>…</answer>`` or a call of the ``answer`` tool.
- ``tags``: Search-R1 / SimpleTIR style. ``<NAME>content</NAME>`` calls the tool NAME with ``content`` as its
  first argument (``<python>``, ``<search>``, …); a fenced ```python block calls ``python``; ``<answer>``.
- ``command``: plain text commands (household games): the whole reply, stripped, is one command.

Reasoning (``<think>…</think>``, a HiPER ``<subgoal>…</subgoal>`` plan) is ignored, by the one rule of
``toolgym.reasoning`` that rewards use too. Nothing here
raises on bad text: problems come back as a ``ParseResult`` with ``error`` set, which the env turns into an
observation and a format penalty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolgym.messages import Message, ToolCall
from toolgym.reasoning import strip_reasoning
from toolgym.tools import ToolSpec

ActionFormat = Literal["hermes", "tags", "command"]
ErrorKind = Literal[
    "bad_json",
    "unknown_tool",
    "bad_arguments",
    "no_action",
    "two_answers",
    "mixed",
    "bad_message",
    "too_long",
]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.S)
ANSWER_TOOL = "answer"
MAX_ACTION_CHARS = 200_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD. A JSON escape such as ``\\ud800`` in a tool call
    decodes to one, and no UTF-8 encoder takes it: an echo of it in an observation made the trainer's
    tokenizer raise (a crash of the run), and an MCP server's stdio writer die (an env_error).

    >>> clean_text("a\\ud800b") == "a\\ufffdb"
    True
    """
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def clean_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every string cleaned by ``clean_text``: model JSON read in, and what
    leaves the process for another program's UTF-8 serializer (servers, remote envs, judges)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_json(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value


@dataclass(frozen=True)
class ParseResult:
    """What one model turn asked for.

    Exactly one of these holds: ``error`` is set; or ``answer`` is set (the final answer); or ``tool_calls``
    is non-empty; or ``command`` is set (command format).
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    command: str | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    message: Message | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def assistant_message(self) -> Message:
        """The assistant message to record: the text plus structured calls when there were any."""
        if self.message is not None:
            return self.message
        return Message(role="assistant", content=self.text, tool_calls=self.tool_calls or None)


def _clean_call(call: ToolCall) -> ToolCall:
    """``call`` itself, or a copy without lone surrogates (``clean_text``)."""
    args = clean_json(call.arguments)
    if args == call.arguments and clean_text(call.name) == call.name and clean_text(call.id) == call.id:
        return call
    return ToolCall(id=clean_text(call.id), name=clean_text(call.name), arguments=args)


def _fail(text: str, kind: ErrorKind, error: str, message: Message | None = None) -> ParseResult:
    return ParseResult(text=text, error=error, error_kind=kind, message=message)


def _validate_calls(
    text: str, calls: list[ToolCall], tools: Sequence[ToolSpec] | None, message: Message | None
) -> ParseResult:
    """Check names and arguments, split off the answer tool, and enforce one kind of action per turn."""
    specs = {t.name: t for t in tools or ()}
    cleaned = [_clean_call(c) for c in calls]
    if any(a is not b for a, b in zip(cleaned, calls, strict=True)):  # the model's JSON escapes: clean_text
        calls = cleaned
        if message is not None:
            message = message.model_copy(update={"tool_calls": tuple(calls)})
    answers: list[str] = []
    real: list[ToolCall] = []
    for call in calls:
        if call.name == ANSWER_TOOL and ANSWER_TOOL not in specs:
            answers.append(str(call.arguments.get("answer", "")))
            continue
        if tools is not None and call.name not in specs:
            known = ", ".join(sorted(specs)) or "none"
            return _fail(
                text, "unknown_tool", f"unknown tool '{call.name}'. Available tools: {known}.", message
            )
        if call.name in specs:
            problems = specs[call.name].check_arguments(call.arguments)
            if problems:
                return _fail(
                    text, "bad_arguments", f"bad arguments for '{call.name}': " + "; ".join(problems), message
                )
        if call.name == ANSWER_TOOL:
            answers.append(str(call.arguments.get("answer", "")))
        else:
            real.append(call)
    return _combine(text, real, answers, message)


def _combine(text: str, calls: list[ToolCall], answers: list[str], message: Message | None) -> ParseResult:
    if len(answers) > 1:
        return _fail(text, "two_answers", "give exactly one final answer, not several.", message)
    if answers and calls:
        return _fail(
            text, "mixed", "either call tools or give the final answer in one turn, not both.", message
        )
    if answers:
        return ParseResult(text=text, answer=answers[0].strip(), message=message)
    if calls:
        return ParseResult(text=text, tool_calls=tuple(calls), message=message)
    return _fail(text, "no_action", "no tool call and no final answer found.", message)


def _hermes_calls(body: str, index: int, first_id: int) -> ToolCall | str:
    try:
        data = json.loads(body.strip())
    except (json.JSONDecodeError, RecursionError) as exc:
        return f"the JSON inside <tool_call> #{index + 1} does not parse ({exc.__class__.__name__}: {exc})."
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return f'<tool_call> #{index + 1} must hold a JSON object {{"name": ..., "arguments": {{...}}}}.'
    args: Any = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return f"the arguments of <tool_call> #{index + 1} are a string that is not JSON."
    if not isinstance(args, dict):
        return f'"arguments" of <tool_call> #{index + 1} must be a JSON object.'
    return ToolCall(id=f"call_{first_id + index}", name=data["name"], arguments=args)


def parse_hermes(text: str, tools: Sequence[ToolSpec] | None = None, first_id: int = 0) -> ParseResult:
    """Parse ``<tool_call>`` JSON blocks and ``<answer>`` tags.

    >>> r = parse_hermes('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    >>> r.tool_calls[0].name, r.tool_calls[0].arguments
    ('calculator', {'expression': '2*3'})
    >>> parse_hermes("<answer>6</answer>").answer
    '6'
    >>> parse_hermes('<tool_call>{"name": oops}</tool_call>').error_kind
    'bad_json'
    """
    body = strip_reasoning(text)
    calls: list[ToolCall] = []
    for i, block in enumerate(_TOOL_CALL.findall(body)):
        call = _hermes_calls(block, i, first_id)
        if isinstance(call, str):
            return _fail(text, "bad_json", call)
        calls.append(call)
    if not calls and "<tool_call>" in body:
        return _fail(text, "bad_json", "a <tool_call> tag is not closed with </tool_call>.")
    answers = _ANSWER.findall(body)
    return _validate_calls(
        text, calls + [ToolCall(name=ANSWER_TOOL, arguments={"answer": a}) for a in answers], tools, None
    )


def parse_tags(text: str, tools: Sequence[ToolSpec] | None = None, first_id: int = 0) -> ParseResult:
    """Parse ``<tool>content</tool>`` tags, fenced python blocks and ``<answer>``.

    >>> parse_tags("<search>capital of France</search>").tool_calls[0].arguments
    {'query': 'capital of France'}
    >>> parse_tags("```python\\nprint(1)\\n```").tool_calls[0].arguments
    {'code': 'print(1)\\n'}
    """
    body = strip_reasoning(text)
    first_arg = {"python": "code", "search": "query"}
    for spec in tools or ():
        props = list(spec.parameters.get("properties", {}))
        if props:
            first_arg[spec.name] = props[0]
    calls: list[ToolCall] = []
    spans: list[tuple[int, ToolCall]] = []
    for name, arg in first_arg.items():
        if name == ANSWER_TOOL:
            continue
        for m in re.finditer(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", body, re.S):
            spans.append((m.start(), ToolCall(name=name, arguments={arg: m.group(1).strip("\n")})))
    if "python" in first_arg and (tools is None or any(t.name == "python" for t in tools)):
        for m in _FENCE.finditer(body):
            spans.append((m.start(), ToolCall(name="python", arguments={first_arg["python"]: m.group(1)})))
    for i, (_, call) in enumerate(sorted(spans, key=lambda s: s[0])):
        calls.append(ToolCall(id=f"call_{first_id + i}", name=call.name, arguments=call.arguments))
    answers = _ANSWER.findall(body)
    return _validate_calls(
        text, calls + [ToolCall(name=ANSWER_TOOL, arguments={"answer": a}) for a in answers], tools, None
    )


def parse_command(text: str) -> ParseResult:
    """The whole reply (outside ``<think>``), stripped and on one line, is the command.

    >>> parse_command("  go to kitchen \\n").command
    'go to kitchen'
    """
    body = " ".join(strip_reasoning(text).split())
    m = _ANSWER.search(body)
    if m:
        body = " ".join(m.group(1).split())
    if not body:
        return _fail(text, "no_action", "empty reply: type one command.")
    return ParseResult(text=text, command=body)


def parse_message(message: Message | dict[str, Any], tools: Sequence[ToolSpec] | None = None) -> ParseResult:
    """A structured assistant message: its ``tool_calls`` skip text parsing; its text may hold the answer."""
    try:
        msg = Message.from_dict(message)
    except Exception as exc:  # pydantic raises several types; all mean the same to the model
        return _fail(str(message)[:2000], "bad_message", f"the message is not a valid chat message ({exc}).")
    if msg.role != "assistant":
        return _fail(
            msg.text, "bad_message", f"an action must be an assistant message, not '{msg.role}'.", msg
        )
    if msg.tool_calls:
        return _validate_calls(msg.text, list(msg.tool_calls), tools, msg)
    return parse_hermes(clean_text(msg.text), tools)


def parse_action(
    action: str | Message | dict[str, Any],
    tools: Sequence[ToolSpec] | None = None,
    fmt: ActionFormat = "hermes",
    first_id: int = 0,
) -> ParseResult:
    """Parse one model turn; never raises. Calls parsed from text get ids ``call_{first_id}``, ``call_{first_id+1}``…
    (an env passes its running count so ids are unique in an episode); structured messages keep theirs.

    >>> parse_action("<answer>1</answer><answer>2</answer>").error_kind
    'two_answers'
    >>> parse_action("hello").error_kind
    'no_action'
    """
    try:
        if isinstance(action, dict):
            action = clean_json(action)
        if isinstance(action, (Message, dict)):
            if fmt == "command":
                msg = Message.from_dict(action)
                return parse_command(msg.text)
            return parse_message(action, tools)
        if not isinstance(action, str):
            return _fail(
                repr(action)[:2000],
                "bad_message",
                f"an action must be text or a message, not {type(action).__name__}.",
            )
        if len(action) > MAX_ACTION_CHARS:
            return _fail(
                clean_text(action[:2000]),
                "too_long",
                f"the reply is longer than {MAX_ACTION_CHARS} characters.",
            )
        action = clean_text(action)
        if fmt == "command":
            return parse_command(action)
        if fmt == "tags":
            return parse_tags(action, tools, first_id)
        return parse_hermes(action, tools, first_id)
    except Exception as exc:  # the contract: bad input never escapes as an exception
        return _fail(
            clean_text(str(action)[:2000]),
            "bad_message",
            f"the reply could not be read ({exc.__class__.__name__}).",
        )


def final_call(parsed: ParseResult, name: str, argument: str) -> ParseResult:
    """``parsed`` with a call of the tool ``name`` read as the final answer (its ``argument``, "" when left
    out), as envs whose last step is a tool do (``submit``): alone in its turn it ends the episode; beside
    other calls it is a ``mixed`` error (which should run first is not the parser's to guess).

    >>> call = ToolCall(id="call_0", name="submit", arguments={"code": "x = 1"})
    >>> final_call(ParseResult(text="t", tool_calls=(call,)), "submit", "code").answer
    'x = 1'
    """
    finals = [c for c in parsed.tool_calls if c.name == name]
    if not finals:
        return parsed
    if len(parsed.tool_calls) > 1:
        return _fail(
            parsed.text, "mixed", f"{name} alone: no other tool call in the same turn.", parsed.message
        )
    return ParseResult(
        text=parsed.text, answer=str(finals[0].arguments.get(argument, "")), message=parsed.message
    )
