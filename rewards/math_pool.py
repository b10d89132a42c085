"""A pool of math-judge worker processes with a hard per-answer timeout: the ``"math"`` scorer of
:class:`~toolgym.rewards.scoring_pool.ScoringPool`.

Math-Verify's own timeout is ``signal.alarm``: it raises outside the main thread (Math-Verify #50) and cannot
interrupt sympy stuck in C code. Here each answer runs in a worker process; the caller waits on a pipe with a
deadline and kills the worker when it passes, from any thread and from asyncio (``await pool.ajudge(...)``),
with no signals in the caller. A warm spare replaces a killed worker at once. After ``os.fork`` the child
starts its own workers. ``workers=0`` runs the judge in the calling process (the baseline; no hard timeout).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from toolgym.optional import available, not_installed
from toolgym.rewards.math_worker import judge
from toolgym.rewards.scoring_pool import ScoringPool


class MathJudgePool(ScoringPool):
    """Judge ``(gold, candidate)`` pairs in ``workers`` processes, each answer within ``timeout`` seconds.

    A pair that runs out of time scores 0.0 and counts ``math/timeouts``: the worker stops it itself at
    ``timeout / 2`` (an interval timer); code no signal can interrupt is killed at ``timeout`` and the worker
    replaced by a warm spare. A worker that cannot start is an ``InfrastructureError``.
    """

    def __init__(self, workers: int | None = None, timeout: float = 5.0, memory_limit_mb: int = 2048) -> None:
        # found without importing (the import takes seconds, and the workers do their own): the check is
        # here so a missing package fails at construction, not as every judged answer's worker crash
        if not available("math_verify"):
            raise not_installed("math_verify", why="math rewards judge answers with it")
        super().__init__(workers, timeout, memory_limit_mb, preload=[("math", ())])
        self.soft_timeout = timeout / 2  # the worker's own timer; the hard kill at `timeout` is the backstop
        self.inner_timeout = max(1, int(timeout // 3))  # Math-Verify's SIGALRM, in-process mode only

    def judge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        """Scores of ``(gold, candidate)`` pairs (or ``(gold, text, True)`` to let Math-Verify search free
        text): 1.0, 0.0, or None when the gold cannot be parsed."""
        if self.workers == 0:
            inner = self.inner_timeout if threading.current_thread() is threading.main_thread() else None
            return [judge(pair[0], pair[1], inner, bool(pair[2:] and pair[2])) for pair in pairs]
        return self.score("math", pairs)

    async def ajudge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        """:meth:`judge` for asyncio code: runs in a thread, so the event loop keeps going."""
        return await asyncio.to_thread(self.judge, pairs)


_DEFAULT: MathJudgePool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> MathJudgePool:
    """The process-wide pool the math rewards use unless given one (created on first use)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT._closed:
            _DEFAULT = MathJudgePool()
        return _DEFAULT
