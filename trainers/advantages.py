"""Advantage estimators: a forest of rollout trees + rewards -> an advantage for every trained token.

Here: the group baselines (GRPO, Dr.GRPO, RLOO), their broadcast to nodes and tokens, GAE, and `estimate`,
the critic-free estimators by name. The turn-level ones (GiGPO, HGPO, IGPO) are in advantages_turn.py,
the tree ones (SPO, TreeRL, TreePO) in advantages_tree.py.

Departures from the papers (docs/trainer.md; each is also marked where it happens):
1. A group of one gets advantage 0 in every group-normalised estimator (GRPO, RLOO, GiGPO steps,
   IGPO): with no sibling there is no baseline. verl gives a lone GRPO sample its raw reward.
2.-4. GiGPO's episode level and anchor keys, IGPO's normalisation (advantages_turn.py) and the tree
   estimators' segments (advantages_tree.py) are listed with those estimators.
5. GAE follows verl: tokens with mask 0 (tool/env text) are skipped, value and advantage carried through.

Interface. Most estimators give one number per (row, node): `NodeAdv = list[dict[node_id, float]]`;
`token_advantages` broadcasts it to tokens (0 where the loss mask is 0) and, with `shared="once"`,
averages a node's advantage over the rows that hold it (ARPO's "hard" attribution). GAE works on tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch

from toolgym.trainers.tree import RolloutTree, Row, SharedMode, row_turns

NormMode = Literal["mean_std", "mean", "none"]
NodeAdv = list[dict[int, float]]


def group_norm(
    values: Sequence[float],
    groups: Sequence[Hashable],
    mode: NormMode = "mean_std",
    std: Literal["unbiased", "population"] = "unbiased",
    eps: float = 1e-6,
) -> list[float]:
    """(x - mean_g) / (std_g + eps) within each group (`mode="mean"`: no division; "none": x).

    A group of one gives 0 (departure 1).

    >>> [round(a, 4) for a in group_norm([1.0, 0.0, 0.0, 5.0], ["a", "a", "a", "b"], eps=0.0)]
    [1.1547, -0.5774, -0.5774, 0.0]
    """
    if mode == "none":
        return [float(v) for v in values]
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(values)
    for idx in members.values():
        if len(idx) < 2:
            continue
        x = torch.tensor([values[i] for i in idx], dtype=torch.float64)  # [n]
        a = x - x.mean()  # [n]
        if mode == "mean_std":
            a = a / (x.std(unbiased=std == "unbiased") + eps)  # [n]
        for i, v in zip(idx, a.tolist(), strict=True):
            out[i] = v
    return out


def grpo(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-4,
) -> list[float]:
    """GRPO's group z-score (TRL: unbiased std, eps 1e-4). `scale="none"` is Dr.GRPO, "batch" PPO-Lite.

    >>> [round(a, 4) for a in grpo([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0], eps=0.0)]
    [0.866, -0.866, -0.866, 0.866]
    """
    if scale == "group":
        return group_norm(rewards, groups, "mean_std", "unbiased", eps)
    centred = group_norm(rewards, groups, "mean")
    if scale == "none":
        return centred
    sd = torch.tensor(list(rewards), dtype=torch.float64).std().item() if len(rewards) > 1 else 0.0
    return [a / (sd + eps) for a in centred]


def dr_grpo(rewards: Sequence[float], groups: Sequence[Hashable]) -> list[float]:
    """Dr.GRPO: R - mean of the group, no std (pair with the constant-normaliser loss aggregation)."""
    return grpo(rewards, groups, scale="none")


def rloo(rewards: Sequence[float], groups: Sequence[Hashable]) -> list[float]:
    """REINFORCE leave-one-out: R_i - mean_{j != i} R_j = n/(n-1) (R_i - mean).

    >>> rloo([1.0, 0.0, 0.0], [0, 0, 0])
    [1.0, -0.5, -0.5]
    """
    centred = group_norm(rewards, groups, "mean")
    sizes: dict[Hashable, int] = defaultdict(int)
    for g in groups:
        sizes[g] += 1
    return [
        a * sizes[g] / (sizes[g] - 1) if sizes[g] > 1 else 0.0 for a, g in zip(centred, groups, strict=True)
    ]


def leaf_to_nodes(forest: list[RolloutTree], rows: list[Row], per_row: Sequence[float]) -> NodeAdv:
    """Broadcasts one advantage per row to the row's model nodes."""
    return [
        {n: float(a) for n in r.nodes if forest[r.tree].nodes[n].trainable}
        for r, a in zip(rows, per_row, strict=True)
    ]


