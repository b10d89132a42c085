"""The papers benchmark's driver (device side, resumable): for each claim one shared SFT warm start, then
every arm x seed as its own `toolgym train` process, spread over the machine's GPUs and stopped at a
deadline. A second call on the same machine continues every run from its last checkpoint.

    python benchmarks/papers/run.py run --claims gigpo_household --seeds 3 --runs DIR --seconds 540
    python benchmarks/papers/run.py run --claims all --quick --device cpu --runs /tmp/p   # a tiny CPU smoke
    python benchmarks/papers/run.py configs --claims all --runs DIR                        # only the YAMLs

DIR/<claim>/sft/ is the warm start, DIR/<claim>/<arm>_s<seed>/ each run (metrics.jsonl, config.json),
DIR/<claim>/summary.json the return codes and commands; benchmarks/papers/report.py reads them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, when run from anywhere
from papers.claims import CLAIMS, Claim
from papers.launch import gpu_count, launch, machine, wait, write_yaml

QUIET = {"progress": False, "tensorboard": False}


def sft_config(claim: Claim, folder: Path, model: str, device: str, quick: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "env_ids": [claim.env_id], "env_kwargs": claim.env_kwargs, "eval_env_kwargs": claim.eval_env_kwargs,
        "model": model, "device": device, "eval_before": True, "eval_episodes": claim.rl["eval_episodes"],
        "output_dir": str(folder / "sft"), **QUIET, **claim.sft,
    }  # fmt: skip
    if quick:
        cfg.update(episodes=2, batch_size=2, eval_episodes=1, max_new_tokens=8, steps=1, threads=1)
    return cfg


def run_config(
    claim: Claim, arm: str, seed: int, folder: Path, device: str, engine_memory: float, quick: bool
) -> dict[str, Any]:
    overrides = next(a.overrides for a in claim.arms if a.name == arm)
    cfg: dict[str, Any] = {
        **claim.rl, "env_ids": [claim.env_id], "env_kwargs": claim.env_kwargs,
        "eval_env_kwargs": claim.eval_env_kwargs, "device": device, "seed": seed, "init": str(folder / "sft"),
        "output_dir": str(folder / f"{arm}_s{seed}"), "engine_memory": engine_memory, **QUIET, **overrides,
    }  # fmt: skip
    if quick:
        cfg.update(steps=1, prompts_per_step=1, budget=2, max_new_tokens=8, max_total_tokens=1024, eval_every=1,
                   eval_episodes=1, minibatches=1, micro_batch_rows=2, threads=1,
                   env_kwargs={**claim.env_kwargs, "max_turns": 2})  # fmt: skip
    return cfg


def run(a: argparse.Namespace) -> dict[str, Any]:
    runs = Path(a.runs)
    t0 = time.monotonic()
    deadline = t0 + a.seconds
    py = [sys.executable, "-m", "toolgym"]
    claims = [CLAIMS[c] for c in (list(CLAIMS) if a.claims == ["all"] else a.claims)]
    out: dict[str, Any] = {"machine": machine(a.device), "seconds_budget": a.seconds, "quick": a.quick}
    # 1. the warm starts, side by side (one per claim; a second call reuses them)
    sfts = {}
    for i, claim in enumerate(claims):
        folder = runs / claim.name
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "sft" / "summary.json").is_file():
            continue
        write_yaml(folder / "sft.yaml", sft_config(claim, folder, a.model, a.device, a.quick))
        gpus = gpu_count(a.device)
        sfts[claim.name] = launch(
            [*py, "sft", "--config", str(folder / "sft.yaml")],
            folder / "sft.log",
            i % gpus if gpus > 1 else None,
        )
    codes = wait(sfts, deadline)
    failed = {k: v for k, v in codes.items() if v != 0}
    if failed and not a.quick:  # RL from the bare model would waste the GPU call
        raise SystemExit(f"warm starts failed: {failed} (see DIR/<claim>/sft.log)")
    out["sft_seconds_wall"] = time.monotonic() - t0
    # 2. every arm x seed at once, round-robin over the GPUs, stopped at the deadline
    jobs = [(c, arm.name, s) for c in claims for s in range(1, a.seeds + 1) for arm in c.arms]
    gpus = gpu_count(a.device)
    per_gpu = -(-len(jobs) // max(gpus, 1))
    engine_memory = a.engine_memory or round(min(0.5, 0.6 / per_gpu), 3)
    procs = {}
    for i, (claim, arm, seed) in enumerate(jobs):
        folder = runs / claim.name
        name = f"{claim.name}/{arm}_s{seed}"
        cfg = run_config(claim, arm, seed, folder, a.device, engine_memory, a.quick)
        write_yaml(folder / f"{arm}_s{seed}.yaml", cfg)
        resume = ["--resume"] if (folder / f"{arm}_s{seed}" / "checkpoint" / "state.pt").is_file() else []
        cmd = [*py, "train", "--config", str(folder / f"{arm}_s{seed}.yaml"), *resume]
        procs[name] = launch(cmd, folder / f"{arm}_s{seed}.log", i % gpus if gpus > 1 else None)
    out |= {"gpus": gpus, "runs_per_gpu": per_gpu, "engine_memory": engine_memory}
    out["rl_rc"] = wait(procs, deadline - 5)
    out["seconds_wall"] = time.monotonic() - t0
    for claim in claims:
        path = runs / claim.name / "summary.json"
        old = json.loads(path.read_text()) if path.is_file() else {}
        calls = [*old.get("calls", []), {k: v for k, v in out.items() if k != "rl_rc"}]
        rc = {k.split("/", 1)[1]: v for k, v in out["rl_rc"].items() if k.startswith(claim.name + "/")}
        path.write_text(json.dumps({"calls": calls, "rl_rc": rc, "commands": commands(claim, a)}, indent=2))
    return out


def commands(claim: Claim, a: argparse.Namespace) -> dict[str, str]:
    d = f"{a.runs}/{claim.name}"
    cmds = {
        "device": f"bash benchmarks/papers/device.sh run SECONDS --claims {claim.name} --seeds {a.seeds}",
        "driver": f"python benchmarks/papers/run.py run --claims {claim.name} --seeds {a.seeds} --runs DIR",
        "sft": f"toolgym sft --config {d}/sft.yaml",
        "report": "python benchmarks/papers/report.py --runs DIR",
    }
    for arm in claim.arms:
        cmds[arm.name] = f"toolgym train --config {d}/{arm.name}_sSEED.yaml"
    return cmds


def configs(a: argparse.Namespace) -> None:
    for name in list(CLAIMS) if a.claims == ["all"] else a.claims:
        claim, folder = CLAIMS[name], Path(a.runs) / name
        folder.mkdir(parents=True, exist_ok=True)
        write_yaml(folder / "sft.yaml", sft_config(claim, folder, a.model, a.device, a.quick))
        for arm in claim.arms:
            for seed in range(1, a.seeds + 1):
                cfg = run_config(claim, arm.name, seed, folder, a.device, a.engine_memory or 0.15, a.quick)
                write_yaml(folder / f"{arm.name}_s{seed}.yaml", cfg)
        print(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "configs"):
        p = sub.add_parser(name)
        p.add_argument("--claims", nargs="+", default=["all"], choices=[*CLAIMS, "all"])
        p.add_argument("--runs", default="runs/papers")
        p.add_argument("--seeds", type=int, default=3)
        p.add_argument("--model", default="smollm2-135m")
        p.add_argument("--device", default="auto")
        p.add_argument("--engine-memory", type=float, default=0.0, help="0: 0.6 / runs per GPU")
        p.add_argument(
            "--quick", action="store_true", help="tiny budgets: a smoke test that the pipeline runs"
        )
        if name == "run":
            p.add_argument("--seconds", type=float, default=540, help="wall-clock budget of the whole call")
    a = ap.parse_args()
    if a.cmd == "configs":
        configs(a)
        return
    print(json.dumps(run(a), indent=2))


if __name__ == "__main__":
    main()
