"""Steps 2-3 of the GRPO loop (grpo.py): a forest's rows, shaped rewards, advantages (groups = trees) and
filters (`credit`), and the KL-in-reward shaping it adds (`kl_into_rewards`, `kl_reward`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from toolgym.trainers.advantages import (
    NodeAdv,
    advantage_keep,
    estimate,
    leaf_to_nodes,
    masked_whiten,
    token_advantages,
)
from toolgym.trainers.batch import collate, forward, micro_batches
from toolgym.trainers.grpo_config import GRPOConfig
from toolgym.trainers.loss import KL_SHAPING, accuracy_keep, kl_penalty, overlong_shaping
from toolgym.trainers.modeling import autocast
from toolgym.trainers.tree import RolloutTree, Row, flatten, leaf_rewards


@dataclass
class Credit:
    """Rows (loss masks as trained), rewards, advantages and filter flags of one forest."""

    rows: list[Row]
    rewards: list[float]  # outcome + shaping of each row (what `charts/trained_reward` averages)
    node_adv: NodeAdv  # the estimator's, on the outcome rewards (shaping not included)
    advantages: list[list[float]]  # [B][T] token advantages of the rows as trained (shaping included)
    keep: list[bool]
    dropped: dict[str, int]  # rows each filter removed (counted in order)
    # [B][T] 1 on every model token of a kept row, or None when that is the loss mask: with shared="once" a
    # row's loss mask lacks the shared nodes another row trains, while EPO's trajectory entropy reads all
    # its turns
    turn_masks: list[list[int]] | None = None


def shaping(cfg: GRPOConfig, tree: RolloutTree, leaf: int) -> float:
    """The reward change of a leaf that is not its outcome: DAPO's overlong shaping and the KL in reward."""
    out = float(tree.nodes[leaf].info.get(KL_SHAPING, 0.0))
    if cfg.overlong_buffer > 0:
        n = tree.nodes[leaf].info.get("episode", {}).get("tokens", 0)
        out += overlong_shaping(n, cfg.max_total_tokens, cfg.overlong_buffer, cfg.overlong_factor)
    return out


def centred(values: list[float], groups: list[int]) -> list[float]:
    """Each value minus its group's mean (no scaling).

    >>> centred([-1.0, 0.0, 0.0, 0.0, 2.0], [0, 0, 0, 0, 1])
    [-0.75, 0.25, 0.25, 0.25, 0.0]
    """
    sums: dict[int, list[float]] = {}
    for v, g in zip(values, groups, strict=True):
        sums.setdefault(g, []).append(v)
    return [v - sum(sums[g]) / len(sums[g]) for v, g in zip(values, groups, strict=True)]


def credit(cfg: GRPOConfig, forest: list[RolloutTree], scorer: Any = None) -> Credit:
    """Steps 2-3 of the loop: rows, advantages, filters, shaping. `scorer(forest, rows)` gives IGPO's node
    advantages (it needs the model).

    The estimator sees the outcome rewards only, and the filters act on what it produced (DAPO's dynamic
    sampling filters on accuracy, not on the shaped score). Shaping (overlong, KL in reward) is added after,
    centred on the group mean and never scaled: an overlong row loses its penalty in reward units whatever
    the spread of its group's outcomes (docs/trainer.md, "Shaping and the group normalisation")."""

    rows = flatten(forest, "repeat", drop_truncated=cfg.remove_clip)
    outcomes = leaf_rewards(forest, rows)
    shaped = [shaping(cfg, forest[r.tree], r.leaf) for r in rows]
    rewards = [o + s for o, s in zip(outcomes, shaped, strict=True)]
    if cfg.estimator == "igpo":
        node_adv = scorer(forest, rows)
    elif cfg.estimator == "hiper":
        from toolgym.trainers.hiper import hae

        node_adv = hae(forest, rows, cfg.hiper_gamma, cfg.hiper_omega_high, cfg.hiper_omega_low)
    else:
        node_adv = estimate(
            cfg.estimator, forest, rows, omega=cfg.gigpo_omega, gamma=cfg.gigpo_gamma,
            gigpo_mode=cfg.gigpo_mode, scale=cfg.grpo_scale, similarity=cfg.gigpo_similarity or None,
            hgpo_history=cfg.hgpo_history, hgpo_alpha=cfg.hgpo_alpha, hgpo_base_group=cfg.hgpo_base_group,
            treepo_weight=cfg.treepo_weight,
        )  # fmt: skip
    advantages = token_advantages(rows, node_adv)
    groups = [r.tree for r in rows]
    episodes = [forest[r.tree].nodes[r.leaf].info.get("episode", {}) for r in rows]
    keep = [True] * len(rows)
    dropped: dict[str, int] = {}

    def apply(name: str, flags: list[bool]) -> None:
        dropped[name] = sum(k and not f for k, f in zip(keep, flags, strict=True))
        keep[:] = [k and f for k, f in zip(keep, flags, strict=True)]

    if cfg.filter_zero_variance:
        apply("zero_variance", advantage_keep(advantages, groups))
    if cfg._acc_filter_on():
        success = [bool(e.get("success")) for e in episodes]
        apply("accuracy", accuracy_keep(success, groups, cfg.acc_filter_low, cfg.acc_filter_high))
    if cfg.filter_void:
        apply("void", [not e.get("void") for e in episodes])
    if cfg.mask_truncated_completions:
        apply("truncated", [not e.get("truncated") for e in episodes])
    # the loss masks as trained: filtered rows train nothing; with shared="once" each shared node is
    # trained once, by the first kept row that holds it, with the mean advantage of the kept rows
    turn_masks = None
    if cfg.shared == "once":
        turn_masks = [
            r.loss_mask for r in flatten(forest, "repeat", keep=keep, drop_truncated=cfg.remove_clip)
        ]
    rows = flatten(forest, cfg.shared, keep=keep, drop_truncated=cfg.remove_clip)
    advantages = token_advantages(rows, node_adv, cfg.shared, keep)
    if cfg.estimator == "treepo" and cfg.treepo_whiten:  # TreePO whitens the trained tokens over the batch
        advantages = _whiten(advantages, [r.loss_mask for r in rows])
    if any(shaped):
        extra = token_advantages(rows, leaf_to_nodes(forest, rows, centred(shaped, groups)), cfg.shared, keep)
        advantages = [
            [a + b for a, b in zip(x, y, strict=True)] for x, y in zip(advantages, extra, strict=True)
        ]
    return Credit(rows, rewards, node_adv, advantages, keep, dropped, turn_masks)


