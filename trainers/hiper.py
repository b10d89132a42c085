"""HiPER's hierarchical advantage estimation (HAE) for plan/execute turns (Peng et al., arXiv 2602.16165;
code JonP07/HiPER-agent). docs/trainer.md ("Add-ons") has the check against the official code.

The policy marks a plan by writing `<subgoal>...</subgoal>` in a turn (toolgym/parsing.py ignores the tag,
as it ignores `<think>`, so every env passes it through). A turn whose subgoal differs from the current one
SWITCHes: it starts a new segment; a turn that repeats the current subgoal word for word, or writes none,
KEEPs it (HiPER's prompt asks for the current subgoal to be copied on KEEP). Turn 0 always starts segment 0.

Critic-free (GRPO, `hae`), for a row with model-turn rewards r_t (the env step rewards; their sum is the
episode reward), segments j = 0..J-1 starting at turn s_j:
- low-level return G^L_t = sum_{u >= t} gamma^(u-t) r_u: the in-segment return bootstrapped at the
  segment's end with the next segment's return, which (no critic) is the return to go;
- high-level return G^H_j = G^L_{s_j}: the segment's turn-discounted reward plus gamma^(length) G^H_{j+1};
- A^E = R - group mean (episode level); A^H_j = G^H_j - mean of G^H_j over the group's rows that have a
  segment j; A^L_t = G^L_t - mean over the group's rows of G^L at the same (segment j, offset in j);
- A_t = A^E + omega_H * A^H_j on the turn that opened segment j (the plan) + omega_L * A^L_t on every turn.

With a critic (PPO, critic=hiper, `hae_gae`): the official HAE with one value head (its single-head
fallback V_high = V_low): turn-level GAE inside each segment, bootstrapped at the segment's end with the
value of the next segment's first turn; segment-level GAE over segments with discount gamma^(length) and
lambda_seg. A^L on every turn's tokens, + A^H on the plan turn's tokens.

Departures: the critic-free estimator uses group means (GiGPO-style anchor groups keyed by segment index
and offset) as its baselines, and adds the episode-level A^E so that a turn whose key no other row shares
still gets the outcome signal; A^H goes on every token of the plan turn (HiPER: only the <subgoal> span's
tokens; the estimator sees turns, not character spans); no <switch> tag (the subgoal's change is the
switch), so no termination advantage and no KEEP penalties.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from toolgym.trainers.advantages import NodeAdv, group_norm, turn_to_nodes
from toolgym.trainers.tree import RolloutTree, Row, row_turns

if TYPE_CHECKING:
    import torch

SUBGOAL = re.compile(r"<subgoal>(.*?)</subgoal>", re.S)


def subgoal(text: str) -> str | None:
    """The subgoal a turn declares, or None.

    >>> subgoal("<subgoal>heat the mug</subgoal> go to microwave 1"), subgoal("go to sink 1")
    ('heat the mug', None)
    """
    m = SUBGOAL.search(text)
    return m.group(1).strip() if m else None


def segments(plans: Sequence[bool]) -> list[int]:
    """Segment index of each turn given whether it starts a new subgoal (SWITCH).

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


def switches(goals: Sequence[str | None]) -> list[bool]:
    """Whether each turn starts a new segment: it declares a subgoal other than the current one.

    >>> switches(["heat mug", "heat mug", None, "cool mug", "heat mug"])
    [True, False, False, True, True]
    """
    out, current = [], None
    for g in goals:
        out.append(g is not None and g != current)
        current = g if g is not None else current
    return out


