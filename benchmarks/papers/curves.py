"""Reading a training run's curve: held-out success against cumulative generated tokens, and the numbers the
comparisons of the papers benchmark and the seed-methods report take off it (success at equal tokens, the
mean over a token range, a 95% interval of a difference of arm means)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

ENTROPY_KEYS = ("losses/entropy", "train/entropy", "charts/entropy")


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def first(rec: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    return next((float(rec[k]) for k in keys if k in rec), None)


def curves(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Eval points (step, cumulative generated tokens, success), entropy per step, totals.

    A resumed run writes the steps after its checkpoint again: the last record of a step wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in records:
        by_step[int(r["step"])] = {**by_step.get(int(r["step"]), {}), **r}
    tokens, evals, entropy, epo, train_success = 0.0, [], [], [], []
    calls, train_calls, eval_calls = 0.0, [(0, 0.0, 0.0)], []
    for step in sorted(by_step):
        r = by_step[step]
        tokens += float(r.get("rollout/generated_tokens", 0.0))
        # tool calls the rollouts spent (mean per episode x episodes), cumulative against tokens
        calls += float(r.get("charts/tool_calls", 0.0)) * float(r.get("rollout/episodes", 0.0))
        if step > 0:
            train_calls.append((step, tokens, calls))
        if "eval/success" in r:
            evals.append((step, tokens, float(r["eval/success"])))
            if "eval/tool_calls" in r:
                eval_calls.append((step, tokens, float(r["eval/tool_calls"])))
        h = first(r, ENTROPY_KEYS)
        if h is not None and step > 0:
            entropy.append((step, h))
        e = first(r, ("losses/epo_entropy", "epo/entropy"))
        if e is not None:
            epo.append((step, e))
        if "charts/success" in r:
            train_success.append((step, float(r["charts/success"])))
    return {
        "evals": evals,
        "entropy": entropy,
        "epo_trajectory_entropy": epo,
        "train_success": train_success,
        "train_tool_calls": train_calls,
        "eval_tool_calls": eval_calls,
        "generated_tokens": tokens,
        "steps": max(by_step, default=0),
    }


def at_tokens(evals: list[tuple[int, float, float]], t: float) -> float | None:
    """Success at `t` cumulative generated tokens, linear between evaluations (None past the last one).

    >>> at_tokens([(0, 0.0, 0.2), (5, 100.0, 0.4), (10, 300.0, 0.6)], 200.0)
    0.5
    """
    for (_, t0, s0), (_, t1, s1) in itertools.pairwise(evals):
        if t0 <= t <= t1:
            return s0 if t1 == t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)
    if evals and abs(evals[-1][1] - t) < 1e-9:
        return evals[-1][2]
    return None


def mean_to(evals: list[tuple[int, float, float]], t: float) -> float | None:
    """Mean success over [0, t] generated tokens (the area under the interpolated curve / t): every
    evaluation up to `t` counts, so one noisy reading moves it less than the value at `t` alone.

    >>> mean_to([(0, 0.0, 0.0), (5, 100.0, 0.4), (10, 300.0, 0.4)], 300.0)
    0.3333333333333333
    """
    if t <= 0 or at_tokens(evals, t) is None:
        return None
    area = 0.0
    for (_, t0, s0), (_, t1, s1) in itertools.pairwise(evals):
        if t0 >= t:
            break
        end = min(t1, t)
        s_end = s1 if end == t1 else s0 + (s1 - s0) * (end - t0) / (t1 - t0)
        area += (end - t0) * (s0 + s_end) / 2
    return area / t


def diff_ci95(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """mean(a) - mean(b) and its 95% interval (Welch's t; Student's t quantile at Welch's degrees of freedom).

    None with fewer than two runs in an arm (no spread to estimate). When both arms have zero spread the
    interval is the point itself.

    >>> d, lo, hi = diff_ci95([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])  # sd 0.1 each, df 4, t 2.776, se 0.0816
    >>> round(d, 3), round(lo, 3), round(hi, 3)
    (0.2, -0.027, 0.427)
    """
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    se2 = va / len(a) + vb / len(b)
    d = ma - mb
    if se2 == 0:
        return d, d, d
    df = se2**2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    half = t_quantile_975(df) * math.sqrt(se2)
    return d, d - half, d + half


def t_quantile_975(df: float) -> float:
    """Student's t 0.975 quantile at real-valued ``df`` (Welch's), by bisection on the t distribution's CDF.

    >>> round(t_quantile_975(4.0), 3), round(t_quantile_975(2.0), 3), round(t_quantile_975(1e6), 3)
    (2.776, 4.303, 1.96)
    """
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < 0.975:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < 0.975 else (lo, mid)
    return (lo + hi) / 2


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for x >= 0: 1 - I_{df/(df+x^2)}(df/2, 1/2) / 2 (the regularised incomplete beta)."""
    return 1.0 - 0.5 * incomplete_beta(df / 2, 0.5, df / (df + x * x))


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta I_x(a, b), by its continued fraction (modified Lentz), on the side
    of x where it converges fast (I_x(a, b) = 1 - I_{1-x}(b, a))."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    frac = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            frac *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return math.exp(log_front) * frac / a


