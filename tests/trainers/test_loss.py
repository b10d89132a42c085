"""The clipped loss and its options against hand-computed numbers.

Base case (one row, three tokens, eps 0.2 / 0.28): ratios [1.5, 0.5, 1.1], advantages [1, -1, 1]
  t0: max(-1.5, -1.28) = -1.28 (clipped high, no gradient)
  t1: max(0.5, 0.8)    =  0.8  (clipped low, no gradient; under the dual-clip cap 3)
  t2: max(-1.1, -1.1)  = -1.1
  token mean = -1.58 / 3
"""

from __future__ import annotations

import math

import pytest
import torch

from toolgym.trainers.loss import (
    LossConfig,
    PolicyBatch,
    aggregate,
    denominator,
    llds_penalty,
    overlong_shaping,
    policy_loss,
    read_stats,
    value_loss,
    void_keep,
    zero_variance_keep,
)

OLD = torch.full((1, 3), math.log(0.5))
ADV = torch.tensor([[1.0, -1.0, 1.0]])
MASK = torch.ones(1, 3)


def new_logp(ratios: list[float]) -> torch.Tensor:
    return (OLD + torch.tensor([ratios]).log()).requires_grad_(True)


def batch(ratios: list[float] = (1.5, 0.5, 1.1), **kw: object) -> PolicyBatch:  # type: ignore[assignment]
    return PolicyBatch(new_logp(list(ratios)), OLD, ADV, MASK, **kw)  # type: ignore[arg-type]


def test_clipped_token_loss_and_gradient() -> None:
    b = batch()
    loss, stats = policy_loss(b, LossConfig())
    stats = read_stats(stats)
    assert loss.item() == pytest.approx(-1.58 / 3)
    loss.backward()
    assert b.logprobs.grad is not None
    assert b.logprobs.grad[0].tolist() == pytest.approx([0.0, 0.0, -1.1 / 3])
    assert stats["clipfrac"] == pytest.approx(2 / 3)
    assert stats["clipfrac_low"] == pytest.approx(1 / 3) and stats["clipfrac_high"] == pytest.approx(1 / 3)
    # k3 of (old || new): mean of (r - 1) - log r
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.1)]
    assert stats["approx_kl"] == pytest.approx(sum(k3) / 3, abs=1e-6)


def test_symmetric_clip_and_dual_clip() -> None:
    loss, _ = policy_loss(batch(), LossConfig(eps_high=0.2))
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.1) / 3)
    # ratio 5 with A = -1: unclipped loss 5, dual clip caps it at 3
    loss, stats = policy_loss(batch((1.0, 5.0, 1.0)), LossConfig())
    stats = read_stats(stats)
    assert loss.item() == pytest.approx((-1.0 + 3.0 - 1.0) / 3)
    assert stats["dual_clipfrac"] == pytest.approx(1 / 3)
    loss, _ = policy_loss(batch((1.0, 5.0, 1.0)), LossConfig(dual_clip=None))
    assert loss.item() == pytest.approx((-1.0 + 5.0 - 1.0) / 3)
    with pytest.raises(ValueError):
        LossConfig(dual_clip=0.5)


def test_aepo_clip_keeps_the_gradient_above_the_bound() -> None:
    b = batch()
    loss, _ = policy_loss(b, LossConfig(aepo_clip=True))
    assert loss.item() == pytest.approx(-1.58 / 3)  # same value
    loss.backward()
    assert b.logprobs.grad is not None
    assert b.logprobs.grad[0].tolist() == pytest.approx([-1.28 / 3, 0.0, -1.1 / 3])


def test_sequence_and_turn_ratios() -> None:
    g = (1.5 * 0.5 * 1.1) ** (1 / 3)  # geometric mean, inside the clip range
    loss, _ = policy_loss(batch(), LossConfig(ratio_level="sequence"))
    assert loss.item() == pytest.approx((-g + g - g) / 3)
    turns = torch.tensor([[0, 0, 1]])
    t0 = math.sqrt(1.5 * 0.5)  # 0.866: t1 (A = -1) is not clipped (> 0.8)
    b = batch(turn_ids=turns)
    loss, _ = policy_loss(b, LossConfig(ratio_level="turn"))
    assert loss.item() == pytest.approx((-t0 + t0 - 1.1) / 3)
    loss.backward()  # per-token gradient: -A * ratio_turn / 3
    assert b.logprobs.grad is not None
    assert b.logprobs.grad[0].tolist() == pytest.approx([-t0 / 3, t0 / 3, -1.1 / 3])
    with pytest.raises(ValueError, match="turn_ids"):
        policy_loss(batch(), LossConfig(ratio_level="turn"))


def test_truncated_and_masked_importance_sampling() -> None:
    rollout = OLD - torch.tensor([[3.0, 1.0, 0.5]]).log()  # old / rollout = [3, 1, 0.5]
    loss, stats = policy_loss(
        batch(rollout_logprobs=rollout), LossConfig(is_mode="token_truncate", is_max=2.0)
    )
    stats = read_stats(stats)
    assert loss.item() == pytest.approx((-1.28 * 2 + 0.8 - 1.1 * 0.5) / 3)
    assert (stats["is_min"], stats["is_max"]) == pytest.approx((0.5, 2.0))
    loss, _ = policy_loss(batch(rollout_logprobs=rollout), LossConfig(is_mode="token_mask", is_max=2.0))
    assert loss.item() == pytest.approx((0.8 - 1.1 * 0.5) / 3)
    loss, _ = policy_loss(batch(rollout_logprobs=rollout), LossConfig(is_mode="sequence_mask", is_max=2.0))
    assert loss.item() == pytest.approx(1.5 * -1.58 / 3)  # sequence weight 3 * 1 * 0.5
    loss, _ = policy_loss(
        batch(rollout_logprobs=rollout), LossConfig(is_mode="sequence_truncate", is_max=1.2)
    )
    assert loss.item() == pytest.approx(1.2 * -1.58 / 3)
    loss, _ = policy_loss(batch(rollout_logprobs=rollout), LossConfig(is_mode="none"))
    assert loss.item() == pytest.approx(-1.58 / 3)


