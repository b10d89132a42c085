"""A pool of math-judge worker processes with a hard per-answer timeout.

Math-Verify's own timeout is ``signal.alarm``: it raises outside the main thread (Math-Verify #50) and cannot
interrupt sympy stuck in C code. Here each answer runs in a worker process; the caller waits on a pipe with a
deadline and kills the worker when it passes, from any thread and from asyncio (``await pool.ajudge(...)``),
with no signals in the caller. A warm spare replaces a killed worker at once. After ``os.fork`` the child
starts its own workers. ``workers=0`` runs the judge in the calling process (the baseline; no hard timeout).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.optional import available, not_installed
from toolgym.rewards.counters import count
from toolgym.rewards.math_worker import judge

STARTUP_TIMEOUT_S = 120.0
CHUNK = 16  # answers sent to a worker at once; it streams a result back for each


class _Worker:
    def __init__(self, memory_limit_mb: int, soft_timeout: float) -> None:
        cmd = [sys.executable, "-m", "toolgym.rewards.math_worker", str(memory_limit_mb), str(soft_timeout)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.rx = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.ready = False
        self.started = time.monotonic()

    def kill(self) -> None:
        for conn in (self.tx, self.rx):
            with contextlib.suppress(OSError):
                conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.tx.send(None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1)
        self.kill()


class MathJudgePool:
    """Judge ``(gold, candidate)`` pairs in ``workers`` processes, each answer within ``timeout`` seconds.

    A pair that runs out of time scores 0.0 and counts ``math/timeouts``: the worker stops it itself at
    ``timeout / 2`` (an interval timer); code no signal can interrupt is killed at ``timeout`` and the worker
    replaced by a warm spare.
    """

    def __init__(self, workers: int | None = None, timeout: float = 5.0, memory_limit_mb: int = 2048) -> None:
        # found without importing (the import takes seconds, and the workers do their own): the check is
        # here so a missing package fails at construction, not as every judged answer's worker crash
        if not available("math_verify"):
            raise not_installed("math_verify", why="math rewards judge answers with it")
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive seconds, got {timeout}.")
        self.workers = min(2, os.cpu_count() or 1) if workers is None else workers
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.soft_timeout = timeout / 2  # the worker's own timer; the hard kill at `timeout` is the backstop
        self.inner_timeout = max(1, int(timeout // 3))  # Math-Verify's SIGALRM, in-process mode only
        self.timeouts = 0
        self.restarts = 0
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._spare: _Worker | None = None
        self._pid = os.getpid()
        self._closed = False
        atexit.register(self.close)

    # -- workers -----------------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's workers are not ours to use
                self._idle, self._all, self._spare, self._pid = queue.Queue(), [], None, os.getpid()
            if self._closed:
                raise InfrastructureError("this MathJudgePool was closed; create a new one.")
            while len(self._all) < self.workers:
                worker = _Worker(self.memory_limit_mb, self.soft_timeout)
                self._all.append(worker)
                self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self.restarts += 1
            fresh = self._spare or _Worker(self.memory_limit_mb, self.soft_timeout)
            self._spare = _Worker(self.memory_limit_mb, self.soft_timeout)
            if worker in self._all:
                self._all[self._all.index(worker)] = fresh
            self._idle.put(fresh)

    def close(self) -> None:
        """Stop every worker (also run at interpreter exit)."""
        with self._lock:
            if self._pid != os.getpid():
                return
            self._closed = True
            workers = [*self._all, *([self._spare] if self._spare else [])]
            self._all, self._spare = [], None
        for worker in workers:
            worker.stop()

    # -- judging -----------------------------------------------------------------------------------------
    def judge(self, pairs: Sequence[tuple[Any, ...]]) -> list[float | None]:
        """Scores of ``(gold, candidate)`` pairs (or ``(gold, text, True)`` to let Math-Verify search free
        text): 1.0, 0.0, or None when the gold cannot be parsed."""
        if self.workers == 0:
            inner = self.inner_timeout if threading.current_thread() is threading.main_thread() else None
            return [judge(pair[0], pair[1], inner, bool(pair[2:] and pair[2])) for pair in pairs]
        self._ensure_started()
        results: list[float | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))[::-1]
        # rx -> (worker, indices sent and not yet answered, deadline of the first of them)
        active: dict[Connection, tuple[_Worker, list[int], float]] = {}
        while pending or active:
            while pending:
                try:
                    worker = self._idle.get(block=not active, timeout=STARTUP_TIMEOUT_S)
                except queue.Empty:
                    if active:
                        break
                    raise InfrastructureError(
                        "no math judge worker came free; is the machine overloaded?"
                    ) from None
                size = max(1, min(CHUNK, -(-len(pending) // self.workers)))
                chunk = [pending.pop() for _ in range(min(size, len(pending)))]
                try:
                    worker.tx.send([pairs[i] for i in chunk])
                except (OSError, ValueError):
                    self._replace(worker)
                    pending.extend(reversed(chunk))
                    continue
                start = time.monotonic() if worker.ready else worker.started
                limit = self.timeout if worker.ready else STARTUP_TIMEOUT_S
                active[worker.rx] = (worker, chunk, start + limit)
            now = time.monotonic()
            next_deadline = min(d for _, _, d in active.values())
            for ready_obj in wait(list(active), timeout=max(0.0, next_deadline - now)):
                rx = ready_obj if isinstance(ready_obj, Connection) else None
                if rx is None or rx not in active:
                    continue
                worker, chunk, _ = active[rx]
                try:
                    message: Any = rx.recv()
                except (EOFError, OSError):
                    del active[rx]
                    self._replace(worker)
                    results[chunk[0]] = 0.0  # the worker died on this input (memory cap, crash)
                    pending.extend(reversed(chunk[1:]))
                    count("math/worker_crashes")
                    continue
                if message == "ready":
                    worker.ready = True
                    active[rx] = (worker, chunk, time.monotonic() + self.timeout)
                    continue
                index, rest = chunk[0], chunk[1:]
                if message == "memory":
                    del active[rx]
                    results[index] = 0.0
                    pending.extend(reversed(rest))
                    self._replace(worker)
                    continue
                if message == "timeout":
                    message = 0.0
                    self.timeouts += 1
                    count("math/timeouts")
                results[index] = message
                if rest:
                    active[rx] = (worker, rest, time.monotonic() + self.timeout)
                else:
                    del active[rx]
                    self._idle.put(worker)
            now = time.monotonic()
            for rx, (worker, chunk, deadline) in list(active.items()):
                if now >= deadline:
                    del active[rx]
                    if not worker.ready:
                        self._replace(worker)
                        raise InfrastructureError(
                            f"a math judge worker did not start within {STARTUP_TIMEOUT_S:.0f}s; "
                            "check that `python -m toolgym.rewards.math_worker` runs."
                        )
                    results[chunk[0]] = 0.0
                    pending.extend(reversed(chunk[1:]))
                    self.timeouts += 1
                    count("math/timeouts")
                    self._replace(worker)
        return results

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
