"""One scoring pool per process (rewards/scoring_pool.py ``shared_pool``): the math rewards and reasoning-gym's
verifiers score in the same workers (was: one pool each, two sets of worker processes), each worker preloads
what each scorer registered, ``TOOLGYM_SCORING_WORKERS`` sizes it (reasoning-gym's was fixed at 2), and a hung
checker still scores 0 at the hard timeout while the pool goes on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from toolgym.errors import ConfigError
from toolgym.rewards import scoring_pool
from toolgym.rewards.scoring_pool import ScoringPool, close_shared_pool, shared_pool

H = "tests.rewards.scoring_helpers:"


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ScoringPool]]:
    """A new shared pool for each test (closed after it); the pools made meanwhile."""
    close_shared_pool()
    made: list[ScoringPool] = []

    class Counted(ScoringPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(scoring_pool, "ScoringPool", Counted)
    monkeypatch.setenv(scoring_pool.WORKERS_ENV, "1")
    yield made
    close_shared_pool()


def test_math_and_reasoning_gym_score_in_one_pool(fresh: list[ScoringPool]) -> None:
    pytest.importorskip("math_verify")
    pytest.importorskip("reasoning_gym")
    import gymnasium as gym

    import toolgym  # noqa: F401  (registers the ids)
    from toolgym.envs.base import tool_env
    from toolgym.envs.reasoning_gym import verify
    from toolgym.rewards.math_pool import default_pool

    judge = default_pool()
    assert judge.judge([("1/2", "0.5"), ("2", "3")]) == [1.0, 0.0]
    env = gym.make("toolgym/ReasoningGym-chain_sum-v0")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(tool_env(env).expert_action())
    env.close()
    assert terminated and reward > 0 and info.get("truncation") is None
    assert verify.pool() is judge.pool is shared_pool() and len(fresh) == 1
    pool = fresh[0]
    assert len(pool._all) == 1  # one set of workers (the size knob), both scorers in it
    assert {"math", "reasoning_gym"} <= {name for name, _ in pool._preload.values()}
    assert judge.judge([("3", "3")]) == [1.0]  # a math answer on the worker reasoning-gym used


def test_the_size_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(scoring_pool.WORKERS_ENV, "3")
    assert shared_pool().workers == 3
    assert ScoringPool().workers == 3  # any pool made without a size
    close_shared_pool()
    monkeypatch.setenv(scoring_pool.WORKERS_ENV, "0")  # in-process: no worker at all
    assert shared_pool().score(H + "echo", [(0.5,)]) == [0.5] and not shared_pool()._all
    close_shared_pool()
    monkeypatch.delenv(scoring_pool.WORKERS_ENV)
    assert shared_pool().workers == min(2, os.cpu_count() or 1)  # the default, as before
    close_shared_pool()
    for bad in ("-1", "two"):
        monkeypatch.setenv(scoring_pool.WORKERS_ENV, bad)
        with pytest.raises(ConfigError, match=scoring_pool.WORKERS_ENV):
            shared_pool()


def test_a_hung_checker_times_out_and_the_shared_pool_recovers() -> None:
    pool = shared_pool()
    assert pool.score(H + "echo", [(1.0,)]) == [1.0]
    assert pool.score(H + "freeze", [(1.0,)], timeout=2.0) == [0.0]  # stuck in C: the hard kill
    assert pool.timeouts == 1 and pool.restarts == 1
    assert pool.score(H + "echo", [(0.5,)]) == [0.5]  # on the warm spare
    assert shared_pool() is pool


def test_a_closed_shared_pool_is_made_anew(fresh: list[ScoringPool]) -> None:
    first = shared_pool()
    first.close()  # (as at exit, or by a caller)
    assert shared_pool() is not first and shared_pool().score(H + "echo", [(0.25,)]) == [0.25]
    assert len(fresh) == 2


def test_a_forked_child_starts_its_own_workers() -> None:
    pool = shared_pool()
    assert pool.score(H + "echo", [(1.0,)]) == [1.0]
    parents = {w.proc.pid for w in pool._all}
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers are not its own
        ok = False
        try:
            child = shared_pool()
            ok = child.score(H + "echo", [(0.5,)]) == [0.5] and not parents & {w.proc.pid for w in child._all}
            child.close()
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] >> 8 == 0
    assert pool.score(H + "echo", [(0.75,)]) == [0.75] and {w.proc.pid for w in pool._all} == parents
