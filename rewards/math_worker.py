"""The math judge, and its scorer ``MATH`` (``"math"``) for the workers of
:class:`~toolgym.rewards.scoring_pool.ScoringPool` (``toolgym.rewards.scoring_worker``: the protocol, the
memory cap and the worker's own interval timer are there). A worker imports Math-Verify before it is ready.
"""

from __future__ import annotations

import functools
from typing import Any

from toolgym.rewards.scoring_worker import Scorer

_JUDGE_VERSION = 1


def _wrap(text: str) -> str:
    """Hand Math-Verify one unambiguous LaTeX candidate: ``$…$`` stripped, then boxed."""
    text = text.strip()
    if "\\boxed" in text:
        return text
    if text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return "\\boxed{" + text + "}"


@functools.lru_cache(maxsize=8192)
def _parse_gold(gold: str, inner_timeout: int | None) -> Any:
    from math_verify import parse

    source = gold if ("\\boxed" in gold or "$" in gold) else _wrap(gold)
    # no_fallback: a gold that only survives as a raw string is "unparseable", not a string to compare
    parsed = parse(
        source, extraction_mode="first_match", fallback_mode="no_fallback", parsing_timeout=inner_timeout
    )  # type: ignore[arg-type]
    if not parsed and "$" in gold and "\\boxed" not in gold:  # "$" as a currency sign, not math delimiters
        parsed = parse(
            _wrap(gold.replace("$", "")),
            extraction_mode="first_match",
            fallback_mode="no_fallback",
            parsing_timeout=inner_timeout,
        )  # type: ignore[arg-type]
    return parsed


def judge(gold: str, pred: str | None, inner_timeout: int | None = None, raw: bool = False) -> float | None:
    """1.0 if ``pred`` (one extracted candidate, or None) equals ``gold`` under Math-Verify, 0.0 if not, None
    when the gold cannot be parsed. ``inner_timeout`` is Math-Verify's own SIGALRM limit (main thread only).
    ``raw=True`` lets Math-Verify find the answer in ``pred`` itself (free text) instead of boxing it.

    >>> judge("\\\\frac{1}{2}", "0.5"), judge("3", "4"), judge("", "1")
    (1.0, 0.0, None)
    """
    from math_verify import parse, verify

    if not gold.strip():
        return None
    gold_parsed = _parse_gold(gold, inner_timeout)
    if not gold_parsed:
        return None
    if pred is None or not pred.strip():
        return 0.0
    pred_parsed = parse(
        pred if raw else _wrap(pred), extraction_mode="first_match", parsing_timeout=inner_timeout
    )  # type: ignore[arg-type]
    if not pred_parsed:
        return 0.0
    return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=inner_timeout) else 0.0


def _prepare(*args: Any) -> None:
    """Import Math-Verify (the slow part of a worker's start) and pay its first-use costs (grammar, sympy
    caches) before the first answer."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401

    judge("\\frac{1}{2}", "x^2")


def _score(gold: str, pred: str | None, raw: bool = False, *rest: Any) -> float | None:
    return judge(gold, pred, None, bool(raw))


# the "math" scorer of toolgym.rewards.scoring_worker: items are (gold, candidate) or (gold, text, True)
MATH = Scorer(score=_score, prepare=_prepare)
