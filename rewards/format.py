"""Format and behaviour rewards: valid tool calls, one final answer, balanced tags, a capped tool-use bonus,
DAPO's soft overlong penalty and SimpleTIR's void-turn flag.

They read the completion only (never the prompt, so tags echoed from the prompt earn nothing) and the
assistant turns of a conversational completion (tool results are not the model's text). Reasoning inside
``<think>`` is ignored where the check is about the answer.
"""

from __future__ import annotations

import re
from typing import Any

from toolgym.errors import ConfigError
from toolgym.parsing import ActionFormat, ParseResult, parse_action
from toolgym.rewards.extract import (
    answer_blocks,
    assistant_turns,
    completion_text,
    extract_answer,
    message_text,
    strip_reasoning,
)

_BAD_CALL = {"bad_json", "bad_arguments", "unknown_tool", "bad_message"}


MAX_TAGS = 64  # a turn with more tool-call, answer or fence openers than this is not parsed (it is abuse)
_OPENERS = ("<tool_call>", "<answer>", "```")


def _messages(completion: Any) -> list[dict[str, Any] | str]:
    """Assistant turns as they came: dicts keep structured ``tool_calls``; a string is one turn; anything
    else becomes its text."""
    items = list(completion) if isinstance(completion, (list, tuple)) else [completion]
    out: list[dict[str, Any] | str] = []
    for m in items:
        if isinstance(m, dict):
            if m.get("role", "assistant") == "assistant":
                out.append(m)
        else:
            out.append(message_text(m))
    return out


def _text(message: dict[str, Any] | str) -> str:
    return message if isinstance(message, str) else message_text(message)


def _parse(message: dict[str, Any] | str, tools: Any, fmt: ActionFormat) -> ParseResult | None:
    """The parsed turn, or None for one that cannot be parsed in bounded time or at all (a bad turn)."""
    text = _text(message)
    if any(text.count(tag) > MAX_TAGS for tag in _OPENERS):
        return None
    try:
        return parse_action(message, tools, fmt)
    except Exception:  # a malformed message (odd content types): a bad turn, never a crashed batch
        return None


def tool_call_format(
    completions: list[Any], fmt: ActionFormat = "hermes", **kwargs: Any
) -> list[float | None]:
    """Fraction of the turns that call tools whose calls all parse (JSON object with a name and object
    arguments; names and arguments checked against ``tools`` when given); None when no turn calls a tool.

    >>> tool_call_format(['<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>', '<tool_call>{oops</tool_call>'])
    [1.0, 0.0]
    >>> tool_call_format(["<answer>4</answer>"])
    [None]
    """
    out: list[float | None] = []
    for completion in completions:
        calling = good = 0
        for message in _messages(completion):
            text = _text(message)
            structured = isinstance(message, dict) and bool(message.get("tool_calls"))
            if not structured and "<tool_call>" not in strip_reasoning(text) and fmt == "hermes":
                continue
            result = _parse(message, kwargs.get("tools"), fmt)
            if result is None:
                calling += 1  # unparseable: a bad call
                continue
            if (
                fmt != "hermes"
                and not structured
                and not result.tool_calls
                and result.error_kind not in _BAD_CALL
            ):
                continue
            calling += 1
            good += result.error_kind not in _BAD_CALL
        out.append(good / calling if calling else None)
    return out


