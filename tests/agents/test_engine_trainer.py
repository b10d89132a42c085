"""``toolgym train`` with ``engine: fast`` (on CPU here): the engine serves the live model's rollouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.script_modules import load_script


def _trainer_fixtures() -> Any:
    """The trainer tests' tiny model, tokenizer and fake env with varied rewards (tests/trainers/conftest.py)."""
    mod = load_script("tests/trainers/conftest.py", "_trainer_conftest")
    mod.register_fake_env()
    return mod


@pytest.mark.slow
def test_grpo_steps_with_the_fast_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.agents.engine.weights import PackedWeights
    from toolgym.trainers import grpo
    from toolgym.trainers.grpo import GRPOConfig, train

    # the optimizer of a CUDA run (fused AdamW: its kernel bumps no version counter), and a record of
    # whether each rollout's engine re-packed the weights the step before changed
    def fused(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)

    repacks: list[bool] = []
    original = PackedWeights.refresh

    def refresh(self: PackedWeights, force: bool = False) -> bool:
        repacks.append(original(self, force))
        return repacks[-1]

    monkeypatch.setattr(grpo, "make_optimizer", fused)
    monkeypatch.setattr(PackedWeights, "refresh", refresh)
    fx = _trainer_fixtures()
    tokenizer = fx.tiny_tokenizer()
    model = fx.tiny_model(len(tokenizer))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = GRPOConfig(
        env_ids=[fx.FAKE_ENV], env_kwargs={}, steps=2, prompts_per_step=2, budget=4, max_new_tokens=6,
        max_total_tokens=256, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=2,
        micro_batch_rows=4, engine="fast", output_dir=str(tmp_path),
    )  # fmt: skip
    metrics = train(cfg, model, tokenizer)
    assert "fast engine" in capsys.readouterr().err
    assert metrics["rollout/tokens_per_s"] > 0
    unchanged = [n for n, p in model.named_parameters() if torch.equal(before[n], p)]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    # packed at start, then again after each of the 2 optimizer steps (step 2's rollout, the final eval)
    assert sum(repacks) >= 3, repacks


def test_auto_keeps_hf_on_cpu_and_fast_refuses_other_architectures(
    chatml_tokenizer: Any, make_tiny_model: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from toolgym.agents import HFPolicy
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.engine.select import choose_engine
    from toolgym.errors import ConfigError

    hf = HFPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer)
    assert choose_engine(hf, "auto", rows=8, capacity=256) is hf
    assert "CUDA only" in capsys.readouterr().err
    assert isinstance(choose_engine(hf, "fast", rows=8, capacity=256), EnginePolicy)
    gpt2 = HFPolicy(
        GPT2LMHeadModel(GPT2Config(vocab_size=len(chatml_tokenizer), n_embd=32, n_layer=1, n_head=2)),
        chatml_tokenizer,
    )
    assert choose_engine(gpt2, "auto", rows=8, capacity=256) is gpt2
    with pytest.raises(ConfigError, match="engine=hf"):
        choose_engine(gpt2, "fast", rows=8, capacity=256)
    with pytest.raises(ConfigError, match="engine must be"):
        choose_engine(hf, "tgi", rows=8, capacity=256)