def test_k3_kl_and_entropy_bonus() -> None:
    b = batch()
    ref = b.logprobs.detach() + torch.tensor([[math.log(2), 0.0, -math.log(2)]])
    # k3 = e^d - d - 1 with d = ref - logp: [1 - ln 2, 0, ln 2 - 0.5]; their mean is 0.5 / 3
    loss, stats = policy_loss(b._replace(ref_logprobs=ref), LossConfig(kl_coef=0.1))
    stats = read_stats(stats)
    assert stats["kl_ref"] == pytest.approx(0.5 / 3)
    assert loss.item() == pytest.approx(-1.58 / 3 + 0.1 * 0.5 / 3)
    ent = torch.tensor([[1.0, 2.0, 3.0]])
    loss, stats = policy_loss(batch(entropy=ent), LossConfig(entropy_coef=0.01))
    stats = read_stats(stats)
    assert loss.item() == pytest.approx(-1.58 / 3 - 0.02)
    assert stats["entropy"] == pytest.approx(2.0)


def test_llds_action_and_response_gates() -> None:
    old = torch.full((1, 3), -1.0)
    logp = torch.tensor([[-1.5, -0.8, -1.4]])  # drops d = old - logp = [0.5, -0.2, 0.4]
    adv = torch.tensor([[1.0, 1.0, 1.0]])
    turns = torch.tensor([[0, 0, 1]])
    # action gate: turn 0 drop 0.3 > 0, turn 1 drop 0.4 > 0 -> penalty [0.5, 0, 0.4]
    pen = llds_penalty(logp, old, adv, MASK, turns, "action")
    assert pen[0].tolist() == pytest.approx([0.5, 0.0, 0.4])
    logp2 = torch.tensor([[-1.5, -0.8, -0.6]])  # d = [0.5, -0.2, -0.4]: row drop -0.1 < 0
    assert llds_penalty(logp2, old, adv, MASK, turns, "action")[0].tolist() == pytest.approx([0.5, 0.0, 0.0])
    assert llds_penalty(logp2, old, adv, MASK, turns, "response")[0].tolist() == pytest.approx(
        [0.0, 0.0, 0.0]
    )
    # tokens with A < 0 are outside the preserving set
    assert llds_penalty(logp, old, -adv, MASK, turns)[0].tolist() == pytest.approx([0.0, 0.0, 0.0])
    b = PolicyBatch(logp.clone().requires_grad_(True), old, adv, MASK, turn_ids=turns)
    base, _ = policy_loss(b, LossConfig(eps_low=10, eps_high=10))
    with_llds, _ = policy_loss(b, LossConfig(eps_low=10, eps_high=10, llds_coef=0.2))
    assert (with_llds - base).item() == pytest.approx(0.2 * 0.9 / 3)


def test_aggregation_modes_and_global_denominator() -> None:
    per_token = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, LossConfig(agg="token_mean")).item() == pytest.approx(6 / 3)
    assert aggregate(per_token, mask, LossConfig(agg="seq_mean")).item() == pytest.approx((2 + 2) / 2)
    assert aggregate(per_token, mask, LossConfig(agg="constant", max_tokens=10)).item() == pytest.approx(
        6 / 20
    )
    # two micro-batches share one global token count: their losses add up to the full-batch loss
    cfg = LossConfig()
    total = denominator(mask[:1], cfg) + denominator(mask[1:], cfg)
    split = aggregate(per_token[:1], mask[:1], cfg, total) + aggregate(per_token[1:], mask[1:], cfg, total)
    assert split.item() == pytest.approx(aggregate(per_token, mask, cfg).item())


def test_value_loss_clipping() -> None:
    cfg = LossConfig()
    v = torch.tensor([[1.5]])
    loss, stats = value_loss(v, torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), cfg, clip=0.2)
    stats = read_stats(stats)
    assert loss.item() == pytest.approx(0.5 * 0.64)  # clipped value 1.2 is farther from 2.0 than 1.5
    assert stats["value_clipfrac"] == 1.0
    loss, _ = value_loss(v, torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), cfg, clip=None)
    assert loss.item() == pytest.approx(0.5 * 0.25)


def test_filters_and_shaping() -> None:
    assert zero_variance_keep([0.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1, 2, 2]) == [
        False,
        False,
        True,
        True,
        False,
        False,
    ]
    assert void_keep([False, True]) == [True, False]
    assert overlong_shaping(90, 100, 20, factor=0.5) == pytest.approx(-0.25)
    assert overlong_shaping(120, 100, 0) == -1.0
    assert overlong_shaping(80, 100, 0) == 0.0


def test_mask_excludes_tool_tokens() -> None:
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    b = PolicyBatch(new_logp([1.5, 0.5, 1.1]), OLD, ADV, mask)
    loss, stats = policy_loss(b, LossConfig())
    stats = read_stats(stats)
    assert loss.item() == pytest.approx((-1.28 - 1.1) / 2)
    loss.backward()
    assert b.logprobs.grad is not None and b.logprobs.grad[0, 1].item() == 0.0
    assert stats["masked_frac"] == pytest.approx(1 / 3)
