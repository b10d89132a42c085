"""The seed-methods report: the run folders of benchmarks/seed_methods.py -> benchmarks/results/seed_methods.md,
seed_methods.json (replay_gain, epo_gain, hiper_gain) and seed_methods.png.

    python benchmarks/seed_methods_report.py --runs DIR [--notes FILE] [--out benchmarks/results]

DIR holds grpo/, replay/, epo/, hiper/ (each with metrics.jsonl), sft/summary.json and summary.json, as
`bash benchmarks/seed_methods.sh run SECONDS` leaves them (runs.tar.gz unpacked), and gpu.txt if copied there.
Each gain is the method's held-out success minus plain GRPO's at EQUAL generated tokens: T* is the smallest
total of the four runs' generated tokens up to their last evaluation, and each run's success at T* is read off
its curve (eval success against cumulative generated tokens, linear between evaluations).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from papers.curves import (  # run as a file: benchmarks/ is on the path
    at_tokens,
    curves,
    mean_to,
    read_metrics,
)

METHODS = ("grpo", "replay", "epo", "hiper")
GAINS = {"replay": "replay_gain", "epo": "epo_gain", "hiper": "hiper_gain"}


def report(runs_dir: Path, out: Path, notes: str = "") -> dict[str, Any]:
    data = {m: curves(read_metrics(runs_dir / m)) for m in METHODS}
    present = [m for m in METHODS if data[m]["evals"]]
    summary_path = runs_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    gpu = (runs_dir / "gpu.txt").read_text().strip() if (runs_dir / "gpu.txt").is_file() else ""
    ends = [data[m]["evals"][-1][1] for m in present]
    t_star = min(ends) if ends else 0.0
    result: dict[str, Any] = {
        "equal_tokens": t_star,
        "success_at_equal_tokens": {m: at_tokens(data[m]["evals"], t_star) for m in present},
        "final_success": {m: data[m]["evals"][-1][2] for m in present},
        "start_success": {m: data[m]["evals"][0][2] for m in present},
        "steps": {m: data[m]["steps"] for m in METHODS},
        "generated_tokens": {m: data[m]["generated_tokens"] for m in METHODS},
    }
    result["mean_success_to_equal_tokens"] = {m: mean_to(data[m]["evals"], t_star) for m in present}
    base = result["success_at_equal_tokens"].get("grpo")
    base_mean = result["mean_success_to_equal_tokens"].get("grpo")
    for m, key in GAINS.items():
        s = result["success_at_equal_tokens"].get(m)
        result[key] = round(s - base, 4) if s is not None and base is not None else None
        s = result["mean_success_to_equal_tokens"].get(m)
        result[f"{key}_mean"] = round(s - base_mean, 4) if s is not None and base_mean is not None else None
    result |= {
        "curves": {m: data[m] for m in METHODS},
        "machine": summary.get("machine", ""),
        "gpus_used": summary.get("gpus"),
        "gpu": gpu,
        "sft": summary.get("sft", {}),
        "rl_return_codes": summary.get("rl_rc", {}),
        "seconds_wall": summary.get("seconds_wall"),
        "commands": summary.get("commands", {}),
    }
    out.mkdir(parents=True, exist_ok=True)
    plot(data, t_star, out / "seed_methods.png")
    (out / "seed_methods.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "seed_methods.md").write_text(markdown(result, notes))
    return result


def plot(data: dict[str, dict[str, Any]], t_star: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for m, d in data.items():
        if d["evals"]:
            a.plot(
                [t / 1e3 for _, t, _ in d["evals"]], [s for _, _, s in d["evals"]], marker="o", ms=3, label=m
            )
        if d["entropy"]:
            b.plot([s for s, _ in d["entropy"]], [h for _, h in d["entropy"]], lw=1.2, label=m)
    a.axvline(t_star / 1e3, color="gray", ls="--", lw=1, label="equal tokens")
    a.set_xlabel("generated tokens (thousands)")
    a.set_ylabel("held-out success (greedy)")
    a.set_ylim(-0.02, 1.02)
    b.set_xlabel("RL step")
    b.set_ylabel("policy entropy (nats / token)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def markdown(r: dict[str, Any], notes: str) -> str:
    rows = [
        "| run | held-out success at start | at equal tokens | gain vs GRPO | mean over 0..T* | gain (mean) "
        "| at the end | steps | generated tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    means = r.get("mean_success_to_equal_tokens", {})
    for m in METHODS:
        gain = "" if m == "grpo" else _f(r.get(GAINS[m]))
        gain_mean = "" if m == "grpo" else _f(r.get(f"{GAINS[m]}_mean"))
        rows.append(
            f"| {m} | {_f(r['start_success'].get(m))} | {_f(r['success_at_equal_tokens'].get(m))} | {gain} | "
            f"{_f(means.get(m))} | {gain_mean} | {_f(r['final_success'].get(m))} | {r['steps'].get(m)} | "
            f"{r['generated_tokens'].get(m, 0):.0f} |"
        )
    sft = r.get("sft") or {}
    md = [
        "# Seed methods vs plain GRPO: replay, EPO, HiPER on sparse-reward Household",
        "",
        f"Machine: {r.get('machine') or '?'} ({r.get('gpus_used')} GPU(s): one GPU shared by the four runs, "
        "or one run per GPU).",
        "",
        f"Equal generated tokens T* = {r['equal_tokens']:.0f} (the smallest total of the four runs up to their "
        "last evaluation); gains are success differences vs plain GRPO at T*, and of the mean success over "
        "0..T* (every evaluation up to T* counts: less noisy than one reading).",
        "",
        *rows,
        "",
        "![held-out success and entropy](seed_methods.png)",
        "",
        f"Warm start: {sft.get('conversations', '?')} expert conversations with subgoal tags, held-out success "
        f"after SFT {_f(sft.get('success_after'))}. RL return codes (None: stopped by the time budget): "
        f"{r.get('rl_return_codes')}.",
        "",
        "Commands (from the repository root):",
        "",
        "```",
        *[f"{k}: {v}" for k, v in (r.get("commands") or {}).items()],
        "report: python benchmarks/seed_methods_report.py --runs DIR",
        "```",
        "",
    ]
    md += [*DESIGN.strip().splitlines(), ""]
    if notes:
        md += [notes.strip(), ""]
    return "\n".join(md)


DESIGN = """
## How the comparison is set up, and what limits it

