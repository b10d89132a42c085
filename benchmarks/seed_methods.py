"""Seed methods vs plain GRPO on a sparse-reward multi-turn env (issue 19): replay_gain, epo_gain, hiper_gain.

Four `toolgym train` runs with the same model, seed, steps, group size and token limits: plain GRPO, GRPO +
success replay + task selection, GRPO + EPO, and HiPER (estimator=hiper, the prompt asks for <subgoal> tags
through the system prompt the env already shows: the tag is optional, so HiPER's segments appear only as
the model writes them). Each gain is the held-out success of the method minus plain GRPO's (final eval).
Generated tokens per run are recorded beside it (equal budgets: same steps x prompts x budget; the totals
differ only by what the policies chose to generate). Entropy curves: losses/entropy per step.

    python benchmarks/seed_methods.py                       # GPU: SmolLM2-135M on Household-v0, 40 steps
    python benchmarks/seed_methods.py --quick --device cpu  # tiny CPU proof that the script works
Writes benchmarks/results/seed_methods.md and seed_methods.json (or *_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

METHODS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "replay": {"replay": True, "task_pool": 64, "task_filter_refresh": 5},
    "epo": {"epo": True},
    "hiper": {"estimator": "hiper"},
}
GAINS = {"replay": "replay_gain", "epo": "epo_gain", "hiper": "hiper_gain"}


def run(name: str, extra: dict[str, Any], base: dict[str, Any], out: Path) -> dict[str, Any]:
    from toolgym.trainers.grpo import GRPOConfig, train

    folder = out / name
    cfg = GRPOConfig(**{**base, **extra, "output_dir": str(folder)})
    t0 = time.perf_counter()
    last = train(cfg)
    recs = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/success"]) for r in recs if "eval/success" in r]
    return {
        "eval_success": last.get("eval/success", 0.0),
        "eval_curve": evals,
        "train_success_curve": [r.get("charts/success") for r in recs if "charts/success" in r],
        "entropy_curve": [r.get("losses/entropy") for r in recs if "losses/entropy" in r],
        "generated_tokens": sum(r.get("rollout/generated_tokens", 0.0) for r in recs),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="toolgym/Household-v0")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="1 step, 1 task x 2 rollouts, 1 eval episode")
    ap.add_argument("--out", default="runs/seed_methods")
    a = ap.parse_args()
    base: dict[str, Any] = dict(
        env_ids=[a.env], env_kwargs={"max_turns": 12}, model=a.model, device=a.device, steps=a.steps,
        prompts_per_step=8, budget=8, max_new_tokens=48, max_total_tokens=3072, lr=1e-5, eval_every=10,
        eval_episodes=64, tensorboard=False, progress=False, minibatches=2, threads=1,
    )  # fmt: skip
    if a.quick:
        base.update(steps=1, prompts_per_step=1, budget=2, max_new_tokens=8, max_total_tokens=1024,
                    eval_every=0, eval_episodes=1, env_kwargs={"max_turns": 2}, minibatches=1)  # fmt: skip
        METHODS["replay"]["task_pool"] = 2
    out = Path(a.out)
    results = {name: run(name, extra, base, out) for name, extra in METHODS.items()}
    g = results["grpo"]["eval_success"]
    summary: dict[str, Any] = {key: results[m]["eval_success"] - g for m, key in GAINS.items()}
    import torch

    machine = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available() and a.device != "cpu"
        else platform.processor() or "cpu"
    )
    summary.update(
        machine=machine, quick=a.quick, env=a.env, model=a.model, steps=base["steps"], runs=results
    )
    stem = "seed_methods_quick" if a.quick else "seed_methods"
    res = Path(__file__).parent / "results"
    (res / f"{stem}.json").write_text(json.dumps(summary, indent=2))
    lines = [
        f"# Seed methods vs plain GRPO ({'QUICK CPU PROOF: numbers mean nothing' if a.quick else 'comparison'})",
        "",
        f"Command: `python benchmarks/seed_methods.py {'--quick' if a.quick else f'--steps {a.steps}'} --device {a.device}`",
        f"Machine: {machine} (CPU runs share 2 cores with up to 8 engineers). Env {a.env}, model {a.model}, "
        f"{base['steps']} steps x {base['prompts_per_step']} tasks x {base['budget']} rollouts.",
        "",
        "| method | held-out success | gain vs GRPO | generated tokens | seconds |",
        "|---|---|---|---|---|",
    ]
    for m, r in results.items():
        gain = "" if m == "grpo" else f"{r['eval_success'] - g:+.3f}"
        lines.append(
            f"| {m} | {r['eval_success']:.3f} | {gain} | {r['generated_tokens']:.0f} | {r['seconds']:.0f} |"
        )
    lines += ["", "Curves (eval success, train success, entropy per step) are in the JSON file."]
    (res / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
