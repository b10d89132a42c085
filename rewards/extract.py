"""Where a reward looks: the completion's text, its final answer, never the reasoning or the prompt echo.

Policy for several answers (the "first match" policy, as in Math-Verify's ``first_match``): the answer kinds are
searched in priority order, ``<answer>…</answer>`` tags first, then ``\\boxed{…}``, then an "Answer: …" line;
the first kind present gives exactly one candidate, and inside that kind the last occurrence wins (a model
boxes its final answer last). Only that one candidate is ever verified: never "any of several", which would
reward listing every option. ``several="reject"`` turns more than one distinct candidate of the winning kind
into no answer at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from toolgym.parsing import ParseResult
from toolgym.reasoning import strip_reasoning

__all__ = ["strip_reasoning"]  # the one rule lives in toolgym.reasoning (the parser uses it too)

Several = Literal["last", "first", "reject"]

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_BOX_TOKEN = re.compile(r"[^\s$]+")
_BRACE = re.compile(r"[{}]")
_ANSWER_WORD = re.compile(r"answer", re.I)
_SKIP_STARS = re.compile(r"[\s*]*")  # matched forward only: nothing to backtrack into
_SKIP_SPACE = re.compile(r"\s*")
_ANSWER_IS = re.compile(r"answer is\s*:?\s*\$?(-?[\d,]*\.?\d+)", re.I)
_ANSWER_PREFIX = re.compile(r"^\W*(?:the\s+)?(?:final\s+)?answer\s+is\b", re.I)
MAX_ANSWER_CHARS = 10_000  # a longer "final answer" is not one (keeps every verifier's input small)
MAX_CANDIDATES = 100  # more boxes, answer tags or "answer" words than this is spam: no answer at all


def _spans(text: str, opener: str, closer: str) -> list[str]:
    """The texts between each ``opener`` and the next ``closer``, scanning left to right without overlap
    (what ``re.findall(opener + "(.*?)" + closer, text, re.S)`` gives), in linear time: an opener that is
    never closed ends the scan instead of being retried from every later opener."""
    out: list[str] = []
    pos = 0
    while True:
        i = text.find(opener, pos)
        if i < 0:
            return out
        j = text.find(closer, i + len(opener))
        if j < 0:
            return out
        out.append(text[i + len(opener) : j])
        pos = j + len(closer)


def answer_blocks(text: str) -> list[str]:
    """The contents of every ``<answer>…</answer>`` block, in order (linear time).

    >>> answer_blocks("<answer>1</answer> x <answer>2</answer><answer>open")
    ['1', '2']
    """
    return _spans(text, "<answer>", "</answer>")


def message_text(message: Any) -> str:
    """The text of one chat message (``content`` as a string or as a list of text parts); "" for anything
    that has no readable text (a value whose ``str()`` raises included): rewards never raise on a completion.

    >>> message_text({"content": [{"type": "text", "text": "a"}, "b"]}), message_text(None), message_text(3)
    ('a b', '', '3')
    """
    try:
        if isinstance(message, str):
            return message
        content = (
            message.get("content") if isinstance(message, dict) else getattr(message, "content", message)
        )
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, (list, tuple)):
            parts = [p.get("text", "") if isinstance(p, dict) else p for p in content]
            return " ".join(p for p in parts if isinstance(p, str))
        text = str(content)
        return text if isinstance(text, str) else ""
    except Exception:
        return ""


def assistant_turns(completion: Any) -> list[str]:
    """The texts of every assistant turn of a completion (a string is one turn).

    >>> assistant_turns([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"},
    ...                  {"role": "assistant", "content": "b"}])
    ['a', 'b']
    >>> assistant_turns("just text")
    ['just text']
    """
    if isinstance(completion, str):
        return [completion]
    if isinstance(completion, (list, tuple)):
        return [message_text(m) for m in completion if not isinstance(m, dict) or _role(m) == "assistant"]
    return [message_text(completion)]


def _role(message: dict[str, Any]) -> Any:
    return message.get("role", "assistant")


def completion_text(completion: Any) -> str:
    """The text of a completion given as a string or as a list of chat messages (last assistant turn).

    >>> completion_text([{"role": "assistant", "content": "<answer>4</answer>"}])
    '<answer>4</answer>'
    >>> completion_text("plain")
    'plain'
    """
    turns = assistant_turns(completion)
    return turns[-1] if turns else ""


def _boxes(text: str) -> list[str] | None:
    """The outermost boxes' contents; None for box spam (more than ``MAX_CANDIDATES`` boxes)."""
    if text.count("\\boxed") + text.count("\\fbox") > MAX_CANDIDATES:
        return None
    out: list[str] = []
    pos, n = 0, len(text)
    while True:
        m = _BOXED.search(text, pos)
        if m is None:
            return out
        i = m.end()
        if i < n and text[i] == "{":
            depth, close, end = 0, -1, min(n, i + MAX_ANSWER_CHARS + 2)
            for brace in _BRACE.finditer(text, i, end):  # only braces, and never past the answer cap
                depth += 1 if brace.group() == "{" else -1
                if depth == 0:
                    close = brace.start()
                    break
            if close < 0:  # unclosed: no complete box from here on; too long: one that is no answer
                if end < n:
                    out.append(text[i + 1 : end])
                return out
            out.append(text[i + 1 : close].strip())
            pos = close + 1
            continue
        if m.group(0) != m.group(0).rstrip() or (i < n and not text[i].isalpha()):
            token = _BOX_TOKEN.match(text, i)
            if token:
                out.append(token.group(0).rstrip(".,"))
                pos = token.end()
                continue
        pos = max(i, m.start() + 1)