def collapse_events(records: list[dict[str, Any]], window: int = 20, factor: float = 10.0) -> dict[str, Any]:
    """The collapse events the stability papers report, read off one run's metrics.

    - a gradient-norm spike: a step whose `losses/grad_norm` exceeds `factor` x the median of the run's
      previous `window` steps (at least 5 of them);
    - entropy collapse: the first step whose `losses/entropy` falls below 0.2 x its median over the first
      5 steps;
    - success collapse: the first step where the 5-step mean of `charts/success` falls below half of its
      running maximum, once that maximum reached 0.2.

    >>> recs = [{"step": i, "losses/grad_norm": 1.0, "losses/entropy": 2.0, "charts/success": 0.5}
    ...         for i in range(1, 11)]
    >>> recs[7]["losses/grad_norm"] = 50.0
    >>> recs[8]["losses/entropy"] = 0.1
    >>> ev = collapse_events(recs)
    >>> ev["grad_spikes"], ev["entropy_collapse_step"], ev["success_collapse_step"]
    ([8], 9, None)
    """
    by_step: dict[int, dict[str, Any]] = {}
    for r in records:
        by_step[int(r["step"])] = {**by_step.get(int(r["step"]), {}), **r}
    steps = [s for s in sorted(by_step) if s > 0]
    grads = [(s, float(by_step[s]["losses/grad_norm"])) for s in steps if "losses/grad_norm" in by_step[s]]
    spikes = []
    for i, (s, g) in enumerate(grads):
        prev = sorted(x for _, x in grads[max(0, i - window) : i])
        if len(prev) >= 5 and g > factor * _median(prev):
            spikes.append(s)
    ents = [(s, h) for s in steps if (h := first(by_step[s], ENTROPY_KEYS)) is not None]
    entropy_step = None
    if len(ents) > 5:
        base = _median(sorted(h for _, h in ents[:5]))
        entropy_step = next((s for s, h in ents[5:] if h < 0.2 * base), None)
    succ = [(s, float(by_step[s]["charts/success"])) for s in steps if "charts/success" in by_step[s]]
    success_step, best = None, 0.0
    for i in range(4, len(succ)):
        m = sum(x for _, x in succ[i - 4 : i + 1]) / 5
        best = max(best, m)
        if best >= 0.2 and m < best / 2:
            success_step = succ[i][0]
            break
    return {
        "steps": len(steps),
        "grad_spikes": spikes,
        "grad_norm_max": max((g for _, g in grads), default=None),
        "entropy_collapse_step": entropy_step,
        "success_collapse_step": success_step,
    }


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