def turn_to_nodes(forest: list[RolloutTree], rows: list[Row], per_turn: Sequence[Sequence[float]]) -> NodeAdv:
    """Broadcasts one advantage per (row, model turn in order) to the nodes of that turn."""
    out: NodeAdv = []
    for r, advs in zip(rows, per_turn, strict=True):
        turns = row_turns(forest[r.tree], r)
        if len(turns) != len(advs):
            raise ValueError(f"row of leaf {r.leaf} has {len(turns)} model turns but {len(advs)} advantages")
        out.append({n: float(a) for t, a in zip(turns, advs, strict=True) for n in t.nodes})
    return out


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = sum_{k>=t} gamma^(k-t) r_k.

    >>> discounted_returns([0.0, 0.0, 1.0], 0.5)
    [0.25, 0.5, 1.0]
    """
    out, acc = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out


def token_advantages(
    rows: list[Row], node_adv: NodeAdv, shared: SharedMode = "repeat", keep: Sequence[bool] | None = None
) -> list[list[float]]:
    """Per-token advantages [B][T]: each trained token gets its node's advantage, 0 elsewhere.

    With `shared="once"` a node's advantage is the mean over the kept rows of its tree that hold it
    (tree.py says what that does to the gradient); `keep` None keeps every row.
    """
    if shared == "once":
        sums: dict[tuple[int, int], list[float]] = defaultdict(list)
        for i, (r, adv) in enumerate(zip(rows, node_adv, strict=True)):
            if keep is None or keep[i]:
                for n, a in adv.items():
                    sums[(r.tree, n)].append(a)
        node_adv = [
            {n: sum(sums[(r.tree, n)]) / len(sums[(r.tree, n)]) for n in adv if sums.get((r.tree, n))}
            for r, adv in zip(rows, node_adv, strict=True)
        ]
    return [
        [adv.get(n, 0.0) if m else 0.0 for n, m in zip(r.node_ids, r.loss_mask, strict=True)]
        for r, adv in zip(rows, node_adv, strict=True)
    ]


def terminal_rewards(mask: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Places each row's reward on its last trained token. mask [B, T], rewards [B] -> [B, T].

    >>> terminal_rewards(torch.tensor([[0, 1, 1, 0]]), torch.tensor([2.0])).tolist()
    [[0.0, 0.0, 2.0, 0.0]]
    """
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)  # [B, T]
    last = torch.where(mask.bool(), pos, -1).amax(dim=1)  # [B]
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=mask.device)  # [B, T]
    rows = (last >= 0).nonzero().squeeze(1)  # [B']
    out[rows, last[rows]] = rewards[rows]
    return out


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over model tokens (mask 1); mask-0 tokens are skipped: value and running GAE pass through them.

    rewards, values, mask: [B, T]. `bootstrap` [B]: the value after the last token of each row, used
    where the episode was truncated (turn limit, token budget, timeout), 0 where it terminated — as
    every PPO implementation does for time-limit truncation (the return does not end, it is cut). None:
    all rows terminated. Returns (advantages, returns), both [B, T] and 0 where mask is 0.
    """
    B, T = rewards.shape
    m = mask.to(values.dtype)  # [B, T]
    adv = torch.zeros_like(values)  # [B, T]
    next_v = (
        torch.zeros(B, dtype=values.dtype, device=values.device)
        if bootstrap is None
        else bootstrap.to(values.dtype)
    )  # [B]
    next_gae = torch.zeros(B, dtype=values.dtype, device=values.device)  # [B]
    for t in range(T - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_v - values[:, t]  # [B]
        g = delta + gamma * lam * next_gae  # [B]
        adv[:, t] = g * m[:, t]
        next_v = m[:, t] * values[:, t] + (1 - m[:, t]) * next_v  # [B]
        next_gae = m[:, t] * g + (1 - m[:, t]) * next_gae  # [B]
    returns = (adv + values) * m  # [B, T]
    return adv, returns


def turn_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GAE over turns (ST-PPO's turn-level critic): the state of turn k is its first model token, with
    value V_k = values at that token; r_k = the rewards on the turn's tokens; delta_k = r_k + gamma V_{k+1}
    - V_k (V_K = `bootstrap` of a truncated row, else 0); A_k = delta_k + gamma lam A_{k+1}.

    rewards, values, mask, turn_ids: [B, T]. Returns (advantages [B, T]: A_k on every model token of turn
    k; returns [B, T]: A_k + V_k on the turn's first token; value_mask [B, T]: 1 on those first tokens).
    """
    adv = torch.zeros_like(values)  # [B, T]
    ret = torch.zeros_like(values)  # [B, T]
    vmask = torch.zeros_like(values)  # [B, T]
    on = mask.bool()  # [B, T]
    for b in range(values.shape[0]):
        pos = on[b].nonzero().squeeze(1).tolist()
        turns: list[list[int]] = []
        for t in pos:
            if not turns or int(turn_ids[b, t]) != int(turn_ids[b, turns[-1][-1]]):
                turns.append([])
            turns[-1].append(t)
        next_v = float(bootstrap[b]) if bootstrap is not None else 0.0
        next_a = 0.0
        for toks in reversed(turns):
            v = float(values[b, toks[0]])
            r = float(rewards[b, toks].sum())
            a = r + gamma * next_v - v + gamma * lam * next_a
            adv[b, toks] = a
            ret[b, toks[0]] = a + v
            vmask[b, toks[0]] = 1.0
            next_v, next_a = v, a
    return adv, ret, vmask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (unbiased std); 0 outside the mask. [B, T] -> [B, T].

    Computed, and returned, in float32 at least: bf16 advantages (a bf16 value head's) would otherwise get
    a bf16 mean and std, off by whole quantisation steps over a batch of tokens."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # [B, T]
    m = mask.bool()  # [B, T]
    vals = x[m]  # [N]
    if vals.numel() < 2:
        return torch.zeros_like(x)
    return torch.where(m, (x - vals.mean()) / (vals.std() + eps), torch.zeros_like(x))  # [B, T]


def entropy_scaled(
    adv: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, alpha: float = 0.2
) -> torch.Tensor:
    """AEPO's entropy-aware advantage A * (1 + alpha * z(H)), z over the masked tokens. [B, T] -> [B, T]."""
    z = masked_whiten(entropy.detach(), mask)  # [B, T]
    return adv * (1 + alpha * z)  # [B, T]


ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gigpo", "hgpo", "tree", "spo_std", "treerl", "treepo")


def estimate(
    name: str,
    forest: list[RolloutTree],
    rows: list[Row],
    omega: float = 1.0,
    gamma: float = 0.95,
    gigpo_mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm",
    scale: Literal["group", "batch", "none"] = "group",
    similarity: float | None = None,
    hgpo_history: int = 2,
    hgpo_alpha: float = 1.0,
    hgpo_base_group: bool = False,
    treepo_weight: Literal["average", "group_size"] = "average",
) -> NodeAdv:
    """Node advantages of a critic-free estimator by name (see ESTIMATORS); groups are the trees.

    `scale` is GRPO's (group z-score | one batch std | none); `gigpo_mode` is also HGPO's mode.
    """
    # imported here: those modules build on this one's group baselines (a module-level import is circular)
    from toolgym.trainers.advantages_tree import tree_advantages, treepo
    from toolgym.trainers.advantages_turn import gigpo, hgpo

    rewards = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    groups = [r.tree for r in rows]
    if name == "grpo":
        return leaf_to_nodes(forest, rows, grpo(rewards, groups, scale=scale))
    if name == "dr_grpo":
        return leaf_to_nodes(forest, rows, dr_grpo(rewards, groups))
    if name == "rloo":
        return leaf_to_nodes(forest, rows, rloo(rewards, groups))
    if name == "gigpo":
        return gigpo(forest, rows, omega=omega, gamma=gamma, mode=gigpo_mode, similarity=similarity)
    if name == "hgpo":
        return hgpo(forest, rows, hgpo_history, gamma, gigpo_mode, hgpo_alpha, hgpo_base_group)
    if name in ("tree", "spo_std", "treerl"):
        return tree_advantages(forest, rows, style="spo" if name == "tree" else name)  # type: ignore[arg-type]
    if name == "treepo":
        return leaf_to_nodes(forest, rows, treepo(forest, rows, treepo_weight))
    from toolgym.errors import ConfigError

    raise ConfigError(f"unknown estimator {name!r}; choose one of {', '.join(ESTIMATORS)} (PPO uses GAE)")


def advantage_keep(
    advantages: Sequence[Sequence[float]], groups: Sequence[Hashable], tol: float = 1e-6
) -> list[bool]:
    """DAPO's zero-variance filter on what the estimator produced: a group whose rows have every token
    advantage within `tol` of 0 is left out of the loss (it would only add KL/entropy terms and tokens to
    the denominator). For GRPO/RLOO/Dr.GRPO this is exactly "all rewards equal"; for IGPO, GiGPO, HGPO
    and the tree estimators a group with equal outcomes can still carry turn-level signal and is kept.

    >>> advantage_keep([[0.0, 0.0], [0.0], [0.0, 0.3], [0.0]], [0, 0, 1, 1])
    [False, False, True, True]
    """
    live: dict[Hashable, bool] = defaultdict(bool)
    for a, g in zip(advantages, groups, strict=True):
        live[g] = live[g] or any(abs(x) > tol for x in a)
    return [live[g] for g in groups]
