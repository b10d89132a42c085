"""Turn-level estimators: GiGPO and HGPO (step groups by env state) and IGPO (information-gain turn rewards);
each gives one advantage per (row, model turn), broadcast to that turn's nodes (`turn_to_nodes`).

Departures from the papers (docs/trainer.md; numbered as in advantages.py, each is also marked where it
happens):
2. GiGPO's episode level counts each trajectory once (verl-agent counts it once per step row, so long
   trajectories weigh more). Anchor key: (turn index, env state key) when the env reports a state key
   (`info["state_key"]`); otherwise the whole history of env observations up to the turn (a fixed
   message such as "Invalid action" then only matches after the same history). Turns without any key
   form their own (singleton) step group. Similarity mode clusters the observation texts of one turn
   index greedily (difflib ratio >= threshold), like verl-agent's but per turn index.
4. IGPO takes the per-turn rewards as given (the info-gain scorer lives with the rewards); the
   normalisation uses the population std and std 1 for a single value, as the updated official code.
"""

from __future__ import annotations

import difflib
import itertools
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch

from toolgym.trainers.advantages import NodeAdv, NormMode, discounted_returns, group_norm, turn_to_nodes
from toolgym.trainers.tree import RolloutTree, Row, row_turns


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
