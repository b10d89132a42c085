"""Score untrusted answers in fresh worker processes, each answer under a hard time limit.

A third-party checker run on a model's answer can hang (``9**9**9**9``, sympy on a crafted expression, code
stuck in C that no signal interrupts), eat memory, or run the answer as code. :class:`ScoringPool` runs
named scorers (``toolgym.rewards.scoring_worker``: ``"math"``, ``"reasoning_gym"``, or
``"package.module:attribute"``) in worker processes started as fresh interpreters (``subprocess``: a fork
followed at once by an exec, so nothing of the caller's threads, locks or CUDA state is in a worker). The
caller waits on a pipe with a deadline and kills a worker that passes it, from any thread and from asyncio,
with no signals in the caller; a warm spare replaces a killed worker at once; after ``os.fork`` the child
starts its own workers.

Two kinds of failure, told apart:

- the checker ran out of its time budget on this answer (its own timer at ``timeout / 2``, or the hard
  kill at ``timeout``), hit the memory cap, or its worker died on this answer twice in a row: the answer
  scores 0.0 and ``<scorer>/timeouts`` (or ``/worker_crashes``) is counted. A checker that cannot decide
  in time is the answer's failure, as a wrong answer is; note that a machine so loaded that a worker gets
  no CPU for ``timeout`` seconds also scores 0 here.
- the worker could not be started, died or hung before it was ready or while it set up what does not
  depend on the answer (imports, a dataset), or no worker came free: :class:`InfrastructureError` (an env
  ends the episode as ``env_error``, not scored). A worker that dies once on an answer is replaced and the
  answer scored again on the fresh one, so a worker killed from outside costs no answer its score.

``workers=0`` runs the scorer in the calling process (no hard timeout, no memory cap).

One pool per process: :func:`shared_pool` is the pool every built-in scorer uses (the math rewards and
reasoning-gym's verifiers), created on first use, so a run that scores both holds one set of workers, not
one per scorer. Each scorer registers its setup (``preload``), which every worker started from then on does
before it takes answers. Its size, and that of a pool made with ``workers=None``, is ``TOOLGYM_SCORING_WORKERS``
(0: score in the calling process), else ``min(2, cpus)``. It is closed at interpreter exit; after ``os.fork``
the child starts its own workers, as any pool's does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.rewards.counters import count
from toolgym.rewards.scoring_worker import SCORERS, resolve

STARTUP_TIMEOUT_S = 120.0  # a worker's start, and a scorer's setup (imports, a dataset), on a loaded machine
CHUNK = 16  # answers sent to a worker at once; it streams a result back for each
MAX_PRELOAD = 32  # setups a new worker does before "ready" (the latest ones the pool was warmed with)
WORKER_MODULE = "toolgym.rewards.scoring_worker"
WORKERS_ENV = "TOOLGYM_SCORING_WORKERS"


def default_workers() -> int:
    """Workers of a pool made with ``workers=None``: ``TOOLGYM_SCORING_WORKERS``, else ``min(2, cpus)``."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    if not text:
        return min(2, os.cpu_count() or 1)
    try:
        workers = int(text)
    except ValueError:
        workers = -1
    if workers < 0:
        raise ConfigError(f"{WORKERS_ENV} must be a whole number >= 0 (0: score in-process), got {text!r}.")
    return workers


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # the worker sees the caller's modules (a "module:attribute" scorer), and needs no thread pools
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, "1")
    return env


class _Worker:
    def __init__(self, memory_limit_mb: int, preload: list[tuple[str, tuple[Any, ...]]]) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in kill)  the worker's stderr until it is ready: why it failed to start
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                env=_worker_env(),
            )
        except OSError as exc:
            self.log.close()
            raise InfrastructureError(f"could not start a scoring worker: {exc}") from exc
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.rx = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.ready = False
        self.started = time.monotonic()
        with contextlib.suppress(OSError):  # a worker dead already is seen at its first read
            self.tx.send({"memory_limit_mb": memory_limit_mb, "preload": preload})

    def why(self) -> str:
        """The end of what the worker wrote to stderr, and its exit status."""
        with contextlib.suppress(OSError, ValueError):
            self.log.seek(0, os.SEEK_END)
            self.log.seek(max(0, self.log.tell() - 1500))
            tail = self.log.read().decode("utf-8", "replace").strip()
            status = self.proc.poll()
            return f"exit status {status}; stderr: {tail[-1500:] or '(empty)'}"
        return "(no stderr)"

    def kill(self) -> None:
        for conn in (self.tx, self.rx):
            with contextlib.suppress(OSError):
                conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            self.log.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.tx.send(None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1)
        self.kill()


