"""One clipped policy-gradient loss with masks and options, the PPO value loss, and the batch filters.

Departures from the papers (docs/trainer.md):
1. Sequence- and turn-level ratios use the GSPO-token form exp(lr_t - sg(lr_t) + sg(mean lr)): the value
   is the geometric-mean ratio of the sequence/turn, the gradient stays per token.
2. The LLDS term is added per token (lambda * gate * max(0, logp_old - logp) on tokens with A >= 0) and
   aggregated with the same mode as the policy loss, not always a masked token mean. (The gate and the
   max are the official code's: `torch.maximum`, half the gradient at an exact tie.)
3. Importance weights for the engine/trainer mismatch (TIS) multiply the policy term only, never the
   KL, entropy or LLDS terms. Mask modes zero the weight outside [is_min, is_max] and keep it inside (TRL).
4. approx_kl is the k3 estimate of KL(old || new) on the token ratio, whatever the ratio level.
5. Overlong shaping clamps at -penalty beyond the maximum length (DAPO's linear ramp, then flat).
6. Importance weights are computed in log space (a summed sequence log-ratio past ~88 overflows exp in
   float32; TRL/verl then get inf * 0 = NaN in the mask modes): mask modes test log(rho) against
   log(bounds), truncate modes clamp log(rho) before exp.
7. The top-entropy-quantile mask (Wang et al. 2025, TRL `top_entropy_quantile`) multiplies the policy
   term only and keeps the denominator, as TRL; the quantile is taken over the micro-batch's trained
   tokens (TRL: over the local batch).

Diagnostics stay on the device: `policy_loss` and `value_loss` return `Stat`s (tensors, no host sync), and
the update loops gather a micro-batch's stats in a `StatLog`, which reads them all with one host sync per
optimizer step (reading each with `float()` waited for the GPU ~30 times per micro-batch).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

Agg = Literal["token_mean", "seq_mean", "seq_mean_token_sum", "constant"]
QUANTILE_MAX = 1 << 24  # torch.quantile refuses larger inputs


@dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2  # lower clip: ratio >= 1 - eps_low
    eps_high: float = 0.28  # upper clip (clip-higher, DAPO); = eps_low for symmetric PPO
    ratio_level: Literal["token", "sequence", "turn"] = "token"  # per-token ratio or GSPO-style mean
    dual_clip: float | None = 3.0  # for A < 0 cap the loss at -A * c (c > 1); None: off
    aepo_clip: bool = False  # AEPO: above 1+eps_high keep a gradient (value (1+eps_high) r / sg(r))
    is_mode: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        "token_truncate"  # correction for engine (rollout) vs trainer logprobs
    )
    is_max: float = 2.0  # TIS cap C (or mask upper bound)
    is_min: float | None = None  # lower bound (truncate: clamp; mask: zero below); None: none
    kl_coef: float = 0.0  # beta of the KL to the reference policy (loss term)
    kl_estimator: Literal["k1", "k2", "k3", "k3+"] = "k3"  # Schulman's estimators; k3+: k3 value, k2 gradient
    objective: Literal["ppo", "cispo"] = "ppo"  # clipped surrogate | CISPO (clipped IS weight REINFORCE)
    cispo_max: float = 5.0  # CISPO: the IS weight sg(min(ratio, cispo_max)) (ScaleRL's eps_max)
    delta: float | None = None  # two-sided clip (INTELLECT-2): the unclipped ratio is capped at delta
    top_entropy_quantile: float = 1.0  # rho: train only the top-rho fraction of tokens by entropy; 1: all
    entropy_coef: float = 0.0  # entropy bonus (subtracted from the loss)
    llds_coef: float = 0.0  # LLDS lambda (0.2 in the paper); 0: off
    llds_gate: Literal["action", "response"] = "action"  # per turn (LLDS-A) or per row (LLDS-R)
    agg: Agg = (
        "token_mean"  # token_mean (DAPO, global) | seq_mean (GRPO) | seq_mean_token_sum | constant (Dr.GRPO)
    )
    max_tokens: int = 1024  # the constant of `agg="constant"` (trained rows * max_tokens)

    def __post_init__(self) -> None:
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (3.0 is usual) or None, got {self.dual_clip}")
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError("eps_low and eps_high must be >= 0")
        if self.delta is not None and self.delta <= 1 + self.eps_high:
            raise ValueError(f"delta must be > 1 + eps_high ({1 + self.eps_high}), got {self.delta}")
        if not 0 < self.top_entropy_quantile <= 1:
            raise ValueError(f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}")


class Stat(NamedTuple):
    """One diagnostic of a loss call, left on the device: the value is `num / den` (0 when `den` is not
    positive), or `num` itself when `den` is None; both are 0-dim tensors. The ratio is taken in Python
    after reading, as a `float(num) / float(den)` read on the spot would."""

    num: torch.Tensor
    den: torch.Tensor | None = None

    def parts(self) -> tuple[torch.Tensor, ...]:
        return (self.num,) if self.den is None else (self.num, self.den)

    @staticmethod
    def combine(num: float, den: float | None) -> float:
        if den is None:
            return num
        return num / den if den > 0 else 0.0


Stats = dict[str, Stat]


def read_all(tensors: Sequence[torch.Tensor]) -> list[float]:
    """The values of 0-dim tensors with one host sync (one stacked tensor, one `.tolist()`). Exact: float32,
    bfloat16 and float16 values convert to float32 (float64 when one of them is) without rounding."""
    if not tensors:
        return []
    device = tensors[0].device
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    return torch.stack([t.detach().reshape(()).to(device=device, dtype=dtype) for t in tensors]).tolist()


def read_stats(stats: Stats) -> dict[str, float]:
    """The values of one loss call's stats (one host sync): for tests and one-off reads.

    >>> read_stats({"a": Stat(torch.tensor(3.0), torch.tensor(4.0)), "b": Stat(torch.tensor(2.0))})
    {'a': 0.75, 'b': 2.0}
    """
    values = iter(read_all([t for s in stats.values() for t in s.parts()]))
    return {
        k: Stat.combine(next(values), next(values) if s.den is not None else None) for k, s in stats.items()
    }


class StatLog:
    """The weighted mean of each stat over the micro-batches of a step, read once per optimizer step.

    `add(stats, weight)` per micro-batch keeps the tensors (no host sync). `read(**extra)` reads every
    pending stat and the `extra` tensors (the grad norm) with one host sync and returns the extras' values;
    it folds the stats into Python sums in the order the micro-batches came, with the arithmetic of reading
    each one with `float()` as it came, so the means are the same to the last bit. `means()`: sum / weight.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Stats, float]] = []
        self.sums: dict[str, float] = {}
        self.weight = 0.0

    def add(self, stats: Stats, weight: float) -> None:
        self._pending.append((stats, weight))

    def read(self, **extra: torch.Tensor) -> dict[str, float]:
        tensors = [t for stats, _ in self._pending for s in stats.values() for t in s.parts()]
        values = iter(read_all(tensors + list(extra.values())))
        for stats, weight in self._pending:
            for k, s in stats.items():
                v = Stat.combine(next(values), next(values) if s.den is not None else None)
                self.sums[k] = self.sums.get(k, 0.0) + v * weight
            self.weight += weight
        self._pending = []
        return {k: next(values) for k in extra}

    def means(self) -> dict[str, float]:
        """Each stat's weighted mean (0 when no weight was added); read the pending stats first."""
        if self._pending:
            raise RuntimeError("StatLog.means() with stats not read yet: call read() first")
        return {k: v / self.weight if self.weight else 0.0 for k, v in self.sums.items()}


