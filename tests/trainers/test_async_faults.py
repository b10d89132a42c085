"""Review: an asynchronous run that fails (the learner raising, the worker raising) ends with the error and
leaves no rollout worker running and no env open."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from tests.testing_env import VowelCountEnv
from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL
from toolgym.trainers import grpo, rollout
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo

BROKEN_ENV = "tests/BrokenReset-v0"
OPEN: set[int] = set()  # ids of the envs made and not closed


class CountedEnv(VowelCountEnv):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        OPEN.add(id(self))

    def close(self) -> None:
        OPEN.discard(id(self))
        super().close()


class BrokenResetEnv(CountedEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None and seed % 2:
            raise OSError("the sandbox went away")
        return super().reset(seed=seed, options=options)


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()
    for name, cls in (("tests/Counted-v0", CountedEnv), (BROKEN_ENV, BrokenResetEnv)):
        if name not in gym.registry:
            gym.register(name, entry_point=cls, disable_env_checker=True)
    OPEN.clear()


def _no_worker_left() -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name == "async-rollout"]:
            return True
        time.sleep(0.1)
    return False


def test_the_learner_raising_stops_the_worker_and_closes_the_envs(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = grpo.optimize

    def optimize(cfg: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        if step == 2:
            raise KeyboardInterrupt  # (the learner failing, or the user's Ctrl-C)
        return real(cfg, step, *args, **kwargs)

    monkeypatch.setattr(grpo, "optimize", optimize)
    closed: list[Any] = []
    real_close = rollout.TreeRollout.close
    monkeypatch.setattr(rollout.TreeRollout, "close", lambda self: (closed.append(self), real_close(self)))
    opts = dict(SMALL, env_ids=["tests/Counted-v0"], max_staleness=2, steps=6, output_dir=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        train_grpo(GRPOConfig(**opts), tiny_model(len(tokenizer)), tokenizer)
    assert _no_worker_left(), "the rollout worker outlived the failed run"
    assert closed and not OPEN, f"{len(OPEN)} envs left open"


def test_the_worker_raising_is_the_learner_error_and_closes_the_envs(tmp_path: Path, tokenizer: Any) -> None:
    opts = dict(SMALL, env_ids=[BROKEN_ENV], max_staleness=1, steps=3, output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="the sandbox went away"):
        train_grpo(GRPOConfig(**opts), tiny_model(len(tokenizer)), tokenizer)
    assert _no_worker_left()
    assert not OPEN, f"{len(OPEN)} envs left open"


def test_ppo_closes_its_envs_when_the_learner_raises(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.trainers import ppo

    def explained_variance(*args: Any) -> float:
        raise KeyboardInterrupt

    monkeypatch.setattr(ppo, "explained_variance", explained_variance)
    opts = dict(SMALL, env_ids=["tests/Counted-v0"], steps=2, output_dir=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        ppo.train(ppo.PPOConfig(**opts), tiny_model(len(tokenizer)), tokenizer)
    assert not OPEN, f"{len(OPEN)} envs left open"
