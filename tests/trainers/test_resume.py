"""Save/resume is bit-identical for every option that keeps state between steps: a run killed right after its
step-2 checkpoint and resumed ends with the same weights and the same step-3 metrics as an uninterrupted run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.killing import dies_after_save
from tests.trainers.test_train import SMALL, records
from toolgym.errors import ConfigError
from toolgym.trainers.addons import AddonState
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.ppo import PPOConfig
from toolgym.trainers.ppo import train as train_ppo

OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    # a narrow band: the step-3 smoothing penalty depends on the entropies of steps 1 and 2
    "epo": ("grpo", dict(epo=True, epo_kappa_low=0.99, epo_kappa_high=1.01, epo_alpha=0.05, minibatches=2)),
    "replay_task_pool": ("grpo", dict(replay=True, task_pool=2, task_filter_refresh=1)),
    "task_pool": ("grpo", dict(task_pool=3, task_filter_refresh=2)),
    "hiper": ("grpo", dict(estimator="hiper")),
    "ppo": ("ppo", dict(kl_coef=0.05)),
    "ppo_addons": ("ppo", dict(critic="hiper", epo=True, replay=True, task_pool=2, epo_kappa_low=0.99)),
}


def run(algorithm: str, opts: dict[str, Any], out: Path, tokenizer: Any, seed: int = 0, **kw: Any) -> Any:
    model = tiny_model(len(tokenizer), seed=seed)
    if algorithm == "grpo":
        train_grpo(GRPOConfig(output_dir=str(out), **SMALL, **opts, **kw), model, tokenizer)
    else:
        train_ppo(PPOConfig(output_dir=str(out), **SMALL, **opts, **kw), model, tokenizer)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_resume_is_bit_identical(option: str, tmp_path: Path, tokenizer: Any, monkeypatch: Any) -> None:
    register_fake_env()
    algorithm, opts = OPTIONS[option]
    straight = run(algorithm, opts, tmp_path / "straight", tokenizer, steps=3)
    with dies_after_save(monkeypatch, step=2):
        run(algorithm, opts, tmp_path / "split", tokenizer, steps=3, save_every=1)
    # another initialisation: everything must come from the checkpoint
    resumed = run(algorithm, opts, tmp_path / "split", tokenizer, seed=123, steps=3, resume=True)
    a, b = records(tmp_path / "straight")[-1], records(tmp_path / "split")[-1]
    assert a["step"] == b["step"] == 3
    for k in a:
        if not k.startswith(("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s")):
            assert a[k] == b[k], k
    for (n, p1), p2 in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p1, p2), n


def test_a_checkpoint_without_the_seed_state_is_refused() -> None:
    cfg = GRPOConfig(epo=True, replay=True, task_pool=2)
    addons = AddonState(cfg)
    addons.band.update(1.5)  # type: ignore[union-attr]
    addons.selector.cursor = 3  # type: ignore[union-attr]
    again = AddonState(cfg)
    again.load_state_dict(addons.state_dict())
    assert list(again.band.history) == [1.5] and again.selector.cursor == 3  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="epo_history, replay, task_pool"):
        AddonState(cfg).load_state_dict(None)