def returns(rewards: Sequence[float], seg: Sequence[int], gamma: float) -> tuple[list[float], list[float]]:
    """(G^H per segment, G^L per turn) of one row: G^L_t is the discounted return to go, G^H_j = G^L at the
    segment's first turn.

    >>> returns([0.0, 1.0, 0.0, 2.0], [0, 0, 1, 1], 0.5)
    ([0.75, 1.0], [0.75, 1.5, 1.0, 2.0])
    """
    gl = [0.0] * len(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        gl[t] = acc
    gh = [gl[seg.index(j)] for j in range(max(seg) + 1)] if seg else []
    return gh, gl


def turn_texts(tree: RolloutTree, row: Row) -> list[str]:
    """The text of each model turn of a row (the rollout records it as `info["action"]`)."""
    return ["".join(str(tree.nodes[n].info.get("action", "")) for n in t.nodes) for t in row_turns(tree, row)]


def hae_from_parts(
    groups: Sequence[int],
    rewards: Sequence[Sequence[float]],
    plans: Sequence[Sequence[bool]],
    outcome: Sequence[float],
    gamma: float = 1.0,
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
    gamma: float = 1.0,
    omega_high: float = 1.0,
    omega_low: float = 1.0,
) -> NodeAdv:
    """HAE node advantages of a forest (groups = trees); see the module docstring."""
    rewards = [[t.step_reward for t in row_turns(forest[r.tree], r)] for r in rows]
    plans = row_plans(forest, rows)
    outcome = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    per_turn = hae_from_parts([r.tree for r in rows], rewards, plans, outcome, gamma, omega_high, omega_low)
    return turn_to_nodes(forest, rows, per_turn)


def subgoal_fraction(forest: list[RolloutTree], rows: list[Row]) -> float:
    """Fraction of model turns that declare a subgoal (logged as charts/subgoal_fraction)."""
    n = k = 0
    for r in rows:
        texts = turn_texts(forest[r.tree], r)
        n += len(texts)
        k += sum(subgoal(x) is not None for x in texts)
    return k / max(n, 1)


def hae_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor,
    plans: Sequence[Sequence[bool]],
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_seg: float = 0.95,
    bootstrap: torch.Tensor | None = None,
    omega_high: float = 1.0,
    omega_low: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HAE with a turn-level critic (one head: HiPER's single-head fallback), PPO's `critic=hiper`.

    Turn k of a row: V_k = value at its first model token, r_k = the rewards on its tokens; plans[b][k]: turn
    k starts a segment (turn 0 always does). Low level, inside segment j = turns s..e: delta_k = r_k + gamma
    V_next - V_k with V_next = V_{k+1} (at k = e: the next segment's first turn, or `bootstrap` / 0 after the
    last), A^L_k = delta_k + gamma lam A^L_{k+1} (the recursion restarts at each segment's end). High level:
    delta_j = sum_{u=s..e} gamma^(u-s) r_u + gamma^(e-s+1) V_{s_(j+1)} - V_{s_j}, A^H_j = delta_j +
    gamma^(e-s+1) lam_seg A^H_{j+1}.

    rewards, values, mask, turn_ids: [B, T]. Returns (advantages [B, T]: omega_L A^L_k on every model token
    of turn k, + omega_H A^H_j on the tokens of the turn that opened segment j; returns [B, T]: A^L_k + V_k
    on each turn's first token; value_mask [B, T]: 1 on those first tokens).
    """
    import torch

    adv = torch.zeros_like(values)  # [B, T]
    ret = torch.zeros_like(values)  # [B, T]
    vmask = torch.zeros_like(values)  # [B, T]
    on = mask.bool()  # [B, T]
    for b in range(values.shape[0]):
        turns: list[list[int]] = []
        for t in on[b].nonzero().squeeze(1).tolist():
            if not turns or int(turn_ids[b, t]) != int(turn_ids[b, turns[-1][-1]]):
                turns.append([])
            turns[-1].append(t)
        if not turns:
            continue
        flags = [bool(x) for x in plans[b]][: len(turns)]
        seg = segments(flags + [False] * (len(turns) - len(flags)))
        v = [float(values[b, toks[0]]) for toks in turns]
        r = [float(rewards[b, toks].sum()) for toks in turns]
        end_v = float(bootstrap[b]) if bootstrap is not None else 0.0
        starts = [seg.index(j) for j in range(seg[-1] + 1)]
        a_low = [0.0] * len(turns)
        for k in range(len(turns) - 1, -1, -1):
            last_in_seg = k == len(turns) - 1 or seg[k + 1] != seg[k]
            v_next = v[k + 1] if k + 1 < len(turns) else end_v
            delta = r[k] + gamma * v_next - v[k]
            a_low[k] = delta + (0.0 if last_in_seg else gamma * lam * a_low[k + 1])
        a_high = [0.0] * len(starts)
        for j in range(len(starts) - 1, -1, -1):
            s, e = starts[j], (starts[j + 1] - 1 if j + 1 < len(starts) else len(turns) - 1)
            d = e - s + 1
            seg_ret = sum(gamma ** (u - s) * r[u] for u in range(s, e + 1))
            boot = v[starts[j + 1]] if j + 1 < len(starts) else end_v
            nxt = a_high[j + 1] if j + 1 < len(starts) else 0.0
            a_high[j] = seg_ret + gamma**d * boot - v[s] + gamma**d * lam_seg * nxt
        for k, toks in enumerate(turns):
            a = omega_low * a_low[k] + (omega_high * a_high[seg[k]] if k == starts[seg[k]] else 0.0)
            adv[b, toks] = a
            ret[b, toks[0]] = a_low[k] + v[k]
            vmask[b, toks[0]] = 1.0
    return adv, ret, vmask


def row_plans(forest: list[RolloutTree], rows: list[Row]) -> list[list[bool]]:
    """Per row, whether each model turn starts a new segment (its subgoal switches)."""
    return [switches([subgoal(x) for x in turn_texts(forest[r.tree], r)]) for r in rows]
