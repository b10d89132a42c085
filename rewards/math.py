"""Math final-answer reward: one extracted answer, checked for equivalence by Math-Verify (sympy underneath).

- Extraction (:mod:`toolgym.rewards.extract`): reasoning inside ``<think>`` ignored; ``<answer>`` tag, then the
  last ``\\boxed{}``, then an "Answer:" line; one candidate only (first-match policy; ``several="reject"``
  scores hedged replies such as ``\\boxed{1} \\boxed{2}`` 0).
- Equivalence: Math-Verify in a worker process with a hard timeout (:class:`MathJudgePool`); a timeout scores
  0 and is counted. A gold answer that does not parse gives None (skipped by the trainer) and is counted.
- Fast path: a candidate that is the same number as the gold (or a different integer) is settled without
  sympy; set ``fast_path=False`` to send everything to Math-Verify. Repeated (gold, answer) pairs in a batch
  (common within a GRPO group) are judged once.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from toolgym.errors import ConfigError
from toolgym.rewards.counters import count
from toolgym.rewards.extract import (
    MAX_ANSWER_CHARS,
    Several,
    completion_text,
    extract_answer,
    strip_reasoning,
)
from toolgym.rewards.math_normalize import free_text, mismatch, normalize, sides
from toolgym.rewards.math_pool import MathJudgePool, default_pool

_PLAIN_INT = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d{1,15})")
_PLAIN_NUM = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")  # unambiguous: linear on long digit runs


def _plain(text: str) -> str:
    text = text.strip().strip("$").strip()
    for junk in ("\\!", "\\,", "\\ ", " "):
        text = text.replace(junk, "")
    return text.rstrip(".")


def fast_verdict(gold: str, pred: str) -> float | None:
    """1.0/0.0 when both sides are plain numbers that settle the question without sympy, else None.

    >>> fast_verdict("2,146", "2146"), fast_verdict("12", "13"), fast_verdict("0.5", "1/2"), fast_verdict("x", "x")
    (1.0, 0.0, 1.0, None)
    """
    g, p = _plain(gold), _plain(pred)
    if _PLAIN_INT.fullmatch(g) and _PLAIN_INT.fullmatch(p):
        return 1.0 if int(g.replace(",", "")) == int(p.replace(",", "")) else 0.0
    if len(g) < 200 and len(p) < 200 and _PLAIN_NUM.fullmatch(g) and _PLAIN_NUM.fullmatch(p):
        try:
            if Fraction(g) == Fraction(p):
                return 1.0
        except (ValueError, ZeroDivisionError):
            return None
    return None


_PARSED_GOLDS: set[str] = set()  # golds a judge has parsed, so a reply without an answer needs no judge


def _gold_parses(gold: str) -> bool:
    g = _plain(gold)
    return gold in _PARSED_GOLDS or bool(
        _PLAIN_INT.fullmatch(g) or (len(g) < 200 and _PLAIN_NUM.fullmatch(g))
    )


def _gold_column(kwargs: dict[str, Any], n: int) -> list[Any]:
    for key in ("solution", "answer", "ground_truth"):
        if kwargs.get(key) is not None:
            gold = list(kwargs[key])
            if len(gold) != n:
                raise ConfigError(
                    f"got {n} completions but {len(gold)} values of '{key}'; pass one per completion."
                )
            return gold
    raise ConfigError("math_match needs the gold answers as a dataset column named 'solution' or 'answer'.")


def _gold_text(gold: Any) -> str:
    try:
        if hasattr(gold, "tolist"):  # numpy values, as verl's batches hold them
            gold = gold.tolist()
        if isinstance(gold, (list, tuple)):  # several golds: the first is the reference form
            gold = gold[0] if gold else ""
        return "" if gold is None else normalize(str(gold))
    except Exception:  # a value whose str() fails is no gold
        return ""


def math_match(
    completions: list[Any],
    *,
    several: Several = "last",
    fallback: bool = False,
    fast_path: bool = True,
    pool: MathJudgePool | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the completion's final answer is mathematically equal to the gold (column ``solution`` or
    ``answer``), 0.0 when not or when there is no answer, None when the gold cannot be parsed.
    ``fallback=True`` lets Math-Verify search the whole reply (outside ``<think>``) when no answer is marked.

    >>> math_match(["<think>maybe 1/3</think> so $\\\\boxed{\\\\frac{1}{2}}$", "\\\\boxed{0.4}"], solution=["0.5", "0.5"])
    [1.0, 0.0]
    >>> math_match(["\\\\boxed{1} \\\\boxed{2}", "Answer: 7"], answer=["2", ""], several="reject")
    [0.0, None]
    """
    golds = [_gold_text(g) for g in _gold_column(kwargs, len(completions))]
    # each completion is settled by one or more (gold, candidate, raw) checks, all of which must pass
    checks: list[list[tuple[str, str | None, bool]]] = []
    for completion, gold in zip(completions, golds, strict=True):
        if not gold.strip():
            checks.append([])
            continue
        text = completion_text(completion)
        cand = extract_answer(text, several)
        raw = False
        if cand is None and fallback:
            cand, raw = strip_reasoning(text)[-MAX_ANSWER_CHARS:] or None, True
        if cand is not None:
            cand = normalize(free_text(cand) if raw else cand)
        if cand is None or not cand.strip() or mismatch(gold, cand):
            checks.append([(gold, None, False)])  # 0.0, or None when the gold itself does not parse
            continue
        parts = sides(cand) if not raw else [cand]
        checks.append([(gold, part, raw) for part in parts] if parts else [(gold, None, False)])
    verdicts: dict[tuple[str, str | None, bool], float | None] = {}
    slow: list[tuple[str, str | None, bool]] = []
    for pair in dict.fromkeys(p for row in checks for p in row):  # a GRPO group repeats answers: judge once
        gold, cand, raw = pair
        if cand is None:  # no answer: 0.0 once the gold is known to parse
            verdict = 0.0 if _gold_parses(gold) else None
        else:
            verdict = fast_verdict(gold, cand) if fast_path and not raw else None
        if verdict is None:
            slow.append(pair)
        else:
            verdicts[pair] = verdict
    if slow:
        verdicts.update(zip(slow, (pool or default_pool()).judge(slow), strict=True))
        for (gold, _, _), verdict in zip(slow, (verdicts[p] for p in slow), strict=True):
            if verdict is not None and len(_PARSED_GOLDS) < 65_536:
                _PARSED_GOLDS.add(gold)  # any verdict but None means the gold parsed
    results: list[float | None] = []
    for row in checks:
        values = [verdicts[p] for p in row]
        results.append(None if not row or None in values else min(v for v in values if v is not None))
    count("math/gold_unparseable", sum(r is None for r in results), kwargs.get("log_metric"))
    return results


async def math_match_async(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """:func:`math_match` for asyncio trainers (TRL awaits ``async`` reward functions): the verification
    waits in a thread, so the event loop keeps running."""
    import asyncio

    return await asyncio.to_thread(math_match, completions, **kwargs)
