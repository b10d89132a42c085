"""The loss stats stay on the device: no host read inside `policy_loss`/`value_loss`, one per optimizer step in
the update loops (`StatLog`), and the logged means are exactly those of reading every stat with `float()`."""

from __future__ import annotations

import random
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.trainers.conftest import register_fake_env, tiny_model
from toolgym.trainers.loss import (
    LossConfig,
    PolicyBatch,
    Stat,
    StatLog,
    policy_loss,
    read_stats,
    value_loss,
)

# what waits for the device when a tensor lives on a GPU (a boolean-mask index too: its size is data)
READS = {"item", "__float__", "__int__", "__bool__", "__index__", "tolist", "nonzero", "cpu"}


class HostReads(TorchFunctionMode):
    """Counts host reads of tensors made by toolgym's trainer code (not torch's or transformers' own: Adam's
    step count is a CPU tensor), keyed by (operation, function that made it)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[tuple[str, str]] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        masked = name == "__getitem__" and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool
            for a in (args[1] if isinstance(args[1], tuple) else (args[1],))
        )
        if name in READS or masked:
            caller = traceback.extract_stack()[-2]
            if "trainers" in Path(caller.filename).parts:
                self.reads[(name, f"{Path(caller.filename).stem}.{caller.name}")] += 1
        return func(*args, **(kwargs or {}))


def random_batch(rng: random.Random) -> PolicyBatch:
    B, T = rng.randint(1, 4), rng.randint(1, 10)
    logp = (-torch.rand(B, T) * 3).requires_grad_()
    old = logp.detach() + torch.randn(B, T) * 0.3
    mask = (torch.rand(B, T) > rng.choice([0.0, 0.3, 1.01])).float()  # 1.01: an all-masked micro-batch
    turns = torch.cumsum((torch.rand(B, T) > 0.6).long(), 1) - 1
    return PolicyBatch(
        logp, old, torch.randn(B, T), mask, rollout_logprobs=old + torch.randn(B, T) * 0.5,
        ref_logprobs=logp.detach() + 0.1, entropy=torch.rand(B, T), turn_ids=turns,
    )  # fmt: skip


CONFIGS = [
    LossConfig(kl_coef=0.1, entropy_coef=0.01),
    LossConfig(ratio_level="turn", llds_coef=0.2, is_mode="sequence_mask", is_min=0.5, agg="seq_mean"),
    LossConfig(objective="cispo", top_entropy_quantile=0.5, is_mode="token_mask", ratio_level="sequence"),
    LossConfig(
        aepo_clip=True, dual_clip=None, delta=4.0, llds_coef=0.2, llds_gate="response", agg="constant"
    ),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["kl-entropy", "turn-llds", "cispo-top-entropy", "aepo-delta"])
def test_losses_never_read_the_device(cfg: LossConfig) -> None:
    rng = random.Random(0)
    with HostReads() as counter:
        for _ in range(10):
            b = random_batch(rng)
            _, stats = policy_loss(b, cfg, denom=5.0)
            _, vstats = value_loss(torch.randn(b.mask.shape), torch.randn(b.mask.shape), b.advantages, b.mask, cfg, 0.2, 5.0)  # fmt: skip
    assert not counter.reads, counter.reads
    assert set(stats) >= {"policy", "clipfrac", "approx_kl", "is_min", "is_max", "masked_frac"}
    assert set(vstats) == {"value", "value_clipfrac"}


def test_statlog_means_are_the_eager_reads() -> None:
    """Two optimizer steps of three micro-batches: StatLog's means equal, to the last bit, the sums of the
    update loop before StatLog (every stat read with float() as it came: `float(num) / float(den)`)."""
    rng = random.Random(1)
    log, eager, weight = StatLog(), {}, 0.0
    for cfg in CONFIGS[:2]:  # one optimizer step each
        for _ in range(3):
            b = random_batch(rng)
            _, st = policy_loss(b, cfg, denom=4.0)
            _, vst = value_loss(
                torch.randn(b.mask.shape), torch.randn(b.mask.shape), b.advantages, b.mask, cfg
            )
            w = float(b.mask.sum())
            log.add(st | vst, w)
            for k, s in (st | vst).items():
                num = float(s.num)
                v = num if s.den is None else (num / float(s.den) if float(s.den) > 0 else 0.0)
                eager[k] = eager.get(k, 0.0) + v * w
            weight += w
        norm = torch.tensor(1.25)
        assert log.read(grad_norm=norm) == {"grad_norm": 1.25}
    assert log.weight == weight
    assert log.means() == {k: v / weight for k, v in eager.items()}


def test_statlog_refuses_means_before_read_and_reads_mixed_dtypes() -> None:
    log = StatLog()
    log.add({"a": Stat(torch.tensor(1.5, dtype=torch.bfloat16), torch.tensor(3.0))}, 2.0)
    with pytest.raises(RuntimeError):
        log.means()
    assert log.read() == {}
    assert log.means() == {"a": 0.5}
    assert read_stats({"x": Stat(torch.tensor(1.0), torch.tensor(0.0))}) == {"x": 0.0}  # empty mask: 0


@pytest.mark.parametrize("trainer", ["grpo", "ppo"])
def test_update_loop_reads_the_stats_once_per_optimizer_step(
    tmp_path: Path, tokenizer: Any, trainer: str
) -> None:
    """Inside the update (addons.start_step .. end_step), the loss module's only host read is StatLog's one
    stacked read per optimizer step (denominator reads the CPU copy of the mask), whatever the micro-batch
    count; before, ~30 float() reads per micro-batch."""
    from tests.trainers.test_train import SMALL
    from toolgym.trainers import addons, grpo, ppo

    register_fake_env()
    counter = HostReads()
    start, end = addons.AddonState.start_step, addons.AddonState.end_step

    def started(self: Any, step: int) -> None:
        counter.__enter__()
        start(self, step)

    def ended(self: Any, metrics: dict[str, float], *total: Any) -> None:
        counter.__exit__(None, None, None)
        end(self, metrics, *total)

    opts = dict(SMALL, steps=1, minibatches=2, micro_batch_rows=2, kl_coef=0.05, ratio_level="turn")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(addons.AddonState, "start_step", started)
        mp.setattr(addons.AddonState, "end_step", ended)
        if trainer == "grpo":
            cfg: Any = grpo.GRPOConfig(output_dir=str(tmp_path), epochs=2, **opts)
            metrics = grpo.train(cfg, tiny_model(len(tokenizer)), tokenizer)
        else:
            cfg = ppo.PPOConfig(output_dir=str(tmp_path), **opts)
            metrics = ppo.train(cfg, tiny_model(len(tokenizer)), tokenizer)
    updates = 2 * cfg.epochs  # minibatches x epochs optimizer steps
    in_loss = {
        k: n for k, n in counter.reads.items() if k[1].startswith("loss.") and k[1] != "loss.denominator"
    }
    assert in_loss == {("tolist", "loss.read_all"): updates}
    loop = "grpo_update.optimize" if trainer == "grpo" else "ppo._train"  # (train wraps _train in cleanup)
    others = {k for k in counter.reads if not k[1].startswith("loss.")}
    assert others == {("tolist", loop)}  # the micro-batch's row indices: a CPU tensor
    assert "losses/grad_norm" in metrics and "losses/clipfrac" in metrics
