"""The papers benchmark's driver (device side, resumable): for each run folder one shared SFT warm start, then
every arm x seed as its own `toolgym train` process, packed into the machine's GPUs by their memory estimates
and stopped at a deadline. A second call on the same machine continues every run from its last checkpoint;
runs that did not fit this call start first in the next one (the least advanced runs go first).

    python benchmarks/papers/run.py run --claims gigpo_household epo_household --seeds 3 --runs DIR --seconds 540
    python benchmarks/papers/run.py run --claims all --quick --device cpu --runs /tmp/p   # a tiny CPU smoke
    python benchmarks/papers/run.py configs --claims all --runs DIR                        # only the YAMLs
    python benchmarks/papers/run.py check --claims all                                     # what this machine lacks

DIR/<folder>/sft/ is the warm start, DIR/<folder>/<arm>_s<seed>/ each run (metrics.jsonl, config.json),
DIR/<folder>/summary.json the return codes and commands; a claim's folder is its name unless it shares
another claim's (claims.py `folder`). benchmarks/papers/report.py reads them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, when run from anywhere
from papers.claims import CLAIMS, Claim
from papers.launch import gpu_count, launch, machine, write_yaml

QUIET = {"progress": False, "tensorboard": False}
CHROMIUMS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def missing(needs: tuple[str, ...]) -> list[str]:
    """What of a claim's `needs` this machine lacks, each with the reason in words."""
    out = []
    for need in needs:
        if need == "bm25s" and importlib.util.find_spec("bm25s") is None:
            out.append("bm25s: not importable (Search-v0's BM25; carry its wheel: device.sh)")
        elif need == "bwrap" and not shutil.which("bwrap"):
            out.append("bwrap: not on PATH (PythonMath-v0's process sandbox; device.sh carries one)")
        elif need == "chromium":
            if not (os.environ.get("TOOLGYM_CHROMIUM") or any(shutil.which(c) for c in CHROMIUMS)):
                out.append("chromium: no Chromium on PATH nor $TOOLGYM_CHROMIUM (Web-v0; PLAN.md)")
            for mod in ("playwright", "miniwob"):
                if importlib.util.find_spec(mod) is None:
                    out.append(f"{mod}: not importable (Web-v0)")
    return out


def owner(folder: str, claims: list[Claim]) -> Claim:
    """The claim whose settings make a folder's warm start: the one named like the folder, else the first."""
    return CLAIMS.get(folder) or next(c for c in claims if c.dir == folder)


def sft_config(claim: Claim, folder: Path, model: str, device: str, quick: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "env_ids": [claim.env_id], "env_kwargs": claim.env_kwargs, "eval_env_kwargs": claim.eval_env_kwargs,
        "model": model, "device": device, "eval_before": False, "eval_episodes": claim.rl["eval_episodes"],
        "output_dir": str(folder / "sft"), **QUIET, **claim.sft,
    }  # fmt: skip
    # eval_before off: every warm start starts at 0 held-out success (the untuned model), and the reading
    # costs a minute of the first call on the long Household episodes
    if quick:
        cfg.update(episodes=2, batch_size=2, eval_episodes=1, max_new_tokens=8, steps=1, threads=1)
        cfg["env_kwargs"] = quick_env(cfg.get("env_kwargs", claim.env_kwargs), max_turns=None)
    return cfg


def quick_env(kwargs: dict[str, Any], max_turns: int | None = 2) -> dict[str, Any]:
    """The smoke's env: short episodes for RL (the expert of an SFT needs its whole episode), few sandboxes."""
    out = dict(kwargs) if max_turns is None else {**kwargs, "max_turns": max_turns}
    if "sandbox_options" in out:
        out["sandbox_options"] = {**out["sandbox_options"], "pool_size": 2}
    return out


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
                   env_kwargs=quick_env(claim.env_kwargs))  # fmt: skip
        if "task_pool" in overrides:
            cfg["task_pool"] = 2
    return cfg


