"""Numeric final-answer match: the reward of arithmetic tasks (Calculator-v0 computes its reward with it)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from toolgym.errors import ConfigError
from toolgym.rewards.extract import completion_text, final_answer_text

__all__ = ["completion_text", "final_answer_text", "numeric_match", "parse_number"]

_WINDOW = 1000  # characters searched before the last digit (no number is longer)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def parse_number(text: str) -> Fraction | None:
    """The last number in ``text`` (commas, fractions ``a/b`` and decimals allowed), or None.

    >>> parse_number("2,146 pens")
    Fraction(2146, 1)
    >>> parse_number("no digits") is None
    True
    """
    last = max(text.rfind(d) for d in "0123456789")  # the last number ends at the last digit
    if last < 0:
        return None
    # only the tail is searched: cost bounded whatever the text holds before it
    matches = _NUMBER.findall(text, max(0, last - _WINDOW), last + 1)
    if not matches:
        return None
    token = matches[-1].replace(",", "").replace(" ", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _gold_values(answer: list[Any] | None, kwargs: dict[str, Any], n: int) -> list[Any]:
    if answer is None:
        answer = next((kwargs[k] for k in ("solution", "ground_truth") if kwargs.get(k) is not None), None)
    if answer is None:
        raise ConfigError("numeric_match needs the gold numbers as a column named 'answer' or 'solution'.")
    golds = list(answer)
    if len(golds) != n:
        raise ConfigError(f"got {n} completions but {len(golds)} gold values; pass one per completion.")
    return golds


def _safe_number(text: Any) -> Fraction | None:
    try:
        return parse_number(str(text))
    except Exception:  # a value whose str() fails, a number too long for int()
        return None


def numeric_match(
    completions: list[Any], answer: list[Any] | None = None, tolerance: float = 1e-6, **kwargs: Any
) -> list[float | None]:
    """1.0 when the completion's final number equals the gold number (relative ``tolerance``), else 0.0;
    None when the gold answer has no number. The gold is the column ``answer`` (or ``solution``). The number
    is the last one of the last ``<answer>`` block, or of the text outside ``<think>`` when there is no block.

    >>> numeric_match(["<answer>2146</answer>", "<answer>2,147</answer>"], answer=[2146, "2146"])
    [1.0, 0.0]
    >>> numeric_match(["7"], solution=["n/a"])
    [None]
    """
    out: list[float | None] = []
    tol = Fraction(tolerance)
    for completion, gold in zip(completions, _gold_values(answer, kwargs, len(completions)), strict=True):
        gold_value = _safe_number(gold)
        if gold_value is None:
            out.append(None)
            continue
        value = _safe_number(final_answer_text(completion_text(completion)))
        if value is None:
            out.append(0.0)
            continue
        # exact arithmetic: a 4000-digit number cannot overflow a float conversion here
        out.append(1.0 if abs(value - gold_value) <= tol * max(Fraction(1), abs(gold_value)) else 0.0)
    return out
