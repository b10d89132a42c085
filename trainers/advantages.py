"""Advantage estimators: a forest of rollout trees + rewards -> an advantage for every trained token.

Departures from the papers (ALGORITHMS.md §9.b; each is also marked where it happens):
1. A group of one gets advantage 0 in every group-normalised estimator (GRPO, RLOO, GiGPO steps,
   IGPO): with no sibling there is no baseline. verl gives a lone GRPO sample its raw reward.
2. GiGPO's episode level counts each trajectory once (verl-agent counts it once per step row, so long
   trajectories weigh more). Turns without a state key form their own (singleton) step group.
3. Tree values use the SPO form V(child) - V(parent) on every node (TreeRL's form, (V(s)-V(parent)) +
   V(s) with LOO-normalised leaves and 1/sqrt(|leaves|), is `style="treerl"`); tool/env nodes carry a
   value too, so a branch right after a tool result is credited against the tool node's value.
4. IGPO takes the per-turn rewards as given (the info-gain scorer lives with the rewards); the
   normalisation uses the population std and std 1 for a single value, as the updated official code.
5. GAE follows verl: tokens with mask 0 (tool/env text) are skipped, value and advantage carried through.

Interface. Most estimators give one number per (row, node): `NodeAdv = list[dict[node_id, float]]`;
`token_advantages` broadcasts it to tokens (0 where the loss mask is 0) and, with `shared="once"`,
averages a node's advantage over the rows that hold it (ARPO's "hard" attribution). GAE works on tokens.
"""

from __future__ import annotations

import itertools
import math
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


def gigpo(
    forest: list[RolloutTree],
    rows: list[Row],
    omega: float = 1.0,
    gamma: float = 0.95,
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm",
    eps: float = 1e-6,
) -> NodeAdv:
    """GiGPO: A(i, t) = A_E(i) + omega * A_S(i, t), broadcast to the nodes of turn t of row i.

    A_E normalises the leaf reward within the tree; A_S normalises the gamma-discounted return of the
    step rewards from turn t on within the anchor group (same tree, same `state_key`).
    """
    norm: NormMode = "mean" if mode == "mean_norm" else "mean_std"
    episode = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    a_e = group_norm(episode, [r.tree for r in rows], norm, "unbiased", eps)
    keys: list[Hashable] = []
    returns: list[float] = []
    owner: list[tuple[int, int]] = []  # (row index, turn position) of each step entry
    for i, r in enumerate(rows):
        turns = row_turns(forest[r.tree], r)
        rets = discounted_returns([t.step_reward for t in turns], gamma)
        for j, (t, ret) in enumerate(zip(turns, rets, strict=True)):
            keys.append((r.tree, t.state_key) if t.state_key is not None else (r.tree, "solo", i, j))
            returns.append(ret)
            owner.append((i, j))
    a_s = group_norm(returns, keys, norm, "unbiased", eps)
    per_turn: list[list[float]] = [[] for _ in rows]
    for (i, _), a in zip(owner, a_s, strict=True):
        per_turn[i].append(a_e[i] + omega * a)
    return turn_to_nodes(forest, rows, per_turn)


def tree_values(tree: RolloutTree, leaf_values: dict[int, float]) -> list[float]:
    """V(node) = mean of `leaf_values` over the leaves below it, for every node of the tree."""
    return [
        sum(leaf_values[leaf] for leaf in ls) / len(ls)
        for ls in (tree.subtree_leaves(n.id) for n in tree.nodes)
    ]


def tree_advantages(
    forest: list[RolloutTree], rows: list[Row], style: Literal["spo", "treerl"] = "spo"
) -> NodeAdv:
    """Tree credit per node. `spo`: V(s) - V(parent). `treerl`: leaves LOO-normalised first, then
    ((V(s) - V(parent)) + V(s)) / sqrt(#leaves below s). The same for every row holding the node."""
    per_tree: list[list[float]] = []
    for tree in forest:
        leaves = tree.leaves()
        raw = {leaf: tree.nodes[leaf].reward or 0.0 for leaf in leaves}
        if style == "treerl":
            loo = rloo(list(raw.values()), [0] * len(raw))
            raw = dict(zip(leaves, loo, strict=True))
        v = tree_values(tree, raw)
        adv = []
        for n in tree.nodes:
            a = v[n.id] - (v[n.parent] if n.parent is not None else 0.0)
            if style == "treerl":
                a = (a + v[n.id]) / math.sqrt(len(tree.subtree_leaves(n.id)))
            adv.append(a)
        per_tree.append(adv)
    return [{n: per_tree[r.tree][n] for n in r.nodes if forest[r.tree].nodes[n].trainable} for r in rows]


