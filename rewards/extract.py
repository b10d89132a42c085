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
from typing import Any, Literal

Several = Literal["last", "first", "reject"]

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:：]\s*(.+)", re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def message_text(message: Any) -> str:
    """The text of one chat message (``content`` as a string or as a list of text parts)."""
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return str(getattr(message, "content", message) or "")
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


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
    if isinstance(completion, dict):
        return [message_text(completion)]
    if isinstance(completion, (list, tuple)):
        return [
            message_text(m)
            for m in completion
            if not isinstance(m, dict) or m.get("role", "assistant") == "assistant"
        ]
    return [str(completion)]


def completion_text(completion: Any) -> str:
    """The text of a completion given as a string or as a list of chat messages (last assistant turn).

    >>> completion_text([{"role": "assistant", "content": "<answer>4</answer>"}])
    '<answer>4</answer>'
    >>> completion_text("plain")
    'plain'
    """
    turns = assistant_turns(completion)
    return turns[-1] if turns else ""


def strip_reasoning(text: str) -> str:
    """The text outside the reasoning: closed ``<think>`` blocks removed; after a lone ``</think>`` (templates
    that open ``<think>`` in the prompt) only what follows it; an unclosed ``<think>`` hides everything after it
    (a truncated completion has no answer).

    >>> strip_reasoning("<think>maybe 3</think>The answer is 4")
    'The answer is 4'
    >>> strip_reasoning("<think>\\\\boxed{3} and I ran out of tokens")
    ''
    """
    if "</think>" in text and "<think>" not in text.split("</think>", 1)[0]:
        text = text.rsplit("</think>", 1)[1]
    text = _THINK_BLOCK.sub("", text)
    start = text.find("<think>")
    return text if start < 0 else text[:start]


def extract_boxed(text: str) -> list[str]:
    """The contents of every ``\\boxed{…}`` / ``\\fbox{…}`` (nested braces kept), in order.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and \\boxed{3}")
    ['\\\\frac{1}{2}', '3']
    >>> extract_boxed(r"\\boxed 7 then \\boxed{unclosed")
    ['7']
    """
    out: list[str] = []
    for m in _BOXED.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        out.append(text[i + 1 : j].strip())
                        break
                j += 1
        elif m.group(0) != m.group(0).rstrip() or (i < len(text) and not text[i].isalpha()):
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                out.append(token.group(0).rstrip(".,"))
    return out


def _pick(candidates: list[str], several: Several) -> str | None:
    if not candidates:
        return None
    if several == "reject" and len({c.strip() for c in candidates}) > 1:
        return None
    return candidates[0] if several == "first" else candidates[-1]


def extract_answer(text: str, several: Several = "last") -> str | None:
    """The single final-answer candidate of a reply (see the module docstring for the policy), or None.

    >>> extract_answer("<think>\\\\boxed{1}</think> so \\\\boxed{2}")
    '2'
    >>> extract_answer("Answer: 12 apples") is None, extract_answer("no answer here") is None
    (False, True)
    """
    body = strip_reasoning(text)
    tags = _ANSWER_TAG.findall(body)
    if tags:
        inner = _pick(tags, several)
        if inner is None:
            return None
        boxed = extract_boxed(inner)
        chosen = _pick(boxed, several) if boxed else inner
        return chosen.strip() if chosen is not None else None
    boxed = extract_boxed(body)
    if boxed:
        return _pick(boxed, several)
    lines = _ANSWER_LINE.findall(body)
    picked = _pick([ln.strip() for ln in lines], several)
    return picked.rstrip(" .") if picked is not None else None


def final_answer_text(text: str) -> str:
    """The last ``<answer>`` block outside the reasoning when there is one, else the whole text outside the
    reasoning; for answer checks that search the text themselves (:func:`~toolgym.rewards.numeric.numeric_match`).

    >>> final_answer_text("<think>7</think><answer>8</answer>")
    '8'
    >>> final_answer_text("<think>7</think>it is 9")
    'it is 9'
    """
    body = strip_reasoning(text)
    tags = _ANSWER_TAG.findall(body)
    return tags[-1] if tags else body