@dataclass
class Job:
    claim: Claim
    arm: str
    seed: int
    gb: float
    done_steps: int

    @property
    def name(self) -> str:
        return f"{self.claim.dir}/{self.arm}_s{self.seed}"


def done_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(ln).get("step", 0) for ln in path.read_text().splitlines() if ln.strip()]
    return int(max(steps, default=0))


def jobs_of(claims: list[Claim], seeds: int, runs: Path, quick: bool, first_seed: int = 1) -> list[Job]:
    """One job per (folder, arm, seed) for seeds first_seed .. first_seed + seeds - 1: arms two claims share in
    one folder run once. Finished runs are left out; the least advanced come first (so repeated calls even
    the runs out)."""
    seen, jobs = set(), []
    for s in range(first_seed, first_seed + seeds):
        for c in claims:
            for arm in c.arms:
                key = (c.dir, arm.name, s)
                if key in seen:
                    continue
                seen.add(key)
                steps = 1 if quick else int(c.rl["steps"])
                done = done_steps(runs / c.dir / f"{arm.name}_s{s}")
                if done < steps:
                    jobs.append(Job(c, arm.name, s, arm.gpu_gb or c.gpu_gb, done))
    return sorted(jobs, key=lambda j: j.done_steps)  # stable: seed-major order among equals


def gpu_memory_gb(device: str) -> list[float]:
    """Usable memory of each visible GPU (90%: the CUDA context, allocator slack)."""
    n = gpu_count(device)
    if n == 0:
        return []
    import torch

    return [0.9 * torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(n)]


# the runs get SIGTERM this long before the deadline: they finish their step and save (preemption)
STOP_S = 45.0
SFT_GB = 20.0  # a warm start's GPU memory (packed rows of <= 3072 tokens, batch 16): a guess, as the runs'