def _whiten(advantages: list[list[float]], masks: list[list[int]]) -> list[list[float]]:
    """`masked_whiten` over the masked tokens of every row (ragged rows). [B][T] -> [B][T]. In float64: with
    equal advantages (std 0) float32's rounding of the mean, ~1e-8, divided by eps 1e-8 gave values near 1."""
    T = max((len(a) for a in advantages), default=0)
    x = torch.zeros((len(advantages), T), dtype=torch.float64)  # [B, T]
    m = torch.zeros((len(advantages), T), dtype=torch.float64)  # [B, T]
    for i, (a, k) in enumerate(zip(advantages, masks, strict=True)):
        x[i, : len(a)] = torch.tensor(a, dtype=torch.float64)
        m[i, : len(k)] = torch.tensor(k, dtype=torch.float64)
    w = masked_whiten(x, m)  # [B, T]
    return [w[i, : len(a)].tolist() for i, a in enumerate(advantages)]


def kl_reward(kl: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """verl's KL-in-reward for an outcome estimator: the row's reward changes by -coef * sum_t KL_t over its
    model tokens (`credit` adds it, centred on the group, to the advantages). kl, mask [B, T] -> [B].

    >>> import torch
    >>> round(kl_reward(torch.tensor([[0.1, 0.2, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]), 0.5).item(), 6)
    -0.15
    """
    return -coef * (kl * mask).sum(1)


def kl_into_rewards(
    cfg: GRPOConfig, forest: list[RolloutTree], model: Any, ref: Any, pad_id: int, device: torch.device
) -> float:
    """Records every leaf's `kl_reward` (sampling policy vs reference) as its `KL_SHAPING`, which `credit`
    adds to its advantage; returns the mean KL per token."""

    rows = flatten(forest)
    if not rows:
        return 0.0
    batch = collate(
        rows, [[0.0] * len(r.token_ids) for r in rows], [0.0] * len(rows), [True] * len(rows), pad_id
    )
    batch = batch.to(device)
    total, tokens = 0.0, 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast(device, cfg.bf16):
        # a token budget groups rows by length (each row's KL is its own: the grouping changes no number)
        lengths = [len(r.token_ids) for r in rows] if cfg.micro_batch_tokens else None
        for idx in micro_batches(
            len(rows), cfg.micro_batch_rows, lengths=lengths, tokens=cfg.micro_batch_tokens
        ):
            mb = batch.select(idx)
            logp = forward(model, mb, cfg.temperature)[0].float()
            with ref.active() as ref_model:
                ref_logp = forward(ref_model, mb, cfg.temperature)[0].float()
            kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)  # [b, t]
            shaped = kl_reward(kl, mb.loss_mask, cfg.kl_coef)  # [b]
            for j, i in enumerate(idx.tolist()):
                forest[rows[i].tree].nodes[rows[i].leaf].info[KL_SHAPING] = float(shaped[j])
            total += float((kl * mb.loss_mask).sum())
            tokens += float(mb.loss_mask.sum())
    model.train(was_training)
    return total / max(tokens, 1.0)