class PolicyBatch(NamedTuple):
    """Inputs of `policy_loss`; every tensor is [B, T] (aligned with the tokens they score)."""

    logprobs: torch.Tensor  # current policy, with grad
    old_logprobs: torch.Tensor  # the policy that produced the batch, recomputed by the trainer
    advantages: torch.Tensor
    mask: torch.Tensor  # loss mask (model tokens of kept rows), float or bool
    rollout_logprobs: torch.Tensor | None = None  # engine logprobs (for TIS); None: no correction
    ref_logprobs: torch.Tensor | None = None  # reference policy (for KL)
    entropy: torch.Tensor | None = None  # current policy's token entropy, with grad (for the bonus)
    turn_ids: torch.Tensor | None = None  # long; turn index per token (turn ratio, LLDS-A)


def denominator(mask: torch.Tensor, cfg: LossConfig) -> float:
    """The normaliser of `aggregate` for this batch; sum it over micro-batches (and ranks) for a global one.
    Rows count only when they train a token: a filtered row is not in the loss, so it does not shrink the
    gradient of the others (and a minibatch of filtered rows has denominator 0: no optimizer step)."""
    if cfg.agg == "token_mean":
        return float(mask.sum())
    rows = int((mask.sum(1) > 0).sum())
    return float(rows * (cfg.max_tokens if cfg.agg == "constant" else 1))


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig, denom: float | None = None
) -> torch.Tensor:
    """Reduces [B, T] to a scalar: `token_mean` sum(M L)/tokens | `seq_mean` mean over rows of row means
    (seq-mean-token-mean) | `seq_mean_token_sum` mean over rows of row sums (verl's seq-mean-token-sum) |
    `constant` sum(M L)/(rows * max_tokens) (Dr.GRPO); rows = rows with a trained token.

    >>> L = torch.tensor([[1.0, 3.0], [2.0, 0.0], [5.0, 5.0]]); M = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    >>> aggs = ("token_mean", "seq_mean", "seq_mean_token_sum", "constant")
    >>> [aggregate(L, M, LossConfig(agg=a, max_tokens=4)).item() for a in aggs]
    [2.0, 2.0, 3.0, 0.75]
    """
    m = mask.to(per_token.dtype)  # [B, T]
    denom = denominator(mask, cfg) if denom is None else denom
    if cfg.agg == "seq_mean":
        row = (per_token * m).sum(1) / m.sum(1).clamp(min=1)  # [B]
        return row.sum() / max(denom, 1.0)
    return (per_token * m).sum() / max(denom, 1.0)


