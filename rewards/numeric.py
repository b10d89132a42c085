"""Numeric final-answer match: the reward of arithmetic tasks (Calculator-v0 computes its reward with it)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)


def parse_number(text: str) -> Fraction | None:
    """The last number in ``text`` (commas, fractions ``a/b`` and decimals allowed), or None.

    >>> parse_number("2,146 pens")
    Fraction(2146, 1)
    >>> parse_number("no digits") is None
    True
    """
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    token = matches[-1].replace(",", "").replace(" ", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def completion_text(completion: Any) -> str:
    """The text of a completion given as a string or as a list of chat messages (last assistant turn)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                content = message.get("content") or ""
                return (
                    content if isinstance(content, str) else " ".join(str(p.get("text", "")) for p in content)
                )
        return ""
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return str(completion)


def final_answer_text(text: str) -> str:
    """The final answer of a reply: the last ``<answer>`` block when there is one, else the text after
    ``<think>`` is removed."""
    body = _THINK.sub("", text)
    answers = _ANSWER.findall(body)
    return answers[-1] if answers else body


def numeric_match(
    completions: list[Any], answer: list[Any], tolerance: float = 1e-6, **kwargs: Any
) -> list[float | None]:
    """1.0 when the completion's final number equals the gold number (relative ``tolerance``), else 0.0;
    None when the gold answer has no number.

    >>> numeric_match(["<answer>2146</answer>", "<answer>2,147</answer>"], answer=[2146, "2146"])
    [1.0, 0.0]
    >>> numeric_match(["7"], answer=["n/a"])
    [None]
    """
    out: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        gold_value = parse_number(str(gold))
        if gold_value is None:
            out.append(None)
            continue
        value = parse_number(final_answer_text(completion_text(completion)))
        if value is None:
            out.append(0.0)
            continue
        scale = max(1.0, abs(float(gold_value)))
        out.append(1.0 if abs(float(value - gold_value)) <= tolerance * scale else 0.0)
    return out