def stop_all(procs: dict[str, subprocess.Popen[bytes]], grace: float = 15.0) -> dict[str, int | None]:
    """SIGTERM to every process at once, SIGKILL to those alive after `grace` seconds (one by one, a dozen
    runs would take a dozen graces: past the call's margin). None: stopped by the deadline (resumable)."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace
    for p in procs.values():
        try:
            p.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return dict.fromkeys(procs)


def gate_of(claim: Claim, folder: Path, a: argparse.Namespace) -> str:
    """Why a folder's RL must not start ("" when it may): no warm start, or one outside the claim's band."""
    path = folder / "sft" / "summary.json"
    if not path.is_file():
        return f"no warm start (see {folder.name}/sft.log)"
    success = json.loads(path.read_text()).get("success_after")
    lo, hi = claim.band
    if not a.quick and not a.ignore_band and success is not None and not lo <= success <= hi:
        return f"warm start held-out {success:.3f} outside [{lo}, {hi}]: retune claims.py sft first"
    return ""


def run(a: argparse.Namespace) -> dict[str, Any]:
    """One event loop to the deadline: the missing warm starts first (one a GPU), and each folder's runs as
    soon as its warm start passed its gate, packed by memory into what the GPUs have left; a finished process
    gives its memory to the runs still waiting (the least advanced first)."""
    runs = Path(a.runs)
    t0 = time.monotonic()
    deadline = t0 + a.seconds
    py = [sys.executable, "-m", "toolgym"]
    wanted = [CLAIMS[c] for c in (list(CLAIMS) if a.claims == ["all"] else a.claims)]
    out: dict[str, Any] = {"machine": machine(a.device), "seconds_budget": a.seconds, "quick": a.quick}
    out["skipped"] = {c.name: m for c in wanted if (m := missing(c.needs))}
    claims = [c for c in wanted if c.name not in out["skipped"]]
    folders = sorted({c.dir for c in claims})
    for f in folders:
        (runs / f).mkdir(parents=True, exist_ok=True)
    capacity = gpu_memory_gb(a.device)
    free = list(capacity)
    slots = a.jobs or (1_000_000 if capacity else 1)  # CPU: one process at a time (shared cores)
    running: dict[str, tuple[subprocess.Popen[bytes], int, float]] = {}  # name -> process, GPU, GB
    codes: dict[str, int | None] = {}
    placed: dict[str, int] = {}
    todo_sft = [f for f in folders if not (runs / f / "sft" / "summary.json").is_file()]
    ready = [f for f in folders if f not in todo_sft]  # warm start there: gate, then queue its runs
    queue: list[Job] = []
    out["gate"] = {}

    def card(gb: float) -> int | None:  # the GPU with the most memory left, if it holds `gb`; -1 on CPU
        if not capacity:
            return -1
        g = max(range(len(free)), key=lambda i: free[i])
        return g if free[g] >= gb else None

    def start(name: str, cmd: list[str], log: Path, g: int, gb: float) -> None:
        running[name] = (launch(cmd, log, g if g >= 0 else None), g, gb)
        placed[name] = g
        if g >= 0:
            free[g] -= gb

    def limit() -> list[str]:
        """The run's own time limit: it stops at a step boundary that leaves its save done before the
        deadline's SIGTERM (a backstop: a step longer than STOP_S would lose its work to the SIGKILL)."""
        return ["--time-limit-s", f"{max(deadline - STOP_S - 15 - time.monotonic(), 1.0):.0f}"]

    while time.monotonic() < deadline - STOP_S:
        for name, (proc, g, gb) in list(running.items()):
            if (rc := proc.poll()) is not None:
                codes[name] = rc
                del running[name]
                if g >= 0:
                    free[g] += gb
                if name.endswith("/sft"):
                    ready.append(name[: -len("/sft")])
        for f in ready:
            group = [c for c in claims if c.dir == f]
            why = gate_of(owner(f, group), runs / f, a)
            if why:
                out["gate"][f] = why
            else:
                queue += jobs_of(group, a.seeds, runs, a.quick, a.first_seed)
        ready = []
        queue.sort(key=lambda j: (j.done_steps, -j.gb))  # least advanced first; big ones first (less waste)
        while todo_sft and len(running) < slots and (g := card(SFT_GB)) is not None:
            f = todo_sft.pop(0)
            write_yaml(
                runs / f / "sft.yaml", sft_config(owner(f, claims), runs / f, a.model, a.device, a.quick)
            )
            start(
                f"{f}/sft",
                [*py, "sft", "--config", str(runs / f / "sft.yaml"), "--resume", "auto", *limit()],
                runs / f / "sft.log",
                g,
                SFT_GB,
            )
        waiting = []
        for j in queue:
            if todo_sft or len(running) >= slots or (g := card(j.gb)) is None:
                waiting.append(j)
                continue
            folder = runs / j.claim.dir
            mem = a.engine_memory or (round(min(0.5, j.claim.kv_gb / capacity[g]), 3) if capacity else 0.15)
            yaml_path = folder / f"{j.arm}_s{j.seed}.yaml"
            write_yaml(yaml_path, run_config(j.claim, j.arm, j.seed, folder, a.device, mem, a.quick))
            # auto: a later call continues the run from its checkpoint in output_dir, if it has one
            cmd = [*py, "train", "--config", str(yaml_path), "--resume", "auto", *limit()]
            start(j.name, cmd, folder / f"{j.arm}_s{j.seed}.log", g, j.gb)
        queue = waiting
        if not running and not todo_sft and not ready:
            break
        time.sleep(1.0)
    codes.update(stop_all({n: p for n, (p, _, _) in running.items()}, grace=STOP_S - 5))  # the deadline
    out |= {"gpus": len(capacity), "gpu_gb": [round(c, 1) for c in capacity], "placed": placed}
    out["sft_rc"] = {k[: -len("/sft")]: v for k, v in codes.items() if k.endswith("/sft")}
    out["rl_rc"] = {k: v for k, v in codes.items() if not k.endswith("/sft")}
    out["not_started"] = [j.name for j in queue] + [f"{f}/sft" for f in todo_sft]
    out["seconds_wall"] = time.monotonic() - t0
    for c in wanted:
        folder = runs / c.dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "summary.json"
        old = json.loads(path.read_text()) if path.is_file() else {}
        call = {k: v for k, v in out.items() if k not in ("rl_rc", "placed")}
        rc = {**old.get("rl_rc", {})}
        rc.update({k.split("/", 1)[1]: v for k, v in out["rl_rc"].items() if k.startswith(c.dir + "/")})
        cmds = {**old.get("commands", {}), **commands(c, a)}
        path.write_text(
            json.dumps({"calls": [*old.get("calls", []), call], "rl_rc": rc, "commands": cmds}, indent=2)
        )
    return out