def single_answer(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion (outside ``<think>``, all assistant turns) holds exactly one non-empty
    ``<answer>…</answer>``, else 0.0.

    >>> single_answer(["<think><answer>1</answer></think><answer>2</answer>", "<answer>1</answer><answer>1</answer>"])
    [1.0, 0.0]
    >>> single_answer(["<answer> </answer>", "no tags"])
    [0.0, 0.0]
    """
    out: list[float | None] = []
    for completion in completions:
        bodies = [strip_reasoning(turn) for turn in assistant_turns(completion)]
        blocks = [b for body in bodies for b in answer_blocks(body)]
        tags = sum(body.count("<answer>") + body.count("</answer>") for body in bodies)
        ok = len(blocks) == 1 and tags == 2 and blocks[0].strip()
        out.append(1.0 if ok else 0.0)
    return out


def tag_balance(
    completions: list[Any], tags: tuple[str, ...] = ("think", "answer", "tool_call"), **kwargs: Any
) -> list[float | None]:
    """1.0 when every assistant turn opens and closes ``tags`` in proper nesting (no stray or crossed tags,
    no tag inside itself), else 0.0.

    >>> tag_balance(["<think>a</think><answer>b</answer>", "<think>a<answer>b</think></answer>"])
    [1.0, 0.0]
    >>> tag_balance(["<answer>b", "plain text"])
    [0.0, 1.0]
    """
    pattern = re.compile(r"</?(" + "|".join(re.escape(t) for t in tags) + r")>")
    out: list[float | None] = []
    for completion in completions:
        ok = True
        for turn in assistant_turns(completion):
            stack: list[str] = []
            for m in pattern.finditer(turn):
                closing, name = m.group(0).startswith("</"), m.group(1)
                if closing:
                    if not stack or stack.pop() != name:
                        ok = False
                        break
                elif name in stack:
                    ok = False
                    break
                else:
                    stack.append(name)
            ok = ok and not stack
            if not ok:
                break
        out.append(1.0 if ok else 0.0)
    return out


def tool_call_bonus(
    completions: list[Any],
    per_call: float = 0.1,
    cap: float = 0.3,
    fmt: ActionFormat = "hermes",
    needs_answer: bool = True,
    **kwargs: Any,
) -> list[float | None]:
    """``per_call`` for each valid tool call in the assistant turns, at most ``cap``, paid only when the last
    assistant turn gives a final answer (tool use encouraged without rewarding endless calling: paid per call
    alone, a policy farms it by calling tools and never answering). ``needs_answer=False`` pays the calls of
    a completion without an answer too (one-turn completions, where a call and an answer cannot share a turn).

    >>> call = '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    >>> turns = lambda n: [call] * n + ["<answer>x</answer>"]  # n calling turns, then the answer
    >>> tool_call_bonus([turns(1), turns(2), turns(9), turns(0), [call, call]])
    [0.1, 0.2, 0.3, 0.0, 0.0]
    >>> tool_call_bonus([call * 2, '<tool_call>{bad</tool_call>'], needs_answer=False)
    [0.2, 0.0]
    """
    out: list[float | None] = []
    for completion in completions:
        parsed = [_parse(m, kwargs.get("tools"), fmt) for m in _messages(completion)]
        if needs_answer and not _answers(parsed, completion):
            out.append(0.0)
            continue
        calls = sum(len(r.tool_calls) for r in parsed if r is not None)
        out.append(round(min(cap, per_call * calls), 10))
    return out


def _answers(parsed: list[ParseResult | None], completion: Any) -> bool:
    """Whether the last assistant turn gives a non-empty final answer: an ``answer`` call or ``<answer>``
    (what the parser reads), or a ``\\boxed{}`` one (what the answer rewards read)."""
    if parsed and parsed[-1] is not None and (parsed[-1].answer or "").strip():
        return True
    return bool((extract_answer(completion_text(completion)) or "").strip())  # an empty answer is none


def _lengths(completions: list[Any], kwargs: dict[str, Any], unit: str) -> list[int]:
    if unit == "chars":
        return [sum(len(t) for t in assistant_turns(c)) for c in completions]
    ids = kwargs.get("completion_ids", kwargs.get("completions_ids"))
    if ids is None:
        raise ConfigError(
            "overlong_penalty counts tokens from `completion_ids` (TRL passes it); pass it, or unit='chars'."
        )
    return [len(x) for x in ids]


def overlong_penalty(
    completions: list[Any], max_length: int = 4096, buffer: int = 1024, unit: str = "tokens", **kwargs: Any
) -> list[float | None]:
    """DAPO's soft overlong punishment: 0 up to ``max_length - buffer`` tokens, then falling linearly to -1 at
    ``max_length``, and -1 beyond. Token counts come from ``completion_ids`` (or ``completions_ids``);
    ``unit="chars"`` counts characters instead.

    >>> overlong_penalty(["a", "b", "c", "d"], max_length=10, buffer=4, completion_ids=[[0] * 6, [0] * 8, [0] * 10, [0] * 12])
    [0.0, -0.5, -1.0, -1.0]
    >>> overlong_penalty(["abcdefgh"], max_length=10, buffer=4, unit="chars")
    [-0.5]
    """
    if not 0 < buffer <= max_length:
        raise ConfigError(
            f"overlong_penalty needs 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}."
        )
    start = max_length - buffer
    out: list[float | None] = []
    for n in _lengths(completions, kwargs, unit):
        out.append(0.0 if n <= start else max(-1.0, (start - n) / buffer))
    return out


def void_turn(completions: list[Any], fmt: ActionFormat = "hermes", **kwargs: Any) -> list[float | None]:
    """SimpleTIR's void-turn flag: 1.0 when some assistant turn makes neither a tool call nor a final answer
    (empty, or text only), else 0.0. Log it (weight 0) or filter those trajectories; SimpleTIR drops them.

    >>> void_turn([[{"role": "assistant", "content": "<tool_call>{\\"name\\": \\"python\\", \\"arguments\\": {}}</tool_call>"},
    ...             {"role": "tool", "content": "1"}, {"role": "assistant", "content": "<answer>1</answer>"}]])
    [0.0]
    >>> void_turn(["<think>hmm</think>", ""])
    [1.0, 1.0]
    """
    out: list[float | None] = []
    for completion in completions:
        parsed = [_parse(m, None, fmt) for m in _messages(completion)]
        void = any(r is not None and r.error_kind == "no_action" for r in parsed)
        out.append(1.0 if void else 0.0)
    return out
