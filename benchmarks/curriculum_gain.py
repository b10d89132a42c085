"""curriculum_gain: generated tokens a curriculum run needs to reach a held-out success at the hardest level,
against training on the hardest level from the start (one GPU, >= 2 seeds each).

Runs (on the GPU host; each writes metrics.jsonl with eval/success every 5 steps):

    for s in 1 2; do
      toolgym train --config trainers/configs/curriculum_calc.yaml --seed $s --output-dir runs/cg_cur_s$s
      toolgym train --config trainers/configs/curriculum_calc_hardest.yaml --seed $s --output-dir runs/cg_hard_s$s
    done
    python benchmarks/curriculum_gain.py --curriculum runs/cg_cur_s1 runs/cg_cur_s2 \
        --hardest runs/cg_hard_s1 runs/cg_hard_s2 [--target 0.3]

The target (default: the lower of the two arms' best mean held-out success, so both reach it) is read
against cumulative ``rollout/generated_tokens``; ``curriculum_gain`` = mean tokens of the hardest-from-start
runs / mean tokens of the curriculum runs to first reach it (> 1: the curriculum is faster). A run that never
reaches it counts its whole budget and is listed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def curve(run: str | Path) -> list[tuple[float, float]]:
    """(cumulative generated tokens, held-out success) at each evaluation of a run."""
    tokens, out = 0.0, []
    for line in (Path(run) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        tokens += float(rec.get("rollout/generated_tokens", 0.0))
        if "eval/success" in rec:
            out.append((tokens, float(rec["eval/success"])))
    return out


def tokens_to_reach(points: list[tuple[float, float]], target: float) -> tuple[float, bool]:
    """Tokens at the first evaluation whose success is >= target (else the last point's, False).

    >>> tokens_to_reach([(0.0, 0.0), (100.0, 0.2), (250.0, 0.4)], 0.3)
    (250.0, True)
    >>> tokens_to_reach([(0.0, 0.0), (100.0, 0.2)], 0.3)
    (100.0, False)
    """
    for tokens, success in points:
        if success >= target:
            return tokens, True
    return (points[-1][0] if points else 0.0), False


def success_at(points: list[tuple[float, float]], tokens: float) -> float:
    """Held-out success of the last evaluation at or before ``tokens`` generated tokens.

    >>> success_at([(0.0, 0.0), (100.0, 0.2), (250.0, 0.4)], 200.0)
    0.2
    """
    return max(((t, s) for t, s in points if t <= tokens), default=(0.0, 0.0))[1]


def gain(curriculum: list[str], hardest: list[str], target: float | None = None) -> dict[str, Any]:
    curves = {r: curve(r) for r in curriculum + hardest}
    if target is None:
        best = [max((s for _, s in curves[r]), default=0.0) for r in curriculum + hardest]
        arm_best = [
            sum(best[: len(curriculum)]) / len(curriculum),
            sum(best[len(curriculum) :]) / len(hardest),
        ]
        target = min(arm_best)
    reach = {r: tokens_to_reach(curves[r], target) for r in curves}
    mean = {
        arm: sum(reach[r][0] for r in runs) / len(runs)
        for arm, runs in (("curriculum", curriculum), ("hardest", hardest))
    }
    budget = min((curves[r][-1][0] for r in curves if curves[r]), default=0.0)
    at_budget = {
        arm: sum(success_at(curves[r], budget) for r in runs) / len(runs)
        for arm, runs in (("curriculum", curriculum), ("hardest", hardest))
    }
    return {
        "curriculum_gain": round(mean["hardest"] / max(mean["curriculum"], 1.0), 3),
        # a hardest-from-start run that never reached the target counted only its whole budget: the gain is
        # then at least this much, not exactly
        "curriculum_gain_is_lower_bound": any(not reach[r][1] for r in hardest),
        "equal_tokens": budget,
        "success_at_equal_tokens": {arm: round(v, 4) for arm, v in at_budget.items()},
        "target_success": round(target, 4),
        "tokens_to_target": {r: reach[r][0] for r in curves},
        "never_reached": [r for r in curves if not reach[r][1]],
        "final_success": {r: (curves[r][-1][1] if curves[r] else None) for r in curves},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--curriculum", nargs="+", required=True, help="run folders of curriculum_calc.yaml")
    ap.add_argument("--hardest", nargs="+", required=True, help="run folders of curriculum_calc_hardest.yaml")
    ap.add_argument("--target", type=float, default=None, help="held-out success to reach")
    ap.add_argument("--out", default="benchmarks/results/curriculum.json")
    args = ap.parse_args()
    result = gain(args.curriculum, args.hardest, args.target)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
