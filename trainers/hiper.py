"""HiPER's hierarchical advantage estimation (HAE) without a critic (Peng et al., arXiv 2602.16165).

The policy marks a plan by writing `<subgoal>...</subgoal>` in a turn (toolgym/parsing.py ignores the tag,
as it ignores `<think>`, so every env passes it through). A turn with the tag starts a new segment; the
turns up to the next tagged turn execute that subgoal (turn 0 always starts segment 0).

For a row with model-turn rewards r_t (the env step rewards; their sum is the episode reward) and
segments j = 0..J-1:
- segment reward rho_j = sum_{t in j} r_t; high-level return G^H_j = sum_{k >= j} gamma^(k-j) rho_k.
- low-level return of turn t in segment j: G^L_t = sum_{t <= u <= end_j} gamma^(u-t) r_u
  + gamma^(end_j - t + 1) G^H_{j+1} (bootstrapped at the segment boundary; 0 after the last segment).
- A^E = R - group mean (episode level); A^H_j = G^H_j - mean of G^H_j over the group's rows that have
  a segment j; A^L_t = G^L_t - mean over the group's rows of G^L at the same (segment j, offset in j).
- A_t = A^E + omega_H * A^H_j on the turn that opened segment j (the plan) + omega_L * A^L_t on every
  turn (execution).

Departures: HiPER trains a two-headed critic and runs GAE at both levels; here both baselines are
group means (GiGPO-style anchor groups keyed by segment index and offset), so a key held by one row
gives 0. The paper's SWITCH/KEEP decision is the presence of the tag. A row without any tag is one
segment: HAE then is GRPO's mean-centred episode advantage plus a GiGPO-like step term.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from toolgym.trainers.advantages import NodeAdv, group_norm, turn_to_nodes
from toolgym.trainers.tree import RolloutTree, Row, row_turns

SUBGOAL = re.compile(r"<subgoal>(.*?)</subgoal>", re.S)


def subgoal(text: str) -> str | None:
    """The subgoal a turn declares, or None.

    >>> subgoal("<subgoal>heat the mug</subgoal> go to microwave 1"), subgoal("go to sink 1")
    ('heat the mug', None)
    """
    m = SUBGOAL.search(text)
    return m.group(1).strip() if m else None


def segments(plans: Sequence[bool]) -> list[int]:
    """Segment index of each turn given whether it declares a subgoal.

    >>> segments([True, False, True, False, False])
    [0, 0, 1, 1, 1]
    >>> segments([False, True])
    [0, 1]
    """
    out, j = [], 0
    for t, p in enumerate(plans):
        if p and t > 0:
            j += 1
        out.append(j)
    return out


def returns(rewards: Sequence[float], seg: Sequence[int], gamma: float) -> tuple[list[float], list[float]]:
    """(G^H per segment, G^L per turn) of one row.

    >>> returns([0.0, 1.0, 0.0, 2.0], [0, 0, 1, 1], 0.5)
    ([2.0, 2.0], [1.0, 2.0, 1.0, 2.0])
    """
    n = (max(seg) + 1) if seg else 0
    rho = [0.0] * n
    for r, j in zip(rewards, seg, strict=True):
        rho[j] += r
    gh = [0.0] * n
    acc = 0.0
    for j in range(n - 1, -1, -1):
        acc = rho[j] + gamma * acc
        gh[j] = acc
    gl = [0.0] * len(rewards)
    for t in range(len(rewards) - 1, -1, -1):
        j = seg[t]
        if t == len(rewards) - 1 or seg[t + 1] != j:
            nxt = gh[j + 1] if j + 1 < n else 0.0
            gl[t] = rewards[t] + gamma * nxt
        else:
            gl[t] = rewards[t] + gamma * gl[t + 1]
    return gh, gl


def turn_texts(tree: RolloutTree, row: Row) -> list[str]:
    """The text of each model turn of a row (the rollout records it as `info["action"]`)."""
    return ["".join(str(tree.nodes[n].info.get("action", "")) for n in t.nodes) for t in row_turns(tree, row)]


def hae_from_parts(
    groups: Sequence[int],
    rewards: Sequence[Sequence[float]],
    plans: Sequence[Sequence[bool]],
    outcome: Sequence[float],
    gamma: float = 0.95,
    omega_high: float = 1.0,
    omega_low: float = 1.0,
) -> list[list[float]]:
    """Per-turn HAE advantages of rows given their group, turn rewards, plan flags and outcome reward.

    >>> hae_from_parts([0, 0], [[0.0, 1.0], [0.0, 0.0]], [[True, True], [True, False]], [1.0, 0.0], 1.0)
    [[1.5, 0.5], [-1.5, -0.5]]
    """
    a_e = group_norm(list(outcome), list(groups), "mean")
    segs = [segments(p) for p in plans]
    parts = [returns(r, s, gamma) for r, s in zip(rewards, segs, strict=True)]
    hi_vals, hi_keys, lo_vals, lo_keys = [], [], [], []
    for i, (s, (gh, gl)) in enumerate(zip(segs, parts, strict=True)):
        for j, g in enumerate(gh):
            hi_vals.append(g)
            hi_keys.append((groups[i], j))
        for t, g in enumerate(gl):
            lo_vals.append(g)
            lo_keys.append((groups[i], s[t], t - s.index(s[t])))
    a_h = group_norm(hi_vals, hi_keys, "mean")
    a_l = group_norm(lo_vals, lo_keys, "mean")
    out: list[list[float]] = []
    ph = pl = 0
    for i, (s, (gh, gl)) in enumerate(zip(segs, parts, strict=True)):
        row_h = a_h[ph : ph + len(gh)]
        ph += len(gh)
        adv = []
        for t in range(len(gl)):
            a = a_e[i] + omega_low * a_l[pl + t]
            if t == s.index(s[t]):  # the turn that opened segment s[t]
                a += omega_high * row_h[s[t]]
            adv.append(a)
        pl += len(gl)
        out.append(adv)
    return out


def hae(
    forest: list[RolloutTree],
    rows: list[Row],
    gamma: float = 0.95,
    omega_high: float = 1.0,
    omega_low: float = 1.0,
) -> NodeAdv:
    """HAE node advantages of a forest (groups = trees); see the module docstring."""
    rewards, plans = [], []
    for r in rows:
        tree = forest[r.tree]
        rewards.append([t.step_reward for t in row_turns(tree, r)])
        plans.append([subgoal(x) is not None for x in turn_texts(tree, r)])
    outcome = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    per_turn = hae_from_parts([r.tree for r in rows], rewards, plans, outcome, gamma, omega_high, omega_low)
    return turn_to_nodes(forest, rows, per_turn)


def subgoal_fraction(forest: list[RolloutTree], rows: list[Row]) -> float:
    """Fraction of model turns that declare a subgoal (logged as hiper/subgoal_fraction)."""
    n = k = 0
    for r in rows:
        texts = turn_texts(forest[r.tree], r)
        n += len(texts)
        k += sum(subgoal(x) is not None for x in texts)
    return k / max(n, 1)