def _first(a: argparse.Namespace) -> str:
    first = getattr(a, "first_seed", 1)
    return f" --first-seed {first}" if first != 1 else ""


def commands(claim: Claim, a: argparse.Namespace) -> dict[str, str]:
    d = f"DIR/{claim.dir}"
    cmds = {
        f"device ({claim.name})": f"bash benchmarks/papers/device.sh run SECONDS --claims {claim.name} "
        f"--seeds {a.seeds}" + _first(a),
        f"driver ({claim.name})": f"python benchmarks/papers/run.py run --claims {claim.name} --seeds {a.seeds}"
        + _first(a)
        + " --runs DIR",
        "sft": f"toolgym sft --config {d}/sft.yaml",
        "report": "python benchmarks/papers/report.py --runs DIR",
    }
    for arm in claim.arms:
        cmds[arm.name] = f"toolgym train --config {d}/{arm.name}_sSEED.yaml"
    return cmds


def configs(a: argparse.Namespace) -> None:
    claims = [CLAIMS[c] for c in (list(CLAIMS) if a.claims == ["all"] else a.claims)]
    for claim in claims:
        folder = Path(a.runs) / claim.dir
        folder.mkdir(parents=True, exist_ok=True)
        write_yaml(
            folder / "sft.yaml", sft_config(owner(claim.dir, claims), folder, a.model, a.device, a.quick)
        )
        for arm in claim.arms:
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                cfg = run_config(claim, arm.name, seed, folder, a.device, a.engine_memory or 0.08, a.quick)
                write_yaml(folder / f"{arm.name}_s{seed}.yaml", cfg)
        print(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "configs", "check"):
        p = sub.add_parser(name)
        p.add_argument("--claims", nargs="+", default=["all"], choices=[*CLAIMS, "all"])
        if name == "check":
            continue
        p.add_argument("--runs", default="runs/papers")
        p.add_argument("--seeds", type=int, default=3)
        p.add_argument(
            "--first-seed", type=int, default=1,
            help="seeds FIRST .. FIRST+SEEDS-1 (a machine too small for a group: seeds 1-2, then 3 in a later "
            "session, which trains the folder's warm start again: each seed's arms still share one)",
        )  # fmt: skip
        p.add_argument("--model", default="smollm2-135m")
        p.add_argument("--device", default="auto")
        p.add_argument("--engine-memory", type=float, default=0.0, help="0: the claim's kv_gb / GPU memory")
        p.add_argument(
            "--quick", action="store_true", help="tiny budgets: a smoke test that the pipeline runs"
        )
        if name == "run":
            p.add_argument("--seconds", type=float, default=540, help="wall-clock budget of the whole call")
            p.add_argument("--jobs", type=int, default=0, help="runs at a time (0: all that fit; CPU: 1)")
            p.add_argument(
                "--ignore-band",
                action="store_true",
                help="start RL even when a warm start is outside its band",
            )
    a = ap.parse_args()
    if a.cmd == "check":
        claims = [CLAIMS[c] for c in (list(CLAIMS) if a.claims == ["all"] else a.claims)]
        report = {c.name: missing(c.needs) or "ok" for c in claims}
        print(json.dumps(report, indent=2))
        raise SystemExit(1 if any(v != "ok" for v in report.values()) else 0)
    if a.cmd == "configs":
        configs(a)
        return
    print(json.dumps(run(a), indent=2))


if __name__ == "__main__":
    main()