def group_mean(x: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Masked mean of x over each row (ids None) or each (row, id) run, broadcast back. [B, T] -> [B, T]."""
    m = mask.to(x.dtype)  # [B, T]
    if ids is None:
        row = (x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)  # [B, 1]
        return row.expand_as(x)
    return _run_sum(x * m, ids) / _run_sum(m, ids).clamp(min=1)  # [B, T]


def _run_sum(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Sum of x over the tokens of each (row, id), broadcast back to those tokens. [B, T] -> [B, T].

    `ids` span at most T values (max - min <= T): turn ids do (-1 on the prompt, then 0, 1, … with a token
    each). The T + 1 slots need no host read of `ids.max()`; an id beyond them is an index error, not a
    wrong sum."""
    idx = (ids - ids.min()).long()  # [B, T] non-negative
    sums = torch.zeros(x.shape[0], x.shape[1] + 1, dtype=x.dtype, device=x.device).scatter_add(
        1, idx, x
    )  # [B, T + 1]
    return sums.gather(1, idx)  # [B, T]


def is_weights(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Truncated/masked importance weights old/rollout (no grad), in log space (departure 6).
    [B, T] -> [B, T] (sequence modes: one weight per row, broadcast).

    `old` is the trainer's recomputed (proximal) logprob, `rollout` the behaviour one the engine sampled with
    (with asynchronous rollouts possibly several versions older: decoupled PPO). Modes: `*_truncate` clamps
    rho to [is_min, is_max] (TIS); `*_mask` keeps rho inside [is_min, is_max] and zeroes it outside (masked
    IS); `token_mask` with both bounds is IcePop's two-sided token mask (the paper's band is [0.5, 5]).

    >>> cfg = LossConfig(is_mode="token_mask", is_min=0.5, is_max=2.0)
    >>> lp = torch.log(torch.tensor([[0.4, 1.0, 3.0]]))
    >>> is_weights(lp, torch.zeros(1, 3), torch.ones(1, 3), cfg).tolist()
    [[0.0, 1.0, 0.0]]
    """
    d = ((old - rollout) * mask).detach()  # [B, T]
    log_rho = d.sum(1, keepdim=True).expand_as(d) if cfg.is_mode.startswith("sequence") else d  # [B, T]
    log_hi = math.log(cfg.is_max)
    log_lo = math.log(cfg.is_min) if cfg.is_min else -math.inf
    if cfg.is_mode.endswith("truncate"):
        return log_rho.clamp(min=log_lo, max=log_hi).exp()
    inside = (log_rho >= log_lo) & (log_rho <= log_hi)  # [B, T]
    return torch.where(inside, log_rho.clamp(max=log_hi).exp(), torch.zeros_like(log_rho))


def kl_penalty(logp: torch.Tensor, ref: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman 2020), with d = ref - logp:
    k1 = -d; k2 = d^2 / 2; k3 = e^d - d - 1 (clamped to [-10, 10] as verl); k3+ = k3's value with k2's
    gradient (verl's straight-through "+"). [B, T] -> [B, T].

    >>> [round(kl_penalty(torch.tensor([0.0]), torch.tensor([1.0]), k).item(), 4) for k in ("k1", "k2", "k3")]
    [-1.0, 0.5, 0.7183]
    """
    d = (ref.detach() - logp).clamp(-20.0, 20.0)  # [B, T]
    if estimator == "k1":
        return -d
    k2 = 0.5 * d**2  # [B, T]
    if estimator == "k2":
        return k2
    k3 = (d.exp() - d - 1).clamp(-10.0, 10.0)  # [B, T]
    if estimator == "k3":
        return k3
    if estimator == "k3+":
        return k2 + (k3 - k2).detach()
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2, k3 or k3+")


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """1 on the trained tokens whose entropy is in the top `rho` fraction (ties kept), else 0. [B, T].

    >>> top_entropy_mask(torch.tensor([[0.1, 0.9, 0.5, 0.3]]), torch.ones(1, 4), 0.5).tolist()
    [[0.0, 1.0, 1.0, 0.0]]
    """
    m = mask.bool()  # [B, T]
    if rho >= 1.0:
        return m.to(entropy.dtype)
    h = entropy.detach().float()  # [B, T]
    if h.numel() <= QUANTILE_MAX:
        # NaN off the trained tokens instead of h[m] (a host sync); no trained token: thr is NaN, keeps none
        thr = torch.nanquantile(torch.where(m, h, torch.nan), 1.0 - rho)
    elif m.any():
        thr = torch.quantile(h[m], 1.0 - rho)
    else:
        return m.to(entropy.dtype)
    return (m & (h >= thr)).to(entropy.dtype)


def policy_loss(
    batch: PolicyBatch, cfg: LossConfig, denom: float | None = None
) -> tuple[torch.Tensor, Stats]:
    """The clipped surrogate with every option of `cfg`; returns (loss, diagnostics left on the device:
    `read_stats`, or a `StatLog` over micro-batches)."""
    logp, old, adv = batch.logprobs, batch.old_logprobs.detach(), batch.advantages.detach()
    m = batch.mask.to(logp.dtype)  # [B, T]
    lr = (logp - old).clamp(-20.0, 20.0)  # [B, T]
    if cfg.ratio_level == "token":
        log_ratio = lr  # [B, T]
    else:
        ids = batch.turn_ids if cfg.ratio_level == "turn" else None
        if cfg.ratio_level == "turn" and ids is None:
            raise ValueError("ratio_level='turn' needs PolicyBatch.turn_ids")
        log_ratio = lr - lr.detach() + group_mean(lr, m, ids).detach()  # [B, T]
    ratio = log_ratio.exp()  # [B, T]
    dual = torch.zeros_like(m, dtype=torch.bool)  # [B, T]
    if cfg.objective == "cispo":  # -sg(min(r, eps_max)) * A * logp: every token keeps a gradient
        pg = -(ratio.detach().clamp(max=cfg.cispo_max)) * adv * logp  # [B, T]
    else:
        clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)  # [B, T]
        if cfg.aepo_clip:
            above = ratio > 1 + cfg.eps_high  # [B, T]
            clipped = torch.where(above, (1 + cfg.eps_high) * ratio / ratio.detach(), clipped)  # [B, T]
        unclipped = ratio if cfg.delta is None else ratio.clamp(max=cfg.delta)  # [B, T]
        pg = torch.maximum(-adv * unclipped, -adv * clipped)  # [B, T]
        if cfg.dual_clip is not None:
            cap = -adv * cfg.dual_clip  # [B, T]
            dual = (adv < 0) & (pg > cap)  # [B, T]
            pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)  # [B, T]
    w = torch.ones_like(m)  # [B, T]
    log_rho = torch.zeros_like(m)  # [B, T] token log(old / rollout), for the spread of the IS ratio
    if batch.rollout_logprobs is not None and cfg.is_mode != "none":
        w = is_weights(old, batch.rollout_logprobs, m, cfg)  # [B, T]
        log_rho = ((old - batch.rollout_logprobs) * m).detach()
    keep = torch.ones_like(m)  # [B, T]
    if cfg.top_entropy_quantile < 1.0:
        if batch.entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs PolicyBatch.entropy")
        keep = top_entropy_mask(batch.entropy, m, cfg.top_entropy_quantile)  # [B, T]
    per_token = pg * w * keep  # [B, T]
    stats: Stats = {}
    if cfg.kl_coef and batch.ref_logprobs is not None:
        kl = kl_penalty(logp, batch.ref_logprobs, cfg.kl_estimator)  # [B, T]
        per_token = per_token + cfg.kl_coef * kl
        stats["kl_ref"] = _mmean(kl, m)
    if cfg.entropy_coef and batch.entropy is not None:
        per_token = per_token - cfg.entropy_coef * batch.entropy
    if cfg.llds_coef:
        per_token = per_token + cfg.llds_coef * llds_penalty(logp, old, adv, m, batch.turn_ids, cfg.llds_gate)
    loss = aggregate(per_token, m, cfg, denom)
    with torch.no_grad():
        r, on = ratio.detach(), m.bool()
        low = (adv < 0) & (r < 1 - cfg.eps_low)
        high = (adv > 0) & (r > 1 + cfg.eps_high)
        stats |= {
            "policy": _mmean(pg * w * keep, m),
            "clipfrac": _mmean((low | high).to(m.dtype), m),
            "clipfrac_low": _mmean(low.to(m.dtype), m),
            "clipfrac_high": _mmean(high.to(m.dtype), m),
            "dual_clipfrac": _mmean(dual.to(m.dtype), m),
            "approx_kl": _mmean((lr.exp() - 1) - lr, m),
            "ratio_mean": _mmean(r, m),
            "is_min": _masked_extreme(w, on, torch.amin),
            "is_mean": _mmean(w, m),
            "is_max": _masked_extreme(w, on, torch.amax),
            "is_masked_fraction": _mmean((w == 0).to(m.dtype), m),  # tokens the IS mask drops
            "is_ratio_spread": _masked_std(log_rho, m),  # std of the token log IS ratio (staleness drift)
            "masked_frac": Stat(1 - m.mean()),
            "logp_pos_adv": _mmean(logp.detach(), m * (adv > 0)),
        }
        if batch.entropy is not None:
            stats["entropy"] = _mmean(batch.entropy.detach(), m)
    return loss, stats


