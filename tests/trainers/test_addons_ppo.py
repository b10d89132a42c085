"""The add-ons in the PPO loop: replay + task selection, EPO and HiPER (critic=hiper), each a
two-step CPU run with the tiny model; the config checks of the PPO side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.errors import ConfigError
from toolgym.trainers.ppo import PPOConfig
from toolgym.trainers.ppo import train as train_ppo


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()


def test_ppo_config_has_the_seed_fields_and_warns_inert_ones() -> None:
    cfg = PPOConfig(replay=True, task_pool=4, epo=True, critic="hiper")
    assert cfg.replay and cfg.epo and cfg.hiper_on()
    msgs = PPOConfig(hiper_lam_seg=0.5, epo_alpha=0.1).inert_options()
    assert any("hiper_lam_seg" in m and "inert" in m for m in msgs)
    assert any("epo_alpha" in m for m in msgs)
    # PPO's HAE uses the PPO discount `gamma`: hiper_gamma does nothing there
    assert any("hiper_gamma" in m for m in PPOConfig(critic="hiper", hiper_gamma=0.9).inert_options())
    with pytest.raises(ConfigError):
        PPOConfig(critic="hiper", hiper_lam_seg=1.5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "opts, keys",
    [
        (
            {"replay": True, "task_pool": 3, "task_filter_refresh": 1},
            ("rollout/replay_buffer_size", "rollout/active_tasks"),
        ),
        ({"epo": True}, ("losses/epo_entropy", "losses/epo_phase_weight")),
        ({"critic": "hiper"}, ("charts/subgoal_fraction", "losses/value")),
    ],
    ids=["replay", "epo", "hiper"],
)
def test_ppo_two_steps_with_each_addon(
    tmp_path: Path, tokenizer: Any, opts: dict[str, Any], keys: tuple[str, ...]
) -> None:
    cfg = PPOConfig(steps=2, output_dir=str(tmp_path), **opts, **SMALL)
    metrics = train_ppo(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert [r["step"] for r in records(tmp_path)] == [1, 2]
    for key in keys:
        assert key in metrics, key
