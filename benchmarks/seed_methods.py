"""Seed methods vs plain GRPO on a sparse-reward multi-turn env: the runs behind replay_gain,
epo_gain and hiper_gain.

One warm start, then four RL runs side by side on one GPU (separate processes; on a machine with several
GPUs one run per GPU), identical but for the method:
plain GRPO, GRPO + success replay + task selection (ARPO), GRPO + EPO, and HiPER (estimator=hiper). The env
is an easy Household level (one room, 8 receptacles, pick and clean tasks, admissible commands listed,
10 turns, reward 1 on success only): SmolLM2-135M solves ~0 of it from scratch, so every run starts from a
short SFT on the scripted expert's episodes, whose turns carry HiPER's `<subgoal>` tags (one subgoal per
phase: "take X", "clean X", "put X in/on Y", copied word for word while it lasts, as HiPER's KEEP). Every run
sees the same tags; only HiPER's estimator reads them (the envs ignore the tag like `<think>`).

    python benchmarks/seed_methods.py run --runs DIR --seconds 480        # device side (seed_methods.sh)
    python benchmarks/seed_methods.py run --runs DIR --quick --device cpu  # tiny CPU smoke (tiny budgets)
    python benchmarks/seed_methods.py data --out FILE --episodes 256       # only the SFT conversations

`run` writes DIR/sft/ (the warm start), DIR/{grpo,replay,epo,hiper}/ (metrics.jsonl, config.json, log)
and DIR/summary.json; benchmarks/seed_methods_report.py turns them into benchmarks/results/seed_methods.*.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from papers.launch import (  # run as a file: benchmarks/ is on the path
    gpu_count,
    launch,
    machine,
    wait,
    write_yaml,
)

ENV_ID = "toolgym/Household-v0"
ENV_KWARGS: dict[str, Any] = {
    "rooms": 1,
    "receptacles": 8,
    "distractors": 2,
    "task_types": ["pick", "clean"],
    "list_commands": True,
    "max_turns": 10,
}
METHODS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "replay": {"replay": True, "task_pool": 128, "task_filter_refresh": 5},
    "epo": {"epo": True},
    "hiper": {"estimator": "hiper"},
}
GAINS = {"replay": "replay_gain", "epo": "epo_gain", "hiper": "hiper_gain"}
# the command that ends each phase of an expert episode, and the subgoal it names ("take X from Y" -> "take X")
PHASE_END = re.compile(r"^(take|clean|heat|cool|use|put)\s+(.+?)(?:\s+(?:from|with)\s+.*)?$")


def subgoals(commands: list[str]) -> list[str]:
    """The subgoal of each expert command: the phase-ending command it leads to (its object part).

    >>> subgoals(["go to countertop 1", "take mug 1 from countertop 1", "go to sinkbasin 1",
    ...           "clean mug 1 with sinkbasin 1", "put mug 1 in/on cabinet 1"])
    ['take mug 1', 'take mug 1', 'clean mug 1', 'clean mug 1', 'put mug 1 in/on cabinet 1']
    """
    out: list[str] = [""] * len(commands)
    current = ""
    for i in range(len(commands) - 1, -1, -1):
        m = PHASE_END.match(commands[i].strip())
        if m:
            current = f"{m.group(1)} {m.group(2)}"
        out[i] = current or commands[i].strip()
    return out


def with_subgoals(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with each assistant command prefixed by its `<subgoal>...</subgoal>`."""
    idx = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    goals = subgoals([str(messages[i]["content"]) for i in idx])
    out = [dict(m) for m in messages]
    for i, g in zip(idx, goals, strict=True):
        out[i]["content"] = f"<subgoal>{g}</subgoal> {messages[i]['content']}"
    return out