def llds_penalty(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor | None,
    gate: Literal["action", "response"] = "action",
) -> torch.Tensor:
    """LLDS per-token term g * max(0, old - logp) on the preserving set P = {A >= 0, mask}. [B, T] -> [B, T].

    The gate g is 1 where the summed likelihood drop over P is positive, per turn ("action") or per row. The
    max is `torch.maximum`, as the official code (vengdeng/LLDS-...-Search-R1, `dp_actor.py`): at an exact tie
    (no drop) it passes half the gradient (`clamp` would pass all of it).
    """
    d = old.detach() - logp  # [B, T]
    p = ((adv >= 0) & mask.bool()).to(logp.dtype)  # [B, T]
    if gate == "action" and turn_ids is not None:
        drop = _run_sum((d * p).detach(), turn_ids)  # [B, T]
    else:
        drop = (d * p).detach().sum(1, keepdim=True).expand_as(d)  # [B, T]
    return (drop > 0).to(logp.dtype) * torch.maximum(d, torch.zeros_like(d)) * p  # [B, T]


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    clip: float | None = 0.5,
    denom: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """PPO value loss 0.5 * agg(max((V - R)^2, (clip(V, V_old +- clip) - R)^2)). All inputs [B, T]."""
    m = mask.to(values.dtype)  # [B, T]
    err = (values - returns) ** 2  # [B, T]
    if clip is None:
        per_token = err
        frac = Stat(torch.zeros((), device=values.device))
    else:
        vc = old_values + (values - old_values).clamp(-clip, clip)  # [B, T]
        err_c = (vc - returns) ** 2  # [B, T]
        per_token = torch.maximum(err, err_c)  # [B, T]
        frac = _mmean((err_c > err).to(m.dtype), m)
    loss = 0.5 * aggregate(per_token, m, cfg, denom)
    return loss, {"value": Stat(loss.detach()), "value_clipfrac": frac}