- **Env.** `toolgym/Household-v0` at an easy level: one room, 8 receptacles, 2 distractors, pick and clean
  tasks, the admissible commands listed, 10 turns, reward 1 on success only (sparse, multi-turn, pure
  Python: no docker or browser). Held-out success = greedy episodes on 64 held-out seeds.
- **Warm start.** SmolLM2-135M-Instruct gets about 0 on this from scratch, so GRPO would see no signal; all
  four runs start from one short SFT on 256 scripted-expert episodes (one epoch). The expert's turns carry
  HiPER's `<subgoal>` tags (one per phase: "take X", "clean X", "put X in/on Y", repeated while it lasts,
  as HiPER's KEEP), so the HiPER run has segments to work with; the envs ignore the tag, and the other
  estimators never read it.
- **Runs.** Same seed, steps, 8 tasks x 8 rollouts per step, lr 1e-5, 2 minibatches, max 32 new tokens a
  turn; they differ only in the method: `replay` (+ `task_pool` 128, refresh 5: replay needs tasks that
  recur, so this run also draws from a fixed pool of 128 tasks while the others see fresh seeds; that is
  part of ARPO's method but confounds the comparison), `epo` (the official defaults: alpha 0.001, so its
  effect on a short run is expected to be small), `estimator=hiper`.
- **Equal tokens.** The four runs share one GPU and a time budget, so they may reach different steps; the
  gains compare success at the same number of generated tokens (see above), not at the same step.
- **Limits.** One seed per method and 64 held-out episodes: a difference below ~0.1 is within noise
  (binomial std at p = 0.5 is 0.06 per run). A few dozen steps of a 135M model say nothing about the
  methods at the papers' scale (7B, hundreds of steps).
"""


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=Path, required=True, help="folder with grpo/, replay/, epo/, hiper/")
    p.add_argument("--notes", type=Path, default=None, help="markdown appended to seed_methods.md")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a = p.parse_args()
    r = report(a.runs, a.out, a.notes.read_text() if a.notes else "")
    print(json.dumps({k: r[k] for k in ("equal_tokens", *GAINS.values(), "final_success")}, indent=2))


if __name__ == "__main__":
    main()