def info_gain(
    probs: Sequence[float], kind: Literal["prob_diff", "log_prob_diff"] = "prob_diff"
) -> list[float]:
    """IGPO turn rewards from P_0..P_n (P_t = teacher-forced probability of the gold answer after turn t,
    P_0 before the first turn): IG_t = P_t - P_{t-1} (or the difference of logs), t = 1..n.

    >>> [round(x, 6) for x in info_gain([0.1, 0.4, 0.3])]
    [0.3, -0.1]
    """
    if kind == "log_prob_diff":
        return [math.log(b) - math.log(a) for a, b in itertools.pairwise(probs)]
    return [b - a for a, b in itertools.pairwise(probs)]


def igpo(
    turn_rewards: Sequence[Sequence[float]],
    groups: Sequence[Hashable],
    gamma: float = 1.0,
    norm: Literal["joint", "separate"] = "joint",
) -> list[list[float]]:
    """IGPO turn advantages: turn rewards (info gains, then the outcome as the last) z-scored within the
    group (population std; std 1 when there is a single value), then discounted sums from each turn on.
    Returns one list per row, one advantage per turn (feed to `turn_to_nodes`)."""
    flat: list[float] = []
    keys: list[Hashable] = []
    for g, rs in zip(groups, turn_rewards, strict=True):
        for j, x in enumerate(rs):
            flat.append(float(x))
            last = j == len(rs) - 1
            keys.append(g if norm == "joint" else (g, last))
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(i)
    normed = [0.0] * len(flat)
    for idx in members.values():
        xs = torch.tensor([flat[i] for i in idx], dtype=torch.float64)  # [n]
        sd = xs.std(unbiased=False).item() if len(idx) > 1 else 1.0
        for i, v in zip(idx, ((xs - xs.mean()) / (sd if sd > 0 else 1.0)).tolist(), strict=True):
            normed[i] = v
    out, pos = [], 0
    for rs in turn_rewards:
        out.append(discounted_returns(normed[pos : pos + len(rs)], gamma))
        pos += len(rs)
    return out


def token_advantages(rows: list[Row], node_adv: NodeAdv, shared: SharedMode = "repeat") -> list[list[float]]:
    """Per-token advantages [B][T]: each trained token gets its node's advantage, 0 elsewhere.

    With `shared="once"` a node's advantage is the mean over all rows of its tree that hold it.
    """
    if shared == "once":
        sums: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r, adv in zip(rows, node_adv, strict=True):
            for n, a in adv.items():
                sums[(r.tree, n)].append(a)
        node_adv = [
            {n: sum(sums[(r.tree, n)]) / len(sums[(r.tree, n)]) for n in adv}
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
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over model tokens (mask 1); mask-0 tokens are skipped: value and running GAE pass through them.

    rewards, values, mask: [B, T]. Returns (advantages, returns), both [B, T] and 0 where mask is 0.
    """
    B, T = rewards.shape
    m = mask.to(values.dtype)  # [B, T]
    adv = torch.zeros_like(values)  # [B, T]
    next_v = torch.zeros(B, dtype=values.dtype, device=values.device)  # [B]
    next_gae = torch.zeros(B, dtype=values.dtype, device=values.device)  # [B]
    for t in range(T - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_v - values[:, t]  # [B]
        g = delta + gamma * lam * next_gae  # [B]
        adv[:, t] = g * m[:, t]
        next_v = m[:, t] * values[:, t] + (1 - m[:, t]) * next_v  # [B]
        next_gae = m[:, t] * g + (1 - m[:, t]) * next_gae  # [B]
    returns = (adv + values) * m  # [B, T]
    return adv, returns


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (unbiased std); 0 outside the mask. [B, T] -> [B, T]."""
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


ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gigpo", "tree", "treerl")


def estimate(
    name: str,
    forest: list[RolloutTree],
    rows: list[Row],
    omega: float = 1.0,
    gamma: float = 0.95,
    gigpo_mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm",
) -> NodeAdv:
    """Node advantages of a critic-free estimator by name (see ESTIMATORS); groups are the trees."""
    rewards = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    groups = [r.tree for r in rows]
    if name == "grpo":
        return leaf_to_nodes(forest, rows, grpo(rewards, groups))
    if name == "dr_grpo":
        return leaf_to_nodes(forest, rows, dr_grpo(rewards, groups))
    if name == "rloo":
        return leaf_to_nodes(forest, rows, rloo(rewards, groups))
    if name == "gigpo":
        return gigpo(forest, rows, omega=omega, gamma=gamma, mode=gigpo_mode)
    if name in ("tree", "treerl"):
        return tree_advantages(forest, rows, style="spo" if name == "tree" else "treerl")
    from toolgym.errors import ConfigError

    raise ConfigError(f"unknown estimator {name!r}; choose one of {', '.join(ESTIMATORS)} (PPO uses GAE)")
