"""EPO: entropy-regularized policy optimization for multi-turn agents (Xu et al., arXiv 2509.22576).

Three terms on top of the policy loss, all computed from the per-token entropies the forward pass gives
(docs/trainer.md, "Add-ons", has the check against the paper and the official code):

1. Trajectory-level entropy: H(row) = (1/K) sum_k mean_{tokens of turn k} H_t, the mean over the row's
   model turns of each turn's mean token entropy (every turn counts once, long or short).
2. Entropy smoothing: a band [kappa_l Hbar, kappa_h Hbar] around Hbar, the mean of the batch trajectory
   entropies of all earlier steps (the paper's cumulative historical mean; `window` > 0 keeps only the
   last `window` steps). A row outside the band pays the distance to it: P(row) = max(0, lo - H(row)) +
   max(0, H(row) - hi).
3. Adaptive phase weight w(p), p = step / steps: w_start while p <= warmup, then linear to w_end at p = 1
   (conservative early, strong stabilisation late).

L_EPO = -alpha * mean_rows [H(row) - beta * w(p) * P(row)]: the smoothing term sits inside the entropy
coefficient as in the official code (policy_loss = pg_loss - entropy_coeff * (entropy - smooth_coeff *
penalty)). Inside the band the entropy is pushed up with weight alpha; below it with alpha (1 + beta w);
above it with alpha (1 - beta w), so beta w > 1 pushes an entropy above the band back down.
Logged: epo/entropy, epo/band_low, epo/band_high, epo/phase_weight, epo/smooth_penalty.

Departures (reasons in docs/trainer.md): the paper's penalty is an indicator (a constant alpha_P outside the
band, 0 inside; the official code adds a constant mask), which has zero gradient: we use the distance to
the band instead so the term acts; the history is one scalar per step (the code keeps one per turn index);
the first step has no history and no smoothing term (as the code: no history, no penalty).
"""

from __future__ import annotations

from collections import deque

import torch


def trajectory_entropy(ent: torch.Tensor, mask: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """Mean over each row's model turns of the turn's mean token entropy. ent, mask, turn_ids [B, T] -> [B].

    >>> e = torch.tensor([[1.0, 3.0, 6.0, 9.0]]); m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    >>> trajectory_entropy(e, m, torch.tensor([[0, 0, 1, 1]])).tolist()
    [4.0]
    """
    out = []
    for b in range(ent.shape[0]):
        on = mask[b] > 0
        turns = torch.unique(turn_ids[b][on])
        if len(turns) == 0:
            out.append(ent[b].sum() * 0.0)  # keeps the graph; a row with nothing trained adds nothing
            continue
        per_turn = [ent[b][on & (turn_ids[b] == k)].mean() for k in turns]
        out.append(torch.stack(per_turn).mean())
    return torch.stack(out)


def smoothing_penalty(h: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """max(0, lo - h) + max(0, h - hi) per row.

    >>> smoothing_penalty(torch.tensor([0.5, 1.0, 2.5]), 0.8, 2.0).tolist()
    [0.30000001192092896, 0.0, 0.5]
    """
    return torch.relu(lo - h) + torch.relu(h - hi)


def phase_weight(step: int, steps: int, start: float, end: float, warmup: float) -> float:
    """w_start up to progress `warmup`, then linear to w_end at the last step.

    >>> [round(phase_weight(s, 10, 0.1, 1.0, 0.2), 4) for s in (1, 2, 6, 10)]
    [0.1, 0.1, 0.55, 1.0]
    """
    p = step / max(steps, 1)
    if p <= warmup or warmup >= 1.0:
        return start
    return start + (end - start) * (p - warmup) / (1.0 - warmup)


class EntropyBand:
    """The history of batch trajectory entropies and the band [kappa_low Hbar, kappa_high Hbar] around its
    mean Hbar (all steps when `window` is 0, else the last `window`)."""

    def __init__(self, kappa_low: float = 0.5, kappa_high: float = 1.5, window: int = 0) -> None:
        if not 0.0 <= kappa_low <= 1.0 <= kappa_high or window < 0:
            raise ValueError(
                f"need 0 <= kappa_low <= 1 <= kappa_high and window >= 0, got {kappa_low}, {kappa_high}, {window}"
            )
        self.kappa_low, self.kappa_high = kappa_low, kappa_high
        self.history: deque[float] = deque(maxlen=window or None)

    def band(self) -> tuple[float, float] | None:
        """(lo, hi), or None before the first step has been recorded."""
        if not self.history:
            return None
        mean = sum(self.history) / len(self.history)
        return self.kappa_low * mean, self.kappa_high * mean

    def update(self, entropy: float) -> None:
        self.history.append(float(entropy))


def epo_loss(
    ent: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor,
    rows: int,
    alpha: float,
    beta: float,
    weight: float,
    band: tuple[float, float] | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-alpha * sum_rows [H(row) - beta * weight * P(row)] / `rows` (the minibatch's rows that train) for this
    micro-batch's rows, and stats (sums over rows: `entropy_sum`, `penalty_sum`, `rows`)."""
    h = trajectory_entropy(ent, mask, turn_ids)  # [b]
    live = (mask.sum(1) > 0).to(h.dtype)  # [b]
    pen = torch.zeros_like(h)
    if band is not None:
        pen = smoothing_penalty(h, band[0], band[1]) * live
    loss = -alpha * ((h * live).sum() - beta * weight * pen.sum())
    stats = {
        "entropy_sum": float((h * live).sum().detach()),
        "penalty_sum": float(pen.sum().detach()),
        "rows": float(live.sum()),
    }
    return loss / max(rows, 1), stats
