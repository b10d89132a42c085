"""Advantage estimators: a forest of rollout trees + rewards -> an advantage for every trained token.

Departures from the papers (docs/trainer.md; each is also marked where it happens):
1. A group of one gets advantage 0 in every group-normalised estimator (GRPO, RLOO, GiGPO steps,
   IGPO): with no sibling there is no baseline. verl gives a lone GRPO sample its raw reward.
2. GiGPO's episode level counts each trajectory once (verl-agent counts it once per step row, so long
   trajectories weigh more). Anchor key: (turn index, env state key) when the env reports a state key
   (`info["state_key"]`); otherwise the whole history of env observations up to the turn (a fixed
   message such as "Invalid action" then only matches after the same history). Turns without any key
   form their own (singleton) step group. Similarity mode clusters the observation texts of one turn
   index greedily (difflib ratio >= threshold), like verl-agent's but per turn index.
3. Tree estimators give one advantage per segment (the chain between two branch points, tool/env
   messages included; tree.py), as SPO and TreeRL do: `tree` is SPO's V(segment) - V(branch point) with
   V the mean over children (a node's subtrees count once each, however many leaves they hold),
   `spo_std` divides that by the population std of the sibling values (unverified: SPO's code was not
   read for which std), `treerl` is TreeRL's ((V(s) - V(p)) + V(s)) / sqrt(#leaves below s) on
   leave-one-out rewards. `treepo` is TreePO's sub-group baseline (one scalar per row).
4. IGPO takes the per-turn rewards as given (the info-gain scorer lives with the rewards); the
   normalisation uses the population std and std 1 for a single value, as the updated official code.
5. GAE follows verl: tokens with mask 0 (tool/env text) are skipped, value and advantage carried through.

Interface. Most estimators give one number per (row, node): `NodeAdv = list[dict[node_id, float]]`;
`token_advantages` broadcasts it to tokens (0 where the loss mask is 0) and, with `shared="once"`,
averages a node's advantage over the rows that hold it (ARPO's "hard" attribution). GAE works on tokens.
"""

from __future__ import annotations

import difflib
import itertools
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch

from toolgym.trainers.tree import RolloutTree, Row, SharedMode, row_turns, segment_heads

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


def anchor_keys(
    forest: list[RolloutTree], rows: list[Row], similarity: float | None = None
) -> list[list[Hashable]]:
    """GiGPO anchor group key of every (row, turn) (departure 2). [rows][turns]."""
    out: list[list[Hashable]] = []
    texts: dict[tuple[int, int], list[tuple[str, Hashable]]] = defaultdict(list)  # (tree, turn) -> clusters
    for i, r in enumerate(rows):
        keys: list[Hashable] = []
        history: tuple[str | None, ...] = ()
        for j, t in enumerate(row_turns(forest[r.tree], r)):
            history += (t.state_key,)
            if similarity is not None and t.state_text is not None:
                clusters = texts[(r.tree, t.index)]
                match = next(
                    (
                        k
                        for rep, k in clusters
                        if difflib.SequenceMatcher(None, rep, t.state_text).ratio() >= similarity
                    ),
                    None,
                )
                if match is None:
                    match = (r.tree, t.index, "sim", len(clusters))
                    clusters.append((t.state_text, match))
                keys.append(match)
            elif t.state_key is None:
                keys.append((r.tree, "solo", i, j))
            elif t.env_key:
                keys.append((r.tree, t.index, t.state_key))
            else:
                keys.append((r.tree, history))
        out.append(keys)
    return out


def step_returns(forest: list[RolloutTree], rows: list[Row], gamma: float) -> list[list[float]]:
    """Discounted returns of the env step rewards from each turn on. [rows][turns]."""
    return [discounted_returns([t.step_reward for t in row_turns(forest[r.tree], r)], gamma) for r in rows]


