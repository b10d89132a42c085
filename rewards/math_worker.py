"""The math judge, and the worker process that runs it (``python -m toolgym.rewards.math_worker``).

The worker speaks pickled frames (``multiprocessing.connection``) on stdin/stdout: it sends ``"ready"`` once
Math-Verify is imported, then answers each chunk (a list of ``(gold, pred)``) with one score frame per answer; ``None`` stops it. Anything a library
prints goes to stderr, so it cannot corrupt the protocol. The worker caps its own address space, and stops an
answer itself at ``soft_timeout`` seconds (an interval timer in its main thread; it answers ``"timeout"``),
so the pool's hard kill is only for code that no signal can interrupt.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

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


class _SoftTimeout(BaseException):
    """Raised by the worker's own interval timer; a BaseException, so no ``except Exception`` swallows it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftTimeout


def _serve(memory_limit_mb: int, soft_timeout: float) -> None:
    import signal
    from multiprocessing.connection import Connection

    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    if memory_limit_mb > 0:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (the import is the slow part of startup)

    judge("\\frac{1}{2}", "x^2")  # first-use costs (grammar, sympy caches) before "ready"
    signal.signal(signal.SIGALRM, _on_alarm)  # one timer for the whole answer, sub-second if asked

    reader = Connection(0, writable=False)
    writer = Connection(out_fd, readable=False)
    writer.send("ready")
    while True:
        try:
            task = reader.recv()
        except EOFError:
            return
        if task is None:
            return
        for gold, pred, *rest in task:  # a chunk of answers: one result frame each, in order
            result: float | str | None
            try:
                signal.setitimer(signal.ITIMER_REAL, soft_timeout)
                result = judge(gold, pred, None, bool(rest and rest[0]))
            except _SoftTimeout:
                result = "timeout"
            except MemoryError:
                result = "memory"
            except Exception:  # Math-Verify raises many types on odd input: all mean "no match"
                result = 0.0
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            writer.send(result)
            if result == "memory":
                return  # the pool replaces this worker; a fresh heap is safer than a fragmented one


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]))