def zero_variance_keep(rewards: Sequence[float], groups: Sequence[Hashable], tol: float = 1e-6) -> list[bool]:
    """DAPO dynamic-sampling filter: False for every row of a group whose rewards are all equal.

    >>> zero_variance_keep([1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1])
    [False, False, True, True]
    """
    members: dict[Hashable, list[float]] = defaultdict(list)
    for r, g in zip(rewards, groups, strict=True):
        members[g].append(r)
    spread = {g: max(v) - min(v) for g, v in members.items()}
    return [spread[g] > tol for g in groups]


def accuracy_keep(
    success: Sequence[bool], groups: Sequence[Hashable], low: float = 0.1, high: float = 0.9
) -> list[bool]:
    """SimpleTIR's `acc_filter low_high`: False for every row of a group whose success rate is outside
    [low, high] (too easy or too hard to learn from).

    >>> accuracy_keep([True, True, True, False, False, False], [0, 0, 1, 1, 2, 2], 0.1, 0.9)
    [False, False, True, True, False, False]
    """
    members: dict[Hashable, list[bool]] = defaultdict(list)
    for ok, g in zip(success, groups, strict=True):
        members[g].append(ok)
    rate = {g: sum(v) / len(v) for g, v in members.items()}
    return [low <= rate[g] <= high for g in groups]


