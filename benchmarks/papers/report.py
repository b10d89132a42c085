"""The papers report: run folders of benchmarks/papers/run.py -> benchmarks/results/papers.{md,json} and one
plot a claim (papers_<claim>.png: held-out success against generated tokens, each seed a thin line, each
arm's mean a thick one).

    python benchmarks/papers/report.py --runs DIR [--out benchmarks/results] [--notes FILE]

Per claim, T* (equal tokens) is the smallest total of generated tokens any of its runs reached by its last
evaluation; each run's success at T* is read off its curve (linear between evaluations), and so is its mean
success over 0..T* (every evaluation counts: less noisy than one reading). A gain is an arm's mean over seeds
minus the baseline's, with a 95% Welch interval over the seeds.

Claims that ask for it also get tool calls (`tool_calls`: calls the training rollouts spent up to T*, read as
`charts/tool_calls` x `rollout/episodes` summed over steps, and held-out calls per episode and per solved task
at T* from `eval/tool_calls` / `eval/success`) and collapse events (`collapse`: gradient-norm spikes, entropy
and success collapses per run, defined in curves.collapse_events).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, when run from anywhere
from papers.claims import CLAIMS, Claim
from papers.curves import at_tokens, collapse_events, curves, diff_ci95, mean_to, read_metrics


def runs_of(folder: Path, arm: str, start: float | None) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """seed -> curve of every `<arm>_s<seed>` run with two or more evaluations (one that died before its
    second has no curve to compare: it would set equal tokens to 0), and the seeds left out for that."""
    out, short = {}, []
    for d in sorted(folder.glob(f"{arm}_s*")):
        if d.is_dir() and d.name[len(arm) + 2 :].isdigit():
            records = read_metrics(d)
            c = curves(records)
            c["collapse"] = collapse_events(records)
            seed = int(d.name[len(arm) + 2 :])
            if start is not None and c["evals"] and c["evals"][0][0] > 0:
                # a trainer that does not evaluate before its first step starts where the warm start ended
                # (the same held-out episodes: GRPO's step-0 reading equals the SFT's last one)
                c["evals"].insert(0, (0, 0.0, start))
            if len(c["evals"]) >= 2:
                out[seed] = c
            else:
                short.append(seed)
    return out, short


def tool_calls(arms: dict[str, dict[int, dict[str, Any]]], t_star: float) -> dict[str, Any]:
    """Per arm and seed: training tool calls up to T*, held-out calls per episode and per solved task at T*."""
    out: dict[str, Any] = {}
    for a, runs in arms.items():
        out[a] = {}
        for s, c in runs.items():
            train = at_tokens(c["train_tool_calls"], t_star)
            calls = at_tokens(c["eval_tool_calls"], t_star) if len(c["eval_tool_calls"]) > 1 else None
            success = at_tokens(c["evals"], t_star)
            per_solved = calls / success if calls is not None and success else None
            out[a][s] = {
                "train_calls_to_t": train,
                "eval_calls_per_episode": calls,
                "eval_calls_per_solved": per_solved,
            }
    return out


def claim_result(claim: Claim, folder: Path) -> dict[str, Any]:
    sft_path = folder / "sft" / "summary.json"
    sft = json.loads(sft_path.read_text()) if sft_path.is_file() else {}
    found = {a.name: runs_of(folder, a.name, sft.get("success_after")) for a in claim.arms}
    arms = {a: runs for a, (runs, _) in found.items()}
    ends = [c["evals"][-1][1] for runs in arms.values() for c in runs.values()]
    t_star = min(ends) if ends else 0.0
    at = {a: {s: at_tokens(c["evals"], t_star) for s, c in runs.items()} for a, runs in arms.items()}
    mean = {a: {s: mean_to(c["evals"], t_star) for s, c in runs.items()} for a, runs in arms.items()}
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    res: dict[str, Any] = {
        "title": claim.title,
        "paper": claim.paper,
        "env": {"id": claim.env_id, "kwargs": claim.env_kwargs, "eval_kwargs": claim.eval_env_kwargs},
        "baseline": claim.baseline,
        "departures": list(claim.departures),
        "level": claim.level_note,
        "folder": claim.dir,
        "needs": list(claim.needs),
        "equal_tokens": t_star,
        "seeds": {a: sorted(runs) for a, runs in arms.items()},
        "seeds_left_out": {a: short for a, (_, short) in found.items() if short},
        "success_at_equal_tokens": at,
        "mean_success_to_equal_tokens": mean,
        "steps": {a: {s: c["steps"] for s, c in runs.items()} for a, runs in arms.items()},
        "generated_tokens": {
            a: {s: c["generated_tokens"] for s, c in runs.items()} for a, runs in arms.items()
        },
        "start_success": {a: {s: c["evals"][0][2] for s, c in runs.items()} for a, runs in arms.items()},
        "sft": sft,
        "rl_return_codes": summary.get("rl_rc", {}),
        "calls": summary.get("calls", []),
        "commands": summary.get("commands", {}),
        "gains": {},
    }
    base = claim.baseline
    for a in arms:
        if a == base:
            continue
        # each comparison at its own equal tokens: the pair's shortest run (a slow arm, e.g. PPO, would
        # otherwise cut every other arm's comparison short)
        pair = [c["evals"][-1][1] for r in (arms[a], arms[base]) for c in r.values()]
        t_pair = min(pair) if pair else 0.0
        g: dict[str, Any] = {}
        for key, fn in (("", at_tokens), ("_curve_mean", mean_to)):
            xs = [v for c in arms[a].values() if (v := fn(c["evals"], t_pair)) is not None]
            ys = [v for c in arms[base].values() if (v := fn(c["evals"], t_pair)) is not None]
            ci = diff_ci95(xs, ys)
            g[f"gain_mean{key}"] = None if ci is None else round(ci[0], 4)
            g[f"gain_ci95{key}"] = None if ci is None else [round(ci[1], 4), round(ci[2], 4)]
        g["seeds"] = min(len(arms[a]), len(arms[base]))
        g["equal_tokens"] = t_pair
        res["gains"][a] = g
    if "tool_calls" in claim.report:
        tc = tool_calls(arms, t_star)
        res["tool_calls"] = tc
        res["tool_calls_gain"] = {}
        for a in arms:
            if a == base:
                continue
            g = {}
            for key in ("train_calls_to_t", "eval_calls_per_solved"):
                xs = [v[key] for v in tc[a].values() if v[key] is not None]
                ys = [v[key] for v in tc[base].values() if v[key] is not None]
                ci = diff_ci95(xs, ys)
                g[key] = (
                    None
                    if ci is None
                    else {"diff": round(ci[0], 2), "ci95": [round(ci[1], 2), round(ci[2], 2)]}
                )
                g[key + "_ratio"] = (
                    round((sum(xs) / len(xs)) / (sum(ys) / len(ys)), 3) if xs and ys and sum(ys) else None
                )
            res["tool_calls_gain"][a] = g
    if "collapse" in claim.report:
        res["collapse"] = {a: {s: c["collapse"] for s, c in runs.items()} for a, runs in arms.items()}
    res["curves"] = {a: {s: c["evals"] for s, c in runs.items()} for a, runs in arms.items()}
    return res


def plot(name: str, res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (arm, runs) in enumerate(res["curves"].items()):
        color = f"C{i}"
        for evals in runs.values():
            ax.plot([t / 1e3 for _, t, _ in evals], [s for _, _, s in evals], color=color, lw=0.7, alpha=0.5)
        if runs:  # the arm's mean on a common grid up to its shortest run
            end = min(e[-1][1] for e in runs.values())
            grid = [end * k / 40 for k in range(41)]
            ys = [sum(at_tokens(e, t) or 0.0 for e in runs.values()) / len(runs) for t in grid]
            ax.plot([t / 1e3 for t in grid], ys, color=color, lw=2.4, label=f"{arm} (n={len(runs)})")
    ax.axvline(res["equal_tokens"] / 1e3, color="gray", ls="--", lw=1, label="equal tokens")
    ax.set_xlabel("generated tokens (thousands)")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_title(res["title"], fontsize=9)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _ci(x: Any) -> str:
    return "n/a" if x is None else f"[{x[0]:+.3f}, {x[1]:+.3f}]"


def tool_calls_md(r: dict[str, Any]) -> list[str]:
    if "tool_calls" not in r:
        return []
    md = ["", "Tool calls (ARPO counts the calls spent in training; fewer at equal accuracy is its claim):", "",
          "| arm | training calls to T* (per seed) | held-out calls / episode at T* | held-out calls / solved task "
          "at T* | training calls vs baseline [95% CI] (ratio) |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for arm, seeds in r["tool_calls"].items():
        col = [", ".join(_f0(v[k]) for v in seeds.values()) for k in ("train_calls_to_t", "eval_calls_per_episode",
                                                                        "eval_calls_per_solved")]  # fmt: skip
        g = r["tool_calls_gain"].get(arm)
        if g is None:
            vs = "baseline"
        else:
            t = g["train_calls_to_t"]
            vs = ("n/a" if t is None else f"{t['diff']:+.1f} [{t['ci95'][0]:+.1f}, {t['ci95'][1]:+.1f}]") + (
                f" ({g['train_calls_to_t_ratio']:.2f}x)" if g["train_calls_to_t_ratio"] is not None else ""
            )
        md.append(f"| {arm} | {col[0]} | {col[1]} | {col[2]} | {vs} |")
    return md


def collapse_md(r: dict[str, Any]) -> list[str]:
    if "collapse" not in r:
        return []
    md = ["", "Collapse events (spike: grad norm > 10x the median of the previous 20 steps; entropy: below 0.2x "
          "its first-5-step median; success: 5-step mean below half its running max >= 0.2):", "",
          "| arm | seed | steps | grad-norm spikes (steps) | max grad norm | entropy collapse at | success collapse at |",
          "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for arm, seeds in r["collapse"].items():
        for s, e in seeds.items():
            spikes = f"{len(e['grad_spikes'])} {e['grad_spikes'][:8]}" if e["grad_spikes"] else "0"
            md.append(f"| {arm} | {s} | {e['steps']} | {spikes} | {_f(e['grad_norm_max'])} | "
                      f"{e['entropy_collapse_step'] or '-'} | {e['success_collapse_step'] or '-'} |")  # fmt: skip
    return md


def _f0(x: Any) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def markdown(results: dict[str, dict[str, Any]], notes: str) -> str:
    md = ["# The founding papers' claims, measured on our envs", ""]
    if notes:
        md += [notes.strip(), ""]
    for name, r in results.items():
        md += [f"## {r['title']} (`{name}`)", "", f"Paper: {r['paper']}.", ""]
        md += [f"Setting: `{r['env']['id']}` {json.dumps(r['env']['kwargs'])}; held-out "
               f"{json.dumps(r['env']['eval_kwargs'])}. Warm start held-out success: "
               f"{_f((r['sft'] or {}).get('success_after'))}.", ""]  # fmt: skip
        if r.get("level"):
            md += [f"Level and warm start: {r['level']}.", ""]
        skipped = [c["skipped"][name] for c in r["calls"] if name in c.get("skipped", {})]
        gated = [c["gate"][r["folder"]] for c in r["calls"] if r["folder"] in c.get("gate", {})]
        if skipped or gated:
            md += [f"Not run in some calls: {'; '.join(map(str, skipped + gated))}.", ""]
        pairs = ", ".join(f"{a} {g['equal_tokens']:.0f}" for a, g in r["gains"].items())
        md += [
            f"Equal generated tokens T* = {r['equal_tokens']:.0f} (all arms; the table's readings); each gain "
            f"is taken at its pair's own T* (vs {r['baseline']}: {pairs}).",
            "",
        ]
        md += ["| arm | seeds | success at T* (per seed) | mean over 0..T* (per seed) | steps | gain at T* [95% CI] "
               "| gain of curve means [95% CI] |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for arm, seeds in r["seeds"].items():
            at = ", ".join(_f(r["success_at_equal_tokens"][arm][s]) for s in seeds)
            mean = ", ".join(_f(r["mean_success_to_equal_tokens"][arm][s]) for s in seeds)
            steps = ", ".join(str(r["steps"][arm][s]) for s in seeds)
            g = r["gains"].get(arm)
            gain = "baseline" if g is None else f"{_f(g['gain_mean'])} {_ci(g['gain_ci95'])}"
            gain_c = "" if g is None else f"{_f(g['gain_mean_curve_mean'])} {_ci(g['gain_ci95_curve_mean'])}"
            md.append(f"| {arm} | {len(seeds)} | {at} | {mean} | {steps} | {gain} | {gain_c} |")
        md += tool_calls_md(r) + collapse_md(r)
        md += ["", f"![{name}](papers_{name}.png)", "", "Departures from the paper's setting:", ""]
        md += [f"- {d}" for d in r["departures"]]
        md += ["", "Commands:", "", "```", *[f"{k}: {v}" for k, v in r["commands"].items()], "```", ""]
        if r["seeds_left_out"]:
            md += [f"Left out (fewer than two evaluations: the run died early): {r['seeds_left_out']}", ""]
        md += [f"Return codes (None: stopped by the time budget, resumable): {r['rl_return_codes']}", ""]
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--notes", default="", help="a markdown file printed under the title")
    a = ap.parse_args()
    runs, out = Path(a.runs), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {n: claim_result(c, runs / c.dir) for n, c in CLAIMS.items() if (runs / c.dir).is_dir()}
    for name, res in results.items():
        plot(name, res, out / f"papers_{name}.png")
    (out / "papers.json").write_text(json.dumps(results, indent=2) + "\n")
    notes = Path(a.notes).read_text() if a.notes else ""
    (out / "papers.md").write_text(markdown(results, notes))
    for name, res in results.items():
        print(name, json.dumps({k: {kk: vv for kk, vv in v.items()} for k, v in res["gains"].items()}))


if __name__ == "__main__":
    main()