def gigpo(
    forest: list[RolloutTree],
    rows: list[Row],
    omega: float = 1.0,
    gamma: float = 0.95,
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm",
    eps: float = 1e-6,
    similarity: float | None = None,
) -> NodeAdv:
    """GiGPO: A(i, t) = A_E(i) + omega * A_S(i, t), broadcast to the nodes of turn t of row i.

    A_E normalises the leaf reward within the tree; A_S normalises the gamma-discounted return of the
    step rewards from turn t on within the anchor group (`anchor_keys`; `similarity` a difflib ratio
    threshold turns on the similarity mode, 0.95 in verl-agent).
    """
    norm: NormMode = "mean" if mode == "mean_norm" else "mean_std"
    episode = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    a_e = group_norm(episode, [r.tree for r in rows], norm, "unbiased", eps)
    keys = anchor_keys(forest, rows, similarity)
    rets = step_returns(forest, rows, gamma)
    flat_keys = [k for ks in keys for k in ks]
    a_s = group_norm([x for xs in rets for x in xs], flat_keys, norm, "unbiased", eps)
    per_turn: list[list[float]] = []
    pos = 0
    for i, ks in enumerate(keys):
        per_turn.append([a_e[i] + omega * a for a in a_s[pos : pos + len(ks)]])
        pos += len(ks)
    return turn_to_nodes(forest, rows, per_turn)


def hgpo(
    forest: list[RolloutTree],
    rows: list[Row],
    history: int = 2,
    gamma: float = 0.95,
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_std_norm",
    alpha: float = 1.0,
    base_group: bool = False,
    eps: float = 1e-6,
) -> NodeAdv:
    """HGPO (ICLR 2026): for k = 1..history+1 the step at turn t is grouped (within its tree) with the
    steps whose last k state keys equal its own; a group of two or more gives
    a_k = (R_t - mean) / (population std + eps) (`mean_std_norm`) or R_t - mean (`mean_norm`), with R_t the
    discounted step return. `base_group` adds k = 0: the GiGPO episode advantage. The step's advantage is
    sum_k w_k a_k over the levels with a_k != 0, w_k = (k+1)^alpha / sum over those levels (k'+1)^alpha.

    Departure: a level k longer than the history so far (t + 1 < k) is skipped, not padded.
    """
    norm: NormMode = "mean" if mode == "mean_norm" else "mean_std"
    rets = step_returns(forest, rows, gamma)
    states = [[t.state_key for t in row_turns(forest[r.tree], r)] for r in rows]
    levels: dict[int, list[float]] = {}  # k -> flat advantage per (row, turn); None-keyed levels skipped
    owners = [(i, j) for i, ss in enumerate(states) for j in range(len(ss))]
    for k in range(1, history + 2):
        keys: list[Hashable] = []
        for i, j in owners:
            hist = tuple(states[i][j - k + 1 : j + 1]) if j + 1 >= k else None
            ok = hist is not None and None not in hist
            keys.append((rows[i].tree, k, hist) if ok else ("skip", k, i, j))
        levels[k] = group_norm([rets[i][j] for i, j in owners], keys, norm, "population", eps)
    if base_group:
        episode = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
        a_e = group_norm(episode, [r.tree for r in rows], norm, "unbiased", eps)
        levels[0] = [a_e[i] for i, _ in owners]
    per_turn: list[list[float]] = [[] for _ in rows]
    for n, (i, _) in enumerate(owners):
        items = [(k, a[n]) for k, a in levels.items() if a[n] != 0.0]
        wsum = sum((k + 1) ** alpha for k, _ in items)
        per_turn[i].append(sum((k + 1) ** alpha * a for k, a in items) / wsum if items else 0.0)
    return turn_to_nodes(forest, rows, per_turn)


def tree_values(
    tree: RolloutTree, leaf_values: dict[int, float], over: Literal["leaves", "children"] = "leaves"
) -> list[float]:
    """V(node) = mean of `leaf_values` over the leaves below it that have a value (`leaves`: TreeRL), or the
    mean of V over its children that have a value below them (`children`: SPO, ALGORITHMS.md 5.3; on an
    unbalanced tree a subtree counts once, however many leaves it holds). 0 where no leaf has a value.

    >>> t = RolloutTree("q", [1]); a = t.add(t.root, "model", [2]); b = t.add(t.root, "model", [3])
    >>> l1, l2 = t.add(a, "model", [4]), t.add(a, "model", [5])
    >>> [tree_values(t, {l1: 1.0, l2: 0.0, b: 0.0}, over)[0] for over in ("leaves", "children")]
    [0.3333333333333333, 0.25]
    """
    if over == "leaves":
        out = []
        for n in tree.nodes:
            ls = [leaf for leaf in tree.subtree_leaves(n.id) if leaf in leaf_values]
            out.append(sum(leaf_values[leaf] for leaf in ls) / len(ls) if ls else 0.0)
        return out
    value: dict[int, float] = {}  # nodes with a valued leaf below them
    stack: list[tuple[int, bool]] = [(tree.root, False)]
    while stack:  # post-order without recursion (paths can be long; split suffixes have larger ids)
        nid, done = stack.pop()
        if not done:
            stack.append((nid, True))
            stack += [(c, False) for c in tree.nodes[nid].children]
            continue
        if nid in leaf_values:
            value[nid] = leaf_values[nid]
        else:
            kids = [value[c] for c in tree.nodes[nid].children if c in value]
            if kids:
                value[nid] = sum(kids) / len(kids)
    return [value.get(n.id, 0.0) for n in tree.nodes]


