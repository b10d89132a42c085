"""A pool of math-judge worker processes with a hard per-answer timeout: the ``"math"`` scorer of
:class:`~toolgym.rewards.scoring_pool.ScoringPool`.

Math-Verify's own timeout is ``signal.alarm``: it raises outside the main thread (Math-Verify #50) and cannot
interrupt sympy stuck in C code. Here each answer runs in a worker process; the caller waits on a pipe with a
deadline and kills the worker when it passes, from any thread and from asyncio (``await pool.ajudge(...)``),
with no signals in the caller. A warm spare replaces a killed worker at once. After ``os.fork`` the child
starts its own workers. ``workers=0`` runs the judge in the calling process (the baseline; no hard timeout).

The math rewards judge on the process's shared pool (``default_pool``: a :class:`MathJudge` over
``scoring_pool.shared_pool``, whose workers other scorers use too); a :class:`MathJudgePool` is a pool of
its own, for a caller that wants one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from toolgym.optional import available, not_installed
from toolgym.rewards.math_worker import judge
from toolgym.rewards.scoring_pool import ScoringPool, shared_pool

TIMEOUT_S = 5.0


def _require_math_verify() -> None:
    # found without importing (the import takes seconds, and the workers do their own): the check is
    # here so a missing package fails at construction, not as every judged answer's worker crash
    if not available("math_verify"):
        raise not_installed("math_verify", why="math rewards judge answers with it")


def _judge(pool: ScoringPool, pairs: Sequence[tuple[Any, ...]], timeout: float) -> list[float | None]:
    """``pairs`` judged on ``pool`` within ``timeout`` each (in this process when it has no workers, with
    Math-Verify's own SIGALRM at ``timeout // 3`` on the main thread)."""
    if pool.workers == 0:
        inner = max(1, int(timeout // 3)) if threading.current_thread() is threading.main_thread() else None
        return [judge(pair[0], pair[1], inner, bool(pair[2:] and pair[2])) for pair in pairs]
    return pool.score("math", pairs, timeout=timeout)


class MathJudgePool(ScoringPool):
    """Judge ``(gold, candidate)`` pairs in ``workers`` processes, each answer within ``timeout`` seconds.

    A pair that runs out of time scores 0.0 and counts ``math/timeouts``: the worker stops it itself at
    ``timeout / 2`` (an interval timer); code no signal can interrupt is killed at ``timeout`` and the worker
    replaced by a warm spare. A worker that cannot start is an ``InfrastructureError``.
    """

    def __init__(
        self, workers: int | None = None, timeout: float = TIMEOUT_S, memory_limit_mb: int = 2048
    ) -> None:
        _require_math_verify()
        super().__init__(workers, timeout, memory_limit_mb, preload=[("math", ())])

    def judge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        """Scores of ``(gold, candidate)`` pairs (or ``(gold, text, True)`` to let Math-Verify search free
        text): 1.0, 0.0, or None when the gold cannot be parsed."""
        return _judge(self, pairs, self.timeout)

    async def ajudge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        """:meth:`judge` for asyncio code: runs in a thread, so the event loop keeps going."""
        return await asyncio.to_thread(self.judge, pairs)


class MathJudge:
    """:meth:`MathJudgePool.judge` on a pool that other scorers may share (``default_pool``)."""

    def __init__(self, pool: ScoringPool, timeout: float = TIMEOUT_S) -> None:
        _require_math_verify()
        pool.register("math")
        self.pool, self.timeout = pool, timeout

    def judge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        """As :meth:`MathJudgePool.judge`."""
        return _judge(self.pool, pairs, self.timeout)

    async def ajudge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        return await asyncio.to_thread(self.judge, pairs)


def default_pool() -> MathJudge:
    """The judge the math rewards use unless given a pool: on the process's shared scoring pool."""
    return MathJudge(shared_pool())