def write_data(path: Path, episodes: int, seed: int = 0) -> int:
    """The scripted expert's successful episodes with subgoal tags, as SFT JSONL; returns how many."""
    from toolgym.trainers.sft import expert_conversations

    convs = expert_conversations([ENV_ID], ENV_KWARGS, episodes, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for messages, tools in convs:
            f.write(json.dumps({"messages": with_subgoals(messages), "tools": tools}) + "\n")
    return len(convs)


def sft_config(runs: Path, model: str, device: str, quick: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "env_ids": [ENV_ID], "env_kwargs": ENV_KWARGS, "model": model, "device": device,
        "data": str(runs / "sft_data.jsonl"), "epochs": 1, "batch_size": 16, "lr": 5.0e-5,
        "max_new_tokens": 32, "max_total_tokens": 2048, "eval_before": False, "eval_episodes": 64,
        "output_dir": str(runs / "sft"), "progress": False, "tensorboard": False,
    }  # fmt: skip
    if quick:
        cfg.update(batch_size=2, eval_episodes=1, max_new_tokens=8, steps=1, threads=1)
    return cfg


def rl_config(name: str, runs: Path, model: str, device: str, steps: int, quick: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "algorithm": "grpo", "env_ids": [ENV_ID], "env_kwargs": ENV_KWARGS, "device": device,
        "steps": steps, "prompts_per_step": 8, "budget": 8, "max_new_tokens": 32, "max_total_tokens": 2048,
        "temperature": 1.0, "lr": 1.0e-5, "minibatches": 2, "micro_batch_rows": 16, "eval_every": 5,
        "eval_episodes": 64, "save_every": 5, "seed": 0, "output_dir": str(runs / name), "progress": False,
        "tensorboard": False, "engine_memory": 0.15, **METHODS[name],
    }  # fmt: skip
    if (runs / "sft" / "model").is_dir():
        cfg["init"] = str(runs / "sft")
    else:
        cfg["model"] = model
    if quick:
        cfg.update(prompts_per_step=1, budget=2, max_new_tokens=8, max_total_tokens=1024, eval_every=1,
                   eval_episodes=1, minibatches=1, micro_batch_rows=2, threads=1,
                   env_kwargs={**ENV_KWARGS, "max_turns": 2})  # fmt: skip
        if name == "replay":
            cfg["task_pool"] = 2
    return cfg


def run(a: argparse.Namespace) -> dict[str, Any]:
    runs = Path(a.runs)
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + a.seconds
    py = [sys.executable, "-m", "toolgym"]
    summary: dict[str, Any] = {"machine": machine(a.device), "seconds_budget": a.seconds, "quick": a.quick}
    # 1. the warm start (once: a second call on the same machine reuses it)
    if not (runs / "sft" / "summary.json").is_file():
        n = write_data(runs / "sft_data.jsonl", 2 if a.quick else a.sft_episodes)
        summary["sft_conversations"] = n
        write_yaml(runs / "sft.yaml", sft_config(runs, a.model, a.device, a.quick))
        p = launch([*py, "sft", "--config", str(runs / "sft.yaml")], runs / "sft.log")
        summary["sft_rc"] = wait({"sft": p}, deadline)["sft"]
        if summary["sft_rc"] != 0 and not a.quick:  # RL from the bare model would waste the GPU call
            (runs / "summary.json").write_text(json.dumps(summary, indent=2))
            raise SystemExit(f"the SFT warm start failed (rc {summary['sft_rc']}): see {runs / 'sft.log'}")
    sft_summary = runs / "sft" / "summary.json"
    if sft_summary.is_file():
        summary["sft"] = json.loads(sft_summary.read_text())
    summary["sft_seconds_wall"] = time.monotonic() - t0
    # 2. the four RL runs side by side, stopped at the deadline
    procs = {}
    gpus = gpu_count(a.device)  # several GPUs: one run on each (round-robin); one GPU: all four share it
    summary["gpus"] = gpus
    for i, name in enumerate(a.only or list(METHODS)):
        cfg = rl_config(name, runs, a.model, a.device, 1 if a.quick else a.steps, a.quick)
        write_yaml(runs / f"{name}.yaml", cfg)
        gpu = i % gpus if gpus > 1 else None
        # a second call on the same machine continues each run from its last checkpoint (auto: when
        # output_dir holds one, a save cut between its renames included)
        procs[name] = launch(
            [*py, "train", "--config", str(runs / f"{name}.yaml"), "--resume", "auto"],
            runs / f"{name}.log",
            gpu,
        )
    summary["rl_rc"] = wait(procs, deadline - 5)
    summary["seconds_wall"] = time.monotonic() - t0
    summary["commands"] = {
        "device": f"bash benchmarks/seed_methods.sh run {a.seconds}",
        "sft": f"toolgym sft --config {runs / 'sft.yaml'}",
        **{name: f"toolgym train --config {runs / f'{name}.yaml'}" for name in METHODS},
    }
    (runs / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write the SFT conversations (expert episodes with subgoal tags)")
    d.add_argument("--out", default="runs/seed_methods/sft_data.jsonl")
    d.add_argument("--episodes", type=int, default=256)
    r = sub.add_parser("run", help="the warm start, then the four RL runs side by side")
    r.add_argument("--runs", default="runs/seed_methods")
    r.add_argument("--seconds", type=float, default=480, help="wall-clock budget of the whole call")
    r.add_argument("--steps", type=int, default=60, help="RL steps of each run (the same for all)")
    r.add_argument("--sft-episodes", type=int, default=256)
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--device", default="auto")
    r.add_argument("--only", nargs="+", choices=list(METHODS), help="run only these methods (e.g. one rerun)")
    r.add_argument("--quick", action="store_true", help="tiny budgets: a smoke test that the pipeline runs")
    a = ap.parse_args()
    if a.cmd == "data":
        print(write_data(Path(a.out), a.episodes), "conversations ->", a.out)
        return
    print(json.dumps(run(a), indent=2))


if __name__ == "__main__":
    main()
