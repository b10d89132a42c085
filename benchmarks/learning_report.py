"""The learning proof's report: run folders (metrics.jsonl, summary.json) -> benchmarks/results/learning.md,
learning.json and the plots; ``--demo`` prints the demo's line (held-out success before -> after SFT -> after
RL) from the two runs of ``make demo``.

    python benchmarks/learning_report.py --runs DIR [--gpus JSON] [--notes FILE] [--out benchmarks/results]
    python benchmarks/learning_report.py --demo runs/demo_sft runs/demo_rl

DIR holds ``rl_only/`` (run a: GRPO from the instruct model), ``sft/`` and ``sft_rl/`` (run b: the narrow
warm start, then GRPO from it), as ``benchmarks/learning.sh`` leaves them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file ([] when it is missing)."""
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    return read_jsonl(folder / "metrics.jsonl")


def with_minutes(records: list[dict[str, Any]], offset_s: float = 0.0) -> list[dict[str, Any]]:
    """Each record with ``minutes``: wall-clock minutes since the run started (steps' time/step_s summed)."""
    total, out = offset_s, []
    for r in records:
        total += float(r.get("time/step_s", 0.0))
        out.append({**r, "minutes": total / 60})
    return out


def evals(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "eval/success" in r]


def demo_line(sft_dir: Path, rl_dir: Path) -> str:
    """held-out success: before -> after SFT -> after RL, from the demo's two run folders."""
    summary = json.loads((sft_dir / "summary.json").read_text())
    rl = evals(read_metrics(rl_dir))
    after_rl = rl[-1]["eval/success"] if rl else None
    start_rl = rl[0]["eval/success"] if rl and rl[0]["step"] == 0 else summary.get("success_after")
    parts = [
        f"before {summary.get('success_before', float('nan')):.2f}",
        f"after SFT {start_rl:.2f}" if start_rl is not None else "after SFT ?",
        f"after RL {after_rl:.2f}" if after_rl is not None else "after RL ?",
    ]
    return "held-out success (test templates): " + " -> ".join(parts)


