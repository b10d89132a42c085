"""ScoringPool: scoring from a busy multi-threaded process (where a fork of the caller can deadlock), a
killed worker replaced, and "the checker ran out of time on this answer" (0.0) told apart from "no worker
could run it" (InfrastructureError). The math pool on top of it: tests/rewards/test_rewards_math.py."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rewards import scoring_helpers
from tests.rewards.scoring_helpers import busy_threads
from toolgym.errors import InfrastructureError
from toolgym.rewards import counters, reset_counters, scoring_pool
from toolgym.rewards.math_pool import MathJudgePool
from toolgym.rewards.scoring_pool import ScoringPool

H = "tests.rewards.scoring_helpers:"


@pytest.fixture
def pool() -> Iterator[ScoringPool]:
    p = ScoringPool(workers=1, timeout=2.0)
    yield p
    p.close()


def test_scores_from_a_process_with_busy_threads(pool: ScoringPool, monkeypatch: pytest.MonkeyPatch) -> None:
    with busy_threads():
        # the premise: a fork of this process inherits the lock held, and the child's checker never gets it
        pid = os.fork()
        if pid == 0:
            os._exit(0 if scoring_helpers.LOCK.acquire(timeout=1.0) else 1)
        assert os.waitpid(pid, 0)[1] >> 8 == 1
        monkeypatch.setattr(os, "fork", lambda: pytest.fail("the pool forked the caller"))
        start = time.monotonic()
        assert pool.score(H + "locked", [(1.0,), (0.5,), (0.0,)]) == [1.0, 0.5, 0.0]
        pool.warm(H + "locked")
        t0 = time.monotonic()
        assert pool.score(H + "locked", [(1.0,)]) == [1.0]
        assert time.monotonic() - t0 < 1.0  # a warm worker: no start, no fork
    assert pool.timeouts == 0 and pool.restarts == 0 and time.monotonic() - start < 60


def test_a_killed_worker_is_replaced_and_the_next_answer_scores(pool: ScoringPool) -> None:
    assert pool.score(H + "echo", [(1.0,)]) == [1.0]
    victim = pool._all[0]
    os.kill(victim.proc.pid, signal.SIGKILL)  # killed from outside, not by an answer
    victim.proc.wait(5)
    assert pool.score(H + "echo", [(1.0,), (0.5,)]) == [1.0, 0.5]
    assert pool._all[0] is not victim and pool.restarts == 1 and pool.timeouts == 0


def test_a_worker_that_dies_once_on_an_answer_scores_it_on_a_fresh_one(
    pool: ScoringPool, tmp_path: Path
) -> None:
    reset_counters()
    assert pool.score(H + "die_once", [(1.0, str(tmp_path / "m"))]) == [1.0]
    assert pool.restarts == 1 and counters()["scoring/worker_crashes"] == 1
    assert pool.score(H + "die", [(1.0,)]) + pool.score(H + "echo", [(0.5,)]) == [
        0.0,
        0.5,
    ]  # twice: the answer's


def test_the_checker_running_out_of_time_scores_zero(pool: ScoringPool) -> None:
    reset_counters()
    t0 = time.monotonic()
    assert pool.score(H + "sleep", [(1.0, 30.0), (0.5, 0.0)]) == [0.0, 0.5]  # its own timer, at 1 s
    assert pool.timeouts == 1 and pool.restarts == 0
    assert pool.score(H + "freeze", [(1.0,)]) == [0.0]  # the hard kill, at 2 s
    assert pool.score(H + "echo", [(0.5,)]) == [0.5]  # on the warm spare
    assert pool.timeouts == 2 and pool.restarts == 1 and counters()["scoring/timeouts"] == 2
    assert time.monotonic() - t0 < 20
    assert pool.score(H + "sleep", [(1.0, 0.0)], timeout=0.5) == [1.0]  # a per-call limit


def test_a_worker_that_cannot_start_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scoring_pool, "WORKER_MODULE", "toolgym.no_such_worker")
    pool = ScoringPool(workers=1, timeout=2.0)
    try:
        with pytest.raises(InfrastructureError, match="No module named"):
            pool.score(H + "echo", [(1.0,)])
        with pytest.raises(InfrastructureError):
            pool.warm(H + "echo")
    finally:
        pool.close()
    math = MathJudgePool(workers=1)  # it scored every answer 0.0 here before
    try:
        with pytest.raises(InfrastructureError, match="No module named"):
            math.judge([("1", "1")])
    finally:
        math.close()


def test_a_scorer_that_cannot_be_set_up_is_an_infrastructure_error(
    pool: ScoringPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InfrastructureError, match="the dataset is not there"):
        pool.score(H + "BROKEN_SETUP", [(1.0,)])
    with pytest.raises(InfrastructureError, match="unknown scorer"):
        pool.score("no_such_scorer", [(1.0,)])
    only_here = types.ModuleType("only_in_the_caller")  # a module the workers cannot import
    only_here.Thing = type("Thing", (), {"__module__": "only_in_the_caller"})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "only_in_the_caller", only_here)
    with pytest.raises(InfrastructureError, match="could not read the items"):
        pool.score(H + "echo", [(only_here.Thing(),)])  # type: ignore[attr-defined]
    assert pool.score(H + "echo", [(0.5,)]) == [0.5]  # the pool goes on
    assert pool.timeouts == 0


def test_many_threads_share_one_pool() -> None:
    pool = ScoringPool(workers=2, timeout=3.0)
    out: dict[int, list[float | None]] = {}
    items = [(float(i) / 10,) for i in range(10)]
    try:
        threads = [
            threading.Thread(target=lambda k=k: out.__setitem__(k, pool.score(H + "echo", items)))
            for k in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert out == {k: [x for (x,) in items] for k in range(4)}
    finally:
        pool.close()


def test_in_process_mode() -> None:
    assert ScoringPool(workers=0).score(H + "echo", [(0.5,), ("x",)]) == [0.5, 0.0]