@dataclass
class _Job:
    """A chunk sent to a worker: the indices not answered yet, the deadline of the first of them, and
    whether that one is in its untimed setup."""

    worker: _Worker
    chunk: list[int]
    deadline: float
    setup: bool = False


def _label(scorer: str) -> str:
    """The counters' prefix: the scorer's short name, or "scoring"."""
    return scorer if scorer in SCORERS else "scoring"


class ScoringPool:
    """Score answers with a named scorer in ``workers`` processes, each answer within ``timeout`` seconds
    (see the module docstring). ``memory_limit_mb`` caps each worker's address space (0: no cap).
    ``preload``: ``(scorer, setup args)`` every worker prepares before it takes answers."""

    def __init__(
        self,
        workers: int | None = None,
        timeout: float = 5.0,
        memory_limit_mb: int = 2048,
        preload: Sequence[tuple[str, Sequence[Any]]] = (),
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive seconds, got {timeout}.")
        if workers is not None and workers < 0:
            raise ConfigError(f"workers must be >= 0, got {workers}.")
        self.workers = default_workers() if workers is None else workers
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.timeouts = 0
        self.restarts = 0
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._spare: _Worker | None = None
        self._preload: dict[bytes, tuple[str, tuple[Any, ...]]] = {}
        for name, setup in preload:
            self._remember(name, tuple(setup))
        self._pid = os.getpid()
        self._closed = False
        atexit.register(self.close)

    # -- workers -----------------------------------------------------------------------------------------
    def register(self, scorer: str, setup: Sequence[Any] = ()) -> None:
        """Have every worker started from now on prepare ``scorer`` for ``setup`` before "ready" (a worker
        already running prepares it at :meth:`warm`, or untimed before its first answer)."""
        with self._lock:
            self._remember(scorer, tuple(setup))

    def _remember(self, scorer: str, setup: tuple[Any, ...]) -> bool:
        """Add a setup for new workers to do before "ready"; whether it was new."""
        key = pickle.dumps((scorer, setup))
        if key in self._preload:
            return False
        self._preload[key] = (scorer, setup)
        while len(self._preload) > MAX_PRELOAD:
            del self._preload[next(iter(self._preload))]
        return True

    def _new_worker(self) -> _Worker:
        return _Worker(self.memory_limit_mb, list(self._preload.values()))

    def _ensure_started(self) -> None:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's workers are not ours to use
                self._idle, self._all, self._spare, self._pid = queue.Queue(), [], None, os.getpid()
            if self._closed:
                raise InfrastructureError(f"this {type(self).__name__} was closed; create a new one.")
            while len(self._all) < self.workers:
                worker = self._new_worker()
                self._all.append(worker)
                self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self.restarts += 1
            if self._closed or self._pid != os.getpid():
                return
            fresh = self._spare or self._new_worker()
            self._spare = self._new_worker()
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

    def _await(self, worker: _Worker, expect: str, what: str) -> None:
        """Read one frame from an idle worker: ``expect``, or InfrastructureError (the worker replaced)."""
        start = worker.started if expect == "ready" else time.monotonic()
        left = start + STARTUP_TIMEOUT_S - time.monotonic()
        try:
            message: Any = worker.rx.recv() if worker.rx.poll(max(0.0, left)) else "silent"
        except (EOFError, OSError):
            message = "died"
        if message == expect:
            return
        detail = message[1] if isinstance(message, tuple) and len(message) == 2 else worker.why()
        self._replace(worker)
        verb = "did not answer in time" if message == "silent" else "failed"
        raise InfrastructureError(f"a scoring worker {verb} while {what}: {detail}")

    def warm(self, scorer: str, setup: Sequence[Any] = ()) -> None:
        """Start the workers and wait until the idle ones are ready and have prepared ``scorer`` for
        ``setup`` (e.g. a dataset: the first answer then pays no setup); new workers prepare it too."""
        if self.workers == 0:
            resolve(scorer)
            return
        setup = tuple(setup)
        with self._lock:
            new = self._remember(scorer, setup)
        self._ensure_started()
        if not new and all(worker.ready for worker in self._all):
            return  # (a reset calls this for every episode)
        taken: list[_Worker] = []
        with contextlib.suppress(queue.Empty):
            while True:
                taken.append(self._idle.get_nowait())
        try:
            while taken:
                worker = taken.pop()
                try:
                    if not worker.ready:
                        self._await(worker, "ready", "starting")  # (replaces the worker when it raises)
                        worker.ready = True
                    if new:  # a worker started before this setup was remembered has not done it
                        worker.tx.send(("prepare", scorer, setup))
                        self._await(worker, "prepared", f"preparing {scorer!r}")
                except (OSError, ValueError) as exc:
                    self._replace(worker)
                    raise InfrastructureError(f"could not reach a scoring worker: {exc}") from exc
                self._idle.put(worker)
        finally:
            for worker in taken:  # not reached: still good
                self._idle.put(worker)

    # -- scoring -----------------------------------------------------------------------------------------
    def score(
        self, scorer: str, items: Sequence[Sequence[Any]], timeout: float | None = None
    ) -> list[float | None]:
        """The scores of ``items`` (each the scorer's arguments) by ``scorer``, in order: 0.0 for an answer
        whose checker ran out of time, memory or crashed its worker twice (module docstring).
        ``timeout`` overrides the pool's for this call. Raises InfrastructureError for a worker fault."""
        timeout = self.timeout if timeout is None else timeout
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive seconds, got {timeout}.")
        if self.workers == 0:
            return self._score_inline(scorer, items)
        self._ensure_started()
        label = _label(scorer)
        results: list[float | None] = [None] * len(items)
        pending = list(range(len(items)))[::-1]
        crashed: set[int] = set()  # answers whose worker died once: a second death scores them 0
        active: dict[Connection, _Job] = {}
        try:
            while pending or active:
                while pending:
                    try:
                        worker = self._idle.get(block=not active, timeout=STARTUP_TIMEOUT_S)
                    except queue.Empty:
                        if active:
                            break
                        raise InfrastructureError(
                            "no scoring worker came free; is the machine overloaded?"
                        ) from None
                    size = max(1, min(CHUNK, -(-len(pending) // self.workers)))
                    chunk = [pending.pop() for _ in range(min(size, len(pending)))]
                    try:
                        payload = pickle.dumps(
                            ("score", scorer, timeout / 2, [tuple(items[i]) for i in chunk])
                        )
                    except Exception as exc:
                        self._idle.put(worker)
                        raise InfrastructureError(
                            f"an answer to score could not be pickled: {exc!r}"
                        ) from exc
                    try:
                        worker.tx.send_bytes(payload)
                    except (OSError, ValueError):
                        self._replace(worker)
                        pending.extend(reversed(chunk))
                        continue
                    deadline = (
                        (time.monotonic() + timeout) if worker.ready else worker.started + STARTUP_TIMEOUT_S
                    )
                    active[worker.rx] = _Job(worker, chunk, deadline)
                next_deadline = min(job.deadline for job in active.values())
                for ready_obj in wait(list(active), timeout=max(0.0, next_deadline - time.monotonic())):
                    rx = ready_obj if isinstance(ready_obj, Connection) else None
                    if rx is None or rx not in active:
                        continue
                    job = active[rx]
                    try:
                        message: Any = rx.recv()
                    except (EOFError, OSError):
                        del active[rx]
                        self._on_death(job, label, pending, results, crashed)
                        continue
                    if not self._on_message(job, message, label, results, pending, timeout):
                        del active[rx]
                now = time.monotonic()
                for rx, job in list(active.items()):
                    if now < job.deadline:
                        continue
                    del active[rx]
                    self._replace(job.worker)
                    if not job.worker.ready:
                        raise InfrastructureError(
                            f"a scoring worker did not start within {STARTUP_TIMEOUT_S:.0f}s; check that "
                            f"`python -m {WORKER_MODULE}` runs ({job.worker.why()})."
                        )
                    if job.setup:
                        raise InfrastructureError(
                            f"a {scorer!r} scorer's setup took over {STARTUP_TIMEOUT_S:.0f}s in its worker."
                        )
                    results[job.chunk[0]] = 0.0  # the checker ran out of its time on this answer
                    pending.extend(reversed(job.chunk[1:]))
                    self.timeouts += 1
                    count(f"{label}/timeouts")
        finally:
            for job in active.values():  # abandoned mid-chunk by an error: their frames are stale
                self._replace(job.worker)
        return results

    def _on_death(
        self, job: _Job, label: str, pending: list[int], results: list[float | None], crashed: set[int]
    ) -> None:
        """A worker's pipe closed while it had ``job``: an infrastructure fault, unless it died on an answer
        (twice: the first time it is scored again on a fresh worker)."""
        why = job.worker.why()
        self._replace(job.worker)
        if not job.worker.ready:
            raise InfrastructureError(f"a scoring worker died while starting ({why}).")
        if job.setup:
            raise InfrastructureError(f"a scoring worker died while setting up its scorer ({why}).")
        index, rest = job.chunk[0], job.chunk[1:]
        count(f"{label}/worker_crashes")
        pending.extend(reversed(rest))
        if index in crashed:
            results[index] = 0.0  # it died on this answer twice: the answer's doing (a crash, a segfault)
        else:
            crashed.add(index)
            pending.append(index)  # next out: scored again on a fresh worker

    def _on_message(
        self,
        job: _Job,
        message: Any,
        label: str,
        results: list[float | None],
        pending: list[int],
        timeout: float,
    ) -> bool:
        """Handle one frame of ``job``'s worker; False when the job is over (its worker idle or replaced)."""
        now = time.monotonic()
        if message == "ready":
            job.worker.ready = True
            job.deadline = now + timeout
            return True
        if message == "setup":  # untimed: imports or a dataset, the same for every answer
            job.setup, job.deadline = True, now + STARTUP_TIMEOUT_S
            return True
        if message == "go":
            job.setup, job.deadline = False, now + timeout
            return True
        if isinstance(message, tuple) and message[:1] == ("setup_error",):
            raise InfrastructureError(f"a {label!r} scorer could not be set up in its worker: {message[1]}")
        index = job.chunk.pop(0)
        if message == "memory":  # over the memory cap on this answer: it scores 0, and the worker exits
            results[index] = 0.0
            pending.extend(reversed(job.chunk))
            self._replace(job.worker)
            return False
        if message == "timeout":  # the worker's own timer stopped the checker
            message = 0.0
            self.timeouts += 1
            count(f"{label}/timeouts")
        results[index] = message
        if job.chunk:
            job.deadline = now + timeout
            return True
        self._idle.put(job.worker)
        return False

    def _score_inline(self, scorer: str, items: Sequence[Sequence[Any]]) -> list[float | None]:
        found = resolve(scorer)
        out: list[float | None] = []
        for args in items:
            args = tuple(args)
            if found.prepare is not None:
                found.prepare(*args)
            try:
                out.append(found.score(*args))
            except Exception:
                out.append(0.0)
        return out

    async def ascore(
        self, scorer: str, items: Sequence[Sequence[Any]], timeout: float | None = None
    ) -> list[float | None]:
        """:meth:`score` for asyncio code: runs in a thread, so the event loop keeps going."""
        return await asyncio.to_thread(self.score, scorer, items, timeout)


_SHARED: ScoringPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool(preload: Sequence[tuple[str, Sequence[Any]]] = ()) -> ScoringPool:
    """The process's one pool (module docstring), made on first use (or anew after :meth:`ScoringPool.close`),
    with ``preload``'s ``(scorer, setup args)`` registered. Scorers pass their own ``timeout`` per call."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED._closed:
            _SHARED = ScoringPool()
        pool = _SHARED
    for scorer, setup in preload:
        pool.register(scorer, setup)
    return pool


def close_shared_pool() -> None:
    """Stop the shared pool's workers now (interpreter exit does it too); the next use makes a new pool."""
    global _SHARED
    with _SHARED_LOCK:
        pool, _SHARED = _SHARED, None
    if pool is not None:
        pool.close()


def _after_fork_in_child() -> None:
    # a thread of the parent may have held these locks at the fork; it does not exist in the child
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    if _SHARED is not None:
        _SHARED._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
