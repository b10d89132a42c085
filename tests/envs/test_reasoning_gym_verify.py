"""reasoning-gym's verifiers run in the workers of a ScoringPool (envs/reasoning_gym/verify.py), not in a fork
of the trainer: a correct answer scores from a trainer with busy threads (a fork of it could deadlock on a lock
one of them held, and the answer "timed out" to 0), a killed worker costs no answer its score, a worker that
cannot run is an env_error (not a 0), and the dataset a worker rebuilds is the env's (config, size). The
attacks on the verifiers (code in answers, hangs): tests/envs/test_redteam_actions.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

import toolgym  # noqa: F401  (registers the ids)
from tests.rewards.scoring_helpers import busy_threads
from toolgym.envs.base import tool_env
from toolgym.errors import InfrastructureError
from toolgym.rewards import scoring_pool

pytest.importorskip("reasoning_gym")

from toolgym.envs.reasoning_gym import verify


def _expert_step(env: Any, seed: int = 0) -> dict[str, Any]:
    env.reset(seed=seed)
    _, reward, terminated, _, info = env.step(tool_env(env).expert_action())
    assert info.get("truncation") is None, info.get("infra_error")
    assert terminated and info["success"], reward
    return info


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's shared scoring pool (the verifiers') made anew for this test (and closed after it)."""
    scoring_pool.close_shared_pool()
    yield
    scoring_pool.close_shared_pool()


@pytest.mark.parametrize("task", ["chain_sum", "puzzle24"])
def test_correct_answers_score_from_a_trainer_with_busy_threads(
    task: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gym.make(f"toolgym/ReasoningGym-{task}-v0")
    with busy_threads():
        monkeypatch.setattr(os, "fork", lambda: pytest.fail("the verifier forked the trainer"))
        for seed in range(3):
            _expert_step(env, seed)
    env.close()


def test_a_killed_verifier_worker_costs_no_answer_its_score() -> None:
    env = gym.make("toolgym/ReasoningGym-chain_sum-v0")
    _expert_step(env)
    pool = verify.pool()
    restarts = pool.restarts
    for worker in list(pool._all):
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(5)
    for seed in range(3):
        _expert_step(env, seed)
    assert pool.restarts > restarts and pool.timeouts == 0
    env.close()


def test_a_verifier_worker_that_cannot_start_is_an_env_error(
    fresh_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gym.make("toolgym/ReasoningGym-chain_sum-v0")
    monkeypatch.setattr(scoring_pool, "WORKER_MODULE", "toolgym.no_such_worker")
    with pytest.raises(InfrastructureError):  # the reset warms the workers
        env.reset(seed=0)
    monkeypatch.setattr(verify, "warm", lambda *args: None)  # as if they had started, and died since
    scoring_pool.close_shared_pool()
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(tool_env(env).expert_action())
    assert truncated and not terminated and info["truncation"] == "env_error" and reward == 0.0
    assert "No module named" in info["infra_error"]
    env.close()


def test_the_worker_rebuilds_the_envs_dataset(fresh_pool: None) -> None:
    config = {"min_terms": 5, "max_terms": 5, "min_digits": 3, "max_digits": 3}
    env = gym.make("toolgym/ReasoningGym-v0", task="chain_sum", config=config, size=50)
    for seed in range(3):
        _expert_step(env, seed)
        assert tool_env(env).task.data["entry"]["metadata"]["num_terms"] == 5
    env.reset(seed=0)
    _, reward, _, _, info = env.step("<answer>-1</answer>")
    assert reward == 0.0 and info.get("truncation") is None
    env.close()
