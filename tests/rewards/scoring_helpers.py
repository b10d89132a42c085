"""Scorers for tests/rewards/test_scoring_pool.py, run in the pool's worker processes
(``"tests.rewards.scoring_helpers:NAME"``; the workers see the caller's ``sys.path``)."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from toolgym.rewards.scoring_worker import Scorer

# held by a thread of the test process: a fork of it would inherit the lock held, a fresh worker does not
LOCK = threading.Lock()


def locked(x: float) -> float:
    with LOCK:
        return float(x)


def echo(x: float) -> float:
    return float(x)


def sleep(x: float, seconds: float) -> float:
    time.sleep(seconds)  # interruptible: the worker's own timer stops it
    return float(x)


def freeze(x: float) -> float:
    os.kill(os.getpid(), signal.SIGSTOP)  # stuck where no signal handler runs: only the hard kill helps
    return float(x)


def die(x: float) -> float:
    os._exit(3)  # a checker that crashes its process on this answer, every time


def die_once(x: float, marker: str) -> float:
    """Dies the first time (as a worker killed from outside would), scores the second."""
    path = Path(marker)
    if not path.exists():
        path.write_text("died")
        os._exit(3)
    return float(x)


def _broken_setup(*args: object) -> None:
    raise RuntimeError("the dataset is not there")


BROKEN_SETUP = Scorer(score=echo, prepare=_broken_setup)


@contextlib.contextmanager
def busy_threads() -> Iterator[None]:
    """What a trainer has running while it scores: a thread holding a lock, one importing in a loop, one
    computing."""
    stop = threading.Event()
    held = threading.Event()

    def hold() -> None:
        with LOCK:
            held.set()
            stop.wait()

    def imports() -> None:
        import colorsys

        while not stop.is_set():
            importlib.reload(colorsys)  # holds colorsys's import lock, over and over

    def compute() -> None:
        while not stop.is_set():
            sum(i * i for i in range(10_000))

    threads = [threading.Thread(target=f, daemon=True) for f in (hold, imports, compute)]
    for t in threads:
        t.start()
    held.wait(5)
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(5)