def plot(runs: dict[str, list[dict[str, Any]]], warm: float | None, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for label, recs in runs.items():
        ev = evals(recs)
        if ev:
            ax.plot(
                [r["minutes"] for r in ev], [r["eval/success"] for r in ev], marker="o", ms=3, label=label
            )
    if warm is not None:
        ax.axhline(warm, color="gray", ls="--", lw=1, label="narrow SFT warm start alone")
    ax.set_xlabel("minutes of RL on one GPU")
    ax.set_ylabel("held-out success (test templates)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "learning_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    panels = [
        ("held-out success", "eval/success", None),
        ("tool calls per episode (train)", "charts/tool_calls", None),
        ("void share (train)", "charts/void_fraction", None),
        ("episode reward (train)", "charts/episode_reward", None),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(8, 5.2))
    for axis, (title, key, _) in zip(axes.flat, panels, strict=True):
        for label, recs in runs.items():
            pts = [(r["minutes"], r[key]) for r in recs if key in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                axis.plot(xs, ys, lw=1.2, label=label)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("minutes", fontsize=8)
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path = out / "learning_panels.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def with_tokens(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record with ``tokens``: generated tokens of the run so far (rollouts only, not evaluations)."""
    total, out = 0.0, []
    for r in records:
        total += float(r.get("rollout/generated_tokens", 0.0))
        out.append({**r, "tokens": total})
    return out


def at_tokens(records: list[dict[str, Any]], budget: float) -> float | None:
    """Held-out success of the last evaluation made within ``budget`` generated tokens."""
    ev = [r for r in evals(records) if r["tokens"] <= budget]
    return ev[-1]["eval/success"] if ev else None


def branching(runs_dir: Path, out: Path) -> dict[str, Any]:
    """Run c: plain GRPO vs ARPO branching + tree advantages on CalculatorChain-v0, compared at the largest
    number of generated tokens every run reached (``branching_gain``: mean success difference there)."""
    runs = {  # a run that never finished a training step (a crash at start) has nothing to compare
        name: with_tokens(read_metrics(runs_dir / name))
        for name in ("plain_s1", "plain_s2", "arpo_s1", "arpo_s2")
        if any("rollout/generated_tokens" in r for r in read_metrics(runs_dir / name))
    }
    if not runs:
        return {}
    budget = min(recs[-1]["tokens"] for recs in runs.values())
    at = {name: at_tokens(recs, budget) for name, recs in runs.items()}
    arms = {
        arm: [v for k, v in at.items() if k.startswith(arm) and v is not None] for arm in ("plain", "arpo")
    }
    mean = {arm: sum(v) / len(v) if v else None for arm, v in arms.items()}
    sft_path = runs_dir / "branching_sft" / "summary.json"
    sft = json.loads(sft_path.read_text()) if sft_path.is_file() else {}
    result: dict[str, Any] = {
        "branching_token_budget": budget,
        "branching_success_at_budget": at,
        "branching_plain_success": mean["plain"],
        "branching_arpo_success": mean["arpo"],
        "branching_warm_start_success": sft.get("success_after"),
        "branching_steps": {name: recs[-1]["step"] for name, recs in runs.items()},
        "branching_tokens": {name: recs[-1]["tokens"] for name, recs in runs.items()},
    }
    if mean["plain"] is not None and mean["arpo"] is not None:
        result["branching_gain"] = round(mean["arpo"] - mean["plain"], 4)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, recs in runs.items():
        ev = evals(recs)
        style = "-" if name.startswith("arpo") else "--"
        ax.plot(
            [r["tokens"] / 1e6 for r in ev],
            [r["eval/success"] for r in ev],
            style,
            marker="o",
            ms=3,
            label=name,
        )
    ax.axvline(budget / 1e6, color="gray", lw=1, ls=":")
    ax.set_xlabel("generated tokens (millions)")
    ax.set_ylabel("held-out success (test templates)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "learning_branching.png", dpi=110)
    plt.close(fig)
    return result


def report(
    runs_dir: Path, out: Path, gpus: dict[str, str], commands: dict[str, str], notes: str = ""
) -> dict[str, Any]:
    """learning.json, learning.md and the plots from the run folders (rl_only/, sft/, sft_rl/ and, when
    there, rl_only_lenient/: the RL-alone recipe that does not find the tool)."""
    a = with_minutes(read_metrics(runs_dir / "rl_only"))
    a0 = with_minutes(read_metrics(runs_dir / "rl_only_lenient"))
    a_prev = with_minutes(read_metrics(runs_dir / "rl_only_previous"))  # an earlier run of a, for the record
    b = with_minutes(read_metrics(runs_dir / "sft_rl"))
    b_strict = with_minutes(read_metrics(runs_dir / "sft_rl_strict"))
    sft_summary_path = runs_dir / "sft" / "summary.json"
    sft = json.loads(sft_summary_path.read_text()) if sft_summary_path.is_file() else {}
    ev_a, ev_a0, ev_b, ev_bs = evals(a), evals(a0), evals(b), evals(b_strict)
    warm = ev_b[0]["eval/success"] if ev_b and ev_b[0]["step"] == 0 else sft.get("success_after")
    first_60 = next((r for r in ev_a if r["eval/success"] >= 0.6), None)
    result: dict[str, Any] = {
        "rl_only_success": ev_a[-1]["eval/success"] if ev_a else None,
        "rl_only_start_success": ev_a[0]["eval/success"] if ev_a else None,
        "rl_only_best_success": max((r["eval/success"] for r in ev_a), default=None),
        "rl_only_minutes": round(a[-1]["minutes"], 2) if a else None,
        "rl_only_steps": a[-1]["step"] if a else None,
        "rl_only_minutes_to_60": round(first_60["minutes"], 2) if first_60 else None,
        "rl_only_eval_tool_calls": ev_a[-1].get("eval/tool_calls") if ev_a else None,
        "rl_only_success_previous": evals(a_prev)[-1]["eval/success"] if evals(a_prev) else None,
        "rl_only_lenient_success": ev_a0[-1]["eval/success"] if ev_a0 else None,
        "rl_only_lenient_tool_calls": ev_a0[-1].get("eval/tool_calls") if ev_a0 else None,
        "sft_success_before": sft.get("success_before"),
        "warm_start_success": warm,
        "full_distribution_success": ev_b[-1]["eval/success"] if ev_b else None,
        "sft_rl_best_success": max((r["eval/success"] for r in ev_b), default=None),
        "sft_rl_minutes": round(b[-1]["minutes"], 2) if b else None,
        "sft_rl_steps": b[-1]["step"] if b else None,
        "full_distribution_success_strict": ev_bs[-1]["eval/success"] if ev_bs else None,
        "sft_rl_strict_best_success": max((r["eval/success"] for r in ev_bs), default=None),
        "sft_rl_strict_warm_start": ev_bs[0]["eval/success"] if ev_bs and ev_bs[0]["step"] == 0 else None,
        "sft_rl_strict_steps": b_strict[-1]["step"] if b_strict else None,
        "sft_seconds": sft.get("seconds"),
        "sft_conversations": sft.get("conversations"),
        "gpus": gpus,
        "commands": commands,
    }
    if result["full_distribution_success"] is not None and warm is not None:
        result["rl_gain_over_warm_start"] = round(result["full_distribution_success"] - warm, 4)
    out.mkdir(parents=True, exist_ok=True)
    curves = {"a: RL alone (strict answers, tool bonus)": a, "b: narrow SFT, then RL": b}
    if b_strict:
        curves["b_strict: narrow SFT, then RL (a's reward)"] = b_strict
    if a0:
        curves["a0: RL alone (lenient answers)"] = a0
    if a_prev:
        curves["a, previous session's run (older templates)"] = a_prev
    result.update(branching(runs_dir, out))
    plot(curves, warm, out)
    (out / "learning.json").write_text(json.dumps(result, indent=2) + "\n")
    r = result
    table = [
        ("run", "a: RL alone", "b: SFT on 1 op, then RL", "a0: RL alone, lenient"),
        ("held-out success at start", _f(r["rl_only_start_success"]), _f(warm), _f(ev_a0[0]["eval/success"] if ev_a0 else None)),
        ("held-out success at the end", _f(r["rl_only_success"]), _f(r["full_distribution_success"]), _f(r["rl_only_lenient_success"])),
        ("best held-out success", _f(r["rl_only_best_success"]), _f(r["sft_rl_best_success"]), _f(max((x["eval/success"] for x in ev_a0), default=None))),
        ("calculator calls / episode (eval, end)", _f(r["rl_only_eval_tool_calls"]), _f(ev_b[-1].get("eval/tool_calls") if ev_b else None), _f(r["rl_only_lenient_tool_calls"])),
        ("RL steps / minutes of steps", f"{r['rl_only_steps']} / {r['rl_only_minutes']}", f"{r['sft_rl_steps']} / {r['sft_rl_minutes']}",
         f"{a0[-1]['step']} / {round(a0[-1]['minutes'], 2)}" if a0 else "n/a"),
        ("GPU", gpus.get("a", ""), gpus.get("b", ""), gpus.get("a0", "")),
    ]  # fmt: skip
    if b_strict:  # one more column: b with a's reward
        extra = [
            "b_strict: SFT on 1 op, then RL (a's reward)", _f(r["sft_rl_strict_warm_start"]),
            _f(r["full_distribution_success_strict"]), _f(r["sft_rl_strict_best_success"]),
            _f(ev_bs[-1].get("eval/tool_calls") if ev_bs else None),
            f"{r['sft_rl_strict_steps']} / {round(b_strict[-1]['minutes'], 2)}", gpus.get("b_strict", ""),
        ]  # fmt: skip
        table = [(*row, x) for row, x in zip(table, extra, strict=True)]
    if not a0:  # no a0 run: drop its column
        table = [row[:3] + row[4:] for row in table]
    md = ["# Learning: RL alone, and RL past a narrow warm start (SmolLM2-135M-Instruct, Calculator-v0)", ""]
    md += ["![held-out success](learning_curve.png)", ""]
    md += ["| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(table[0])]
    md += ["| " + " | ".join(row) + " |" for row in table[1:]]
    md += ["", "![curves](learning_panels.png)", "", "Commands (from the repository root):", "", "```"]
    md += [f"{k}: {v}" for k, v in commands.items()] + ["```", ""]
    if "branching_gain" in r:
        md += ["## c: branching where credit matters (CalculatorChain-v0, one operation per call)", ""]
        md += ["![success against generated tokens](learning_branching.png)", ""]
        md += [
            "| run | steps | generated tokens | held-out success at the common token budget |",
            "| --- | --- | --- | --- |",
        ]
        md += [
            f"| {k} | {r['branching_steps'][k]} | {r['branching_tokens'][k]:,.0f} | {_f(v)} |"
            for k, v in r["branching_success_at_budget"].items()
        ]
        md += ["", f"Token budget every run reached: {r['branching_token_budget']:,.0f}; warm start alone: "
               f"{_f(r['branching_warm_start_success'])}; plain GRPO {_f(r['branching_plain_success'])}, ARPO + tree "
               f"{_f(r['branching_arpo_success'])}: `branching_gain` {r['branching_gain']:+.3f}.", ""]  # fmt: skip
    if notes:
        md += [notes.strip(), ""]
    (out / "learning.md").write_text("\n".join(md))
    return result


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def curves(files: list[Path], out: Path, title: str) -> Path:
    """Held-out success and calculator calls an episode against minutes of steps, one line per curve file
    (a run's metrics.jsonl, named by its file stem)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for f in files:
        recs = evals(with_minutes(read_jsonl(f)))
        mins = [r["minutes"] for r in recs]
        ax.plot(mins, [r["eval/success"] for r in recs], label=f.stem)
        bx.plot(mins, [r.get("eval/tool_calls", 0.0) for r in recs], label=f.stem)
    ax.set(xlabel="minutes of steps", ylabel="held-out success (test templates)", ylim=(0, 1), title=title)
    bx.set(xlabel="minutes of steps", ylabel="calculator calls an episode (eval)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, help="folder with rl_only/, sft/, sft_rl/")
    p.add_argument("--gpus", default="", help='JSON: the GPU of each run, e.g. {"a": "H100"}')
    p.add_argument("--notes", type=Path, default=None, help="markdown appended to learning.md")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--demo", nargs=2, type=Path, metavar=("SFT_DIR", "RL_DIR"))
    p.add_argument("--curves", nargs="+", type=Path, metavar="JSONL", help="plot these runs' curves to --png")
    p.add_argument("--png", type=Path, default=Path("benchmarks/results/learning_curves.png"))
    p.add_argument("--title", default="")
    args = p.parse_args()
    if args.curves:
        print(curves(args.curves, args.png, args.title))
        return
    if args.demo:
        print(demo_line(*args.demo))
        return
    gpus = json.loads(args.gpus) if args.gpus else {}
    commands = {
        "a": "toolgym train --config trainers/configs/learning_rl_alone.yaml",
        "b (1)": "toolgym sft --config trainers/configs/learning_sft.yaml",
        "b (2)": "toolgym train --config trainers/configs/learning_rl.yaml --init runs/learning_sft",
        "b_strict (2)": "toolgym train --config trainers/configs/learning_rl_strict.yaml --init runs/learning_sft",
        "c (1)": "toolgym sft --config trainers/configs/branching_sft.yaml",
        "c (2)": "toolgym train --config trainers/configs/branching_plain.yaml --init runs/branching_sft --seed S",
        "c (3)": "toolgym train --config trainers/configs/branching_arpo.yaml --init runs/branching_sft --seed S",
        "device": "bash benchmarks/gpu_stage.sh; bash benchmarks/gpu_proofs.sh run 540   # 4 GPUs, by time",
        "report": "python benchmarks/learning_report.py --runs DIR --notes benchmarks/learning_notes.md",
    }
    notes = args.notes.read_text() if args.notes else ""
    print(json.dumps(report(args.runs, args.out, gpus, commands, notes), indent=2))


if __name__ == "__main__":
    main()