def extract_boxed(text: str) -> list[str]:
    """The contents of every outermost ``\\boxed{…}`` / ``\\fbox{…}`` (nested braces kept; a box inside a
    box is part of the outer one's content), in order; [] for box spam (more than ``MAX_CANDIDATES``). One
    pass over the text, linear in its length.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and \\boxed{3}")
    ['\\\\frac{1}{2}', '3']
    >>> extract_boxed(r"\\boxed 7 then \\boxed{unclosed")
    ['7']
    """
    return _boxes(text) or []


def _answer_words(text: str) -> list[tuple[int, int]]:
    """(start, end) of every "answer" (any case), or [] when there are more than ``MAX_CANDIDATES``."""
    if len(_ANSWER_WORD.findall(text, 0, len(text))) > MAX_CANDIDATES:
        return []
    return [m.span() for m in _ANSWER_WORD.finditer(text)]


def _skip(pattern: re.Pattern[str], text: str, pos: int) -> int:
    m = pattern.match(text, pos)
    return m.end() if m else pos


def answer_lines(text: str) -> list[str]:
    """Candidates from "Answer: …" / "Final answer is: …" / "**Final answer:** …" lines, then, when there
    are none, from "the answer is …" sentences; each runs to the end of its line (markdown bold, ``$`` kept,
    a trailing period dropped). Linear: no backtracking, and the scan resumes at the end of each used line.

    >>> answer_lines("**Final answer:** 64"), answer_lines("So the answer is 42."), answer_lines("Answer:")
    (['64'], ['42'], [])
    """
    words = _answer_words(text)
    out: list[str] = []
    for colon in (True, False):
        line_end = -1
        for start, end in words:
            if start < line_end:
                continue  # inside a line already used
            if not colon and start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
                continue  # "the answer is" needs a word boundary
            j = _skip(_SKIP_STARS if colon else _SKIP_SPACE, text, end)
            if colon:
                if text.startswith("is", j):
                    j = _skip(_SKIP_STARS, text, j + 2)
                if j >= len(text) or text[j] not in ":：":
                    continue
                j += 1
            else:
                if j == end or not text.startswith("is", j) or text[j + 2 : j + 3].isalnum():
                    continue
                j += 2
            line_end = text.find("\n", j)
            line_end = len(text) if line_end < 0 else line_end
            value = text[j:line_end].strip().strip("*").strip()
            value = _ANSWER_PREFIX.sub("", value).strip()  # "Final Answer: The final answer is $5$"
            if value.endswith("I hope it is correct."):
                value = value[: -len("I hope it is correct.")].strip()
            value = value.rstrip(" .")
            if value:
                out.append(value)
        if out:
            break
    return out


def _pick(candidates: list[str], several: Several, same: Callable[[str], str] | None = None) -> str | None:
    if not candidates:
        return None
    if several == "reject" and len({(same or str.strip)(c) for c in candidates}) > 1:
        return None
    return candidates[0] if several == "first" else candidates[-1]


def extract_answer(
    text: str, several: Several = "last", same: Callable[[str], str] | None = None
) -> str | None:
    """The single final-answer candidate of a reply (see the module docstring for the policy), or None.
    ``several`` says which candidate counts when the winning kind holds several: the ``"last"`` (default),
    the ``"first"``, or none when they differ (``"reject"``; ``same`` normalises them before comparing).

    >>> extract_answer("<think>\\\\boxed{1}</think> so \\\\boxed{2}")
    '2'
    >>> extract_answer("Answer: 12 apples") is None, extract_answer("no answer here") is None
    (False, True)
    """
    if not isinstance(text, str):
        return None
    body = strip_reasoning(text)
    if body.count("<answer>") > MAX_CANDIDATES:
        return None
    tags = answer_blocks(body)
    if tags:
        inner = _pick(tags, several, same)
        if inner is None:
            return None
        boxed = _boxes(inner)
        if boxed is None:
            return None
        chosen = _pick(boxed, several, same) if boxed else inner
        return _bounded(chosen.strip() if chosen is not None else None)
    boxed = _boxes(body)
    if boxed is None:
        return None
    if boxed:
        return _bounded(_pick(boxed, several, same))
    return _bounded(_pick(answer_lines(body), several, same))


def _bounded(answer: str | None) -> str | None:
    return answer if answer is None or len(answer) <= MAX_ANSWER_CHARS else None


def final_answer_text(text: str) -> str:
    """The last ``<answer>`` block outside the reasoning when there is one, else the whole text outside the
    reasoning; for answer checks that search the text themselves (:func:`~toolgym.rewards.numeric.numeric_match`).

    >>> final_answer_text("<think>7</think><answer>8</answer>")
    '8'
    >>> final_answer_text("<think>7</think>it is 9")
    'it is 9'
    """
    body = strip_reasoning(text)
    tags = answer_blocks(body)
    return tags[-1] if tags else body


def lenient_answer(parsed: ParseResult) -> ParseResult:
    """For small models that never learned the tags (an env's ``lenient_answers=True``): when a turn has no
    action, an "Answer: X" line, a boxed answer or "the answer is N" counts as the final answer; otherwise
    the parse error stands.

    >>> lenient_answer(ParseResult(text="so the answer is 42.", error="none", error_kind="no_action")).answer
    '42'
    """
    text = strip_reasoning(parsed.text)
    found = extract_answer(text)
    if found is None:
        matches = _ANSWER_IS.findall(text)
        found = matches[-1] if matches else None
    if found is None or not found.strip():
        return parsed
    return ParseResult(text=parsed.text, answer=found.strip())