TreeStyle = Literal["spo", "spo_std", "treerl"]


def tree_advantages(forest: list[RolloutTree], rows: list[Row], style: TreeStyle = "spo") -> NodeAdv:
    """Segment credit (departure 3), the same for every row holding the node.

    With s the segment of a node and p the branch point above it (tree.py `segment_heads`), V the mean over
    children (SPO) or over leaves (TreeRL) (`tree_values`): `spo`: V(s) - V(p); `spo_std`: (V(s) - V(p)) / (population std of V over p's children + 1e-8);
    `treerl`: leaves leave-one-out normalised first, then ((V(s) - V(p)) + V(s)) / sqrt(#leaves below s).
    Only leaves that have a row count (env_error leaves have none).
    """
    per_tree: dict[int, dict[int, float]] = {}
    for ti in sorted({r.tree for r in rows}):
        tree = forest[ti]
        leaves = [r.leaf for r in rows if r.tree == ti]
        raw = {leaf: tree.nodes[leaf].reward or 0.0 for leaf in leaves}
        if style == "treerl":
            raw = dict(zip(leaves, rloo(list(raw.values()), [0] * len(raw)), strict=True))
        v = tree_values(tree, raw, "leaves" if style == "treerl" else "children")
        heads = segment_heads(tree, set(leaves))
        n_leaves = {h: sum(leaf in raw for leaf in tree.subtree_leaves(h)) for h in set(heads.values())}
        adv: dict[int, float] = {}
        for nid, h in heads.items():
            p = tree.nodes[h].parent
            if p is None:
                continue
            a = v[h] - v[p]
            if style == "spo_std":
                sibs = torch.tensor([v[c] for c in tree.nodes[p].children if c in heads], dtype=torch.float64)
                a = a / (sibs.std(unbiased=False).item() + 1e-8)
            elif style == "treerl":
                a = (a + v[h]) / math.sqrt(n_leaves[h])
            adv[nid] = a
        per_tree[ti] = adv
    return [{n: per_tree[r.tree][n] for n in r.nodes if forest[r.tree].nodes[n].trainable} for r in rows]


def treepo(
    forest: list[RolloutTree], rows: list[Row], weight: Literal["average", "group_size"] = "average"
) -> list[float]:
    """TreePO's sub-group baseline, one scalar per row: for each depth d of the row's segment path
    (d = 0 the whole tree, d >= 1 the leaves below the d-th segment head), s_d = R - mean(subgroup_d),
    kept when the subgroup has two or more leaves (d = 0 always). `average`: mean of the kept s_d (the
    official script); `group_size`: sum_d s_d n_d / sum_d n_d (the code's default). TreePO then whitens
    the token advantages over the batch (the trainer's `treepo_whiten`)."""
    out: list[float] = []
    by_tree: dict[int, dict[int, float]] = defaultdict(dict)
    for r in rows:
        by_tree[r.tree][r.leaf] = forest[r.tree].nodes[r.leaf].reward or 0.0
    heads_of = {ti: segment_heads(forest[ti], set(ls)) for ti, ls in by_tree.items()}
    for r in rows:
        tree, rewards = forest[r.tree], by_tree[r.tree]
        seg_heads = list(dict.fromkeys(heads_of[r.tree][n] for n in r.nodes))  # root first
        terms: list[tuple[float, int]] = []
        for d, h in enumerate(seg_heads):
            sub = [rewards[leaf] for leaf in tree.subtree_leaves(h) if leaf in rewards]
            if d == 0 or len(sub) > 1:
                terms.append((rewards[r.leaf] - sum(sub) / len(sub), len(sub)))
        if weight == "group_size":
            out.append(sum(s * n for s, n in terms) / sum(n for _, n in terms))
        else:
            out.append(sum(s for s, _ in terms) / len(terms))
    return out


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
