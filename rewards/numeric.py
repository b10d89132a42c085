"""Numeric final-answer match: the reward of arithmetic tasks (Calculator-v0 computes its reward with it)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from toolgym.rewards.extract import completion_text, final_answer_text

__all__ = ["completion_text", "final_answer_text", "numeric_match", "parse_number"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


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


def numeric_match(
    completions: list[Any], answer: list[Any], tolerance: float = 1e-6, **kwargs: Any
) -> list[float | None]:
    """1.0 when the completion's final number equals the gold number (relative ``tolerance``), else 0.0;
    None when the gold answer has no number. The number is the last one of the last ``<answer>`` block, or of
    the text outside ``<think>`` when there is no block.

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