def void_keep(void: Sequence[bool]) -> list[bool]:
    """SimpleTIR: a trajectory with a void turn (no tool call and no answer) is kept out of the loss;
    it still counts in its group's reward statistics (filter after computing advantages)."""
    return [not v for v in void]


KL_SHAPING = "kl_shaping"  # leaf info key: the row's KL-in-reward shaping, -kl_coef * sum of its token KLs


def overlong_shaping(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO overlong shaping: 0 up to max_len - buffer, then linear down to -factor at max_len (and beyond).

    >>> [overlong_shaping(n, 100, 20) for n in (70, 80, 90, 100, 130)]
    [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    if buffer <= 0:
        return -factor if length > max_len else 0.0
    expected = max_len - buffer
    return max(min(-(length - expected) / buffer * factor, 0.0), -factor)


def _masked_std(x: torch.Tensor, m: torch.Tensor) -> Stat:
    """The masked standard deviation of x, as a `Stat` (0 where the mask is empty)."""
    n = m.sum().clamp(min=1)
    mean = (x * m).sum() / n
    return Stat((((x - mean) ** 2 * m).sum() / n).sqrt())


def _mmean(x: torch.Tensor, m: torch.Tensor) -> Stat:
    """The masked mean of x, as a `Stat` (0 where the mask is empty)."""
    return Stat((x.detach() * m).sum(), m.sum())


def _masked_extreme(w: torch.Tensor, on: torch.Tensor, reduce: Callable[..., torch.Tensor]) -> Stat:
    """`reduce` (amin/amax) of w over the `on` tokens, 1 when there are none: w[on] would be a host sync."""
    if w.numel() == 0:
        return Stat(torch.ones((), dtype=w.dtype, device=w.device))
    fill = torch.inf if reduce is torch.amin else -torch.inf
    picked = reduce(torch.where(on, w, fill))
    return Stat(torch.where(on.any(), picked, torch.ones_like(picked)))
