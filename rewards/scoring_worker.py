"""The worker process of :class:`~toolgym.rewards.scoring_pool.ScoringPool`: it runs named scorers on
untrusted answers (``python -m toolgym.rewards.scoring_worker``).

A scorer is a :class:`Scorer` found by name: ``"math"`` (Math-Verify's equivalence), ``"reasoning_gym"``
(a reasoning-gym dataset's ``score_answer``), or ``"package.module:attribute"``. Its ``prepare`` does the
work that does not depend on the answer (imports, building a dataset) once per worker and setup key; its
``score`` is the part that sees the answer and runs under the time limit.

The worker speaks pickled frames (``multiprocessing.connection``) on stdin/stdout. From the pool: first an
init dict (``memory_limit_mb``, ``preload``: ``(scorer, setup args)`` to prepare before ``"ready"``), then
``("score", scorer, soft_timeout, [args, ...])`` (a chunk: one result frame per answer, in order),
``("prepare", scorer, setup args)`` (answered ``"prepared"``), or ``None`` to stop. To the pool:
``"ready"``; per answer, ``"setup"`` … ``"go"`` around an untimed first-use setup (``("setup_error", text)``
if it fails), then the score, ``"timeout"`` (the worker's own interval timer stopped it) or ``"memory"``
(then the worker exits: a fresh heap is safer than a fragmented one). Anything a library prints goes to
stderr, never into the protocol. The worker caps its own address space; the pool's hard kill is for code
that no signal can interrupt.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

# the scorers known by a short name; any other name is "package.module:attribute"
SCORERS = {
    "math": "toolgym.rewards.math_worker:MATH",
    "reasoning_gym": "toolgym.envs.reasoning_gym.verify:SCORER",
}


def _no_key(*args: Any) -> Hashable:
    return None


@dataclass(frozen=True)
class Scorer:
    """``score(*args)`` runs on an answer under the time limit and returns its score (a float, or None for
    "not scorable", e.g. a gold that does not parse); an exception scores 0.0. ``prepare(*setup)`` runs
    first, untimed, once per worker and ``prepare_key(*args)``: ``setup`` is a prefix of ``args`` (all of
    it, or what :meth:`ScoringPool.warm` was given), so it must accept both."""

    score: Callable[..., float | None]
    prepare: Callable[..., None] | None = None
    prepare_key: Callable[..., Hashable] = _no_key


def resolve(name: str) -> Scorer:
    """The :class:`Scorer` called ``name`` (imports its module). A plain function is a scorer with no
    setup."""
    spec = SCORERS.get(name, name)
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"unknown scorer {name!r}: use one of {sorted(SCORERS)} or 'package.module:attribute'"
        )
    found = getattr(importlib.import_module(module), attr)
    if isinstance(found, Scorer):
        return found
    if callable(found):
        return Scorer(score=found)
    raise TypeError(f"scorer {name!r} is {type(found).__name__}, not a Scorer or a function")


class _SoftTimeout(BaseException):
    """Raised by the worker's own interval timer; a BaseException, so no ``except Exception`` swallows it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftTimeout


class _Worker:
    """A worker's scorers and the setups already done in it."""

    def __init__(self) -> None:
        self.scorers: dict[str, Scorer] = {}
        self.prepared: set[tuple[str, Hashable]] = set()

    def pending_setup(self, name: str, args: tuple[Any, ...]) -> bool:
        scorer = self.scorers.get(name)
        return scorer is None or (name, scorer.prepare_key(*args)) not in self.prepared

    def prepare(self, name: str, args: tuple[Any, ...]) -> None:
        if name not in self.scorers:
            self.scorers[name] = resolve(name)
        scorer = self.scorers[name]
        key = (name, scorer.prepare_key(*args))
        if key not in self.prepared:
            if scorer.prepare is not None:
                scorer.prepare(*args)
            self.prepared.add(key)

    def score(self, name: str, args: tuple[Any, ...], soft_timeout: float) -> float | str | None:
        try:
            signal.setitimer(signal.ITIMER_REAL, soft_timeout)
            return self.scorers[name].score(*args)
        except _SoftTimeout:
            return "timeout"
        except MemoryError:
            return "memory"
        except (Exception, SystemExit):  # a checker that chokes on the answer: the answer scores 0
            return 0.0
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _error_text() -> str:
    return "".join(traceback.format_exc(limit=6))[-2000:]


def serve() -> None:
    """The worker's main loop (stdin: the pool's frames; stdout: the replies)."""
    from multiprocessing.connection import Connection

    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the trainer's terminal is the trainer's
    reader = Connection(0, writable=False)
    writer = Connection(out_fd, readable=False)
    try:
        init = reader.recv()
    except EOFError:
        return
    limit_mb = int(init.get("memory_limit_mb", 0))
    if limit_mb > 0:
        import resource

        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    worker = _Worker()
    for name, setup in init.get("preload", ()):
        worker.prepare(name, tuple(setup))  # a failure here ends the worker: its stderr says why
    signal.signal(signal.SIGALRM, _on_alarm)  # one timer for the whole answer, sub-second if asked
    writer.send("ready")
    # startup errors are read from stderr (a file the pool keeps); a checker's chatter after this is not
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    while True:
        try:
            message = reader.recv()
        except EOFError:
            return
        except (
            Exception
        ):  # an item this process cannot unpickle (a class only the caller has): not the answer's
            writer.send(("setup_error", "could not read the items: " + _error_text()))
            continue
        if message is None:
            return
        if message[0] == "prepare":
            _, name, setup = message
            try:
                worker.prepare(name, tuple(setup))
                writer.send("prepared")
            except Exception:
                writer.send(("setup_error", _error_text()))
            continue
        _, name, soft_timeout, chunk = message
        for args in chunk:  # a chunk of answers: one result frame each, in order
            args = tuple(args)
            if worker.pending_setup(name, args):
                writer.send("setup")  # the pool's clock for this answer starts at "go"
                try:
                    worker.prepare(name, args)
                except Exception:
                    writer.send(("setup_error", _error_text()))
                    continue
                writer.send("go")
            result = worker.score(name, args, soft_timeout)
            writer.send(result)
            if result == "memory":
                return


if __name__ == "__main__":
    # the module's own copy, not __main__'s: scorers' modules import Scorer from it
    from toolgym.rewards.scoring_worker import serve as _serve

    _serve()
