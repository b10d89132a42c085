"""The rollout phase of ``toolgym train`` (GRPO + ARPO branching on Calculator-v0): old path vs ours.

Old: ``TreeRollout`` over ``HFPolicy`` (rounds, HF forward per token, env steps one after another).
Ours: the same ``TreeRollout`` over ``EnginePolicy`` (what ``engine: fast`` gives the trainer): continuous
batching over every tree (turns join and leave the decode batch one by one, env steps on a thread pool
while the GPU decodes the others, turns resumed from their KV, branches forked from it, CUDA graphs);
beside it the same engine driven in rounds (``tree_ours_rounds``, the path before continuous batching)
and with batched admission (``tree_ours_admit4``: a ready turn waits up to 4 decode steps for company),
and the episode runner, continuous over the engine vs round-based over HF. Every env step waits
``--latency`` seconds (a tool with 10 ms latency). The model is SmolLM2-135M's shape with random weights
and its real tokenizer and chat template (``--model DIR`` with config + tokenizer files); random weights
rarely write a valid tool call, so turns run to the token allowance and episodes to the turn limit.

    python benchmarks/rollout.py --model DIR [--tasks 16 --budget 8 --latency 0.01] [--out benchmarks/results/rollout]
    python benchmarks/rollout.py --smoke   # a 2-layer model with the same tokenizer, on CPU: checks the script

Keys: rollout_speedup (tree rollouts, tokens/s ours / old), gpu_idle_fraction (ours, tree rollouts: share
of the wall time with nothing to decode, waiting for envs), tree_outside_engine_fraction (1 - time in
engine steps / wall: idle + host work between steps), runner_speedup, runner_gpu_idle_fraction, gpu.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

ENV = "toolgym/Calculator-v0"


def slow_envs(latency: float) -> None:
    from toolgym.envs.base import ToolEnv

    original = ToolEnv.step

    def step(self: Any, action: Any) -> Any:
        time.sleep(latency)
        return original(self, action)

    ToolEnv.step = step  # type: ignore[method-assign]


def build(folder: str, device: str, tiny: bool = False) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(folder)
    if tiny:  # --smoke: the same tokenizer and layout, 2 small layers
        cfg.update(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16))  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def tree_rollout(policy: Any, args: Any, seed: int, continuous: bool | None = None) -> dict[str, float]:
    from toolgym.trainers.branching import make_branch_policy
    from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout

    branch = make_branch_policy("turn_entropy", initial=args.budget // 2)
    cfg = RolloutConfig(budget=args.budget, max_new_tokens=args.new, max_total_tokens=2048, entropies=True)
    roller = TreeRollout(
        policy, branch, cfg, {"prompt_format": "text", "max_turns": args.turns}, continuous=continuous
    )
    tasks = [RolloutTask(ENV, 1000 + i) for i in range(args.tasks)]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
        forest, stats = roller.run(tasks, seed=seed)
    wall = time.perf_counter() - t0
    roller.close()
    leaves = sum(len(t.leaves()) for t in forest)
    return {
        "wall_s": wall, "tokens": stats.generated_tokens, "tok_s": stats.generated_tokens / wall,
        "leaves": leaves, "generate_s": stats.generate_s, "env_s": stats.env_s, "calls": stats.generate_calls,
        "forks": sum(stats.forks.values()), "idle_s": stats.idle_s, "env_errors": stats.env_errors,
    }  # fmt: skip


def runner(policy: Any, args: Any) -> dict[str, float]:
    from toolgym.agents import EpisodeRunner, SamplingParams, episode_specs

    specs = episode_specs(
        [ENV], args.tasks * args.budget, first_seed=2000, prompt_format="text", max_turns=args.turns
    )
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new, seed=1)
    with EpisodeRunner(policy, concurrency=len(specs), sampling=sp, env_workers=16) as r:
        t0 = time.perf_counter()
        with torch.no_grad():
            trajs = r.run(specs)
        wall = time.perf_counter() - t0
    tokens = sum(t.completion_tokens for t in trajs)
    out = {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "episodes": len(trajs)}
    out["policy_s"] = r.stats["policy_s"]
    out["idle_s"] = float(r.stats.get("idle_s", 0.0))
    out["env_s"] = r.stats["env_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=".bench/smollm2")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--latency", type=float, default=0.010)
    ap.add_argument("--skip-old", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="2-layer model, 2 tasks, on CPU: checks the script")
    ap.add_argument("--out", default="benchmarks/results/rollout")
    args = ap.parse_args()
    if args.smoke:
        args.tasks, args.budget, args.turns, args.new = 2, 4, 2, 8
    import sys

    from toolgym.agents.engine import EnginePolicy
    from toolgym.agents.hf import HFPolicy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    slow_envs(args.latency)
    model, tok = build(args.model, device, tiny=args.smoke)
    res: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "command": "python " + " ".join(sys.argv), "args": vars(args),
                           "load_avg": __import__("os").getloadavg()[0]}  # fmt: skip
    fast = EnginePolicy(
        model, tok, slots=min(512, 4 * args.tasks * args.budget), capacity=2048 + args.new + 8
    )
    tree_rollout(fast, args, seed=0)  # warm-up: graph captures
    res["tree_ours"] = tree_rollout(fast, args, seed=1)
    print("tree ours", res["tree_ours"], flush=True)
    fast.clear_kv()
    fast.engine.admit_wait = 4  # newcomers gather up to 4 steps: fewer, larger prefills
    res["tree_ours_admit4"] = tree_rollout(fast, args, seed=1)
    print("tree ours (admit_wait 4)", res["tree_ours_admit4"], flush=True)
    fast.engine.admit_wait = 0
    fast.clear_kv()
    res["tree_ours_rounds"] = tree_rollout(fast, args, seed=1, continuous=False)
    print("tree ours (rounds)", res["tree_ours_rounds"], flush=True)
    fast.clear_kv()
    runner(fast, args)  # warm-up
    res["runner_ours"] = runner(fast, args)
    print("runner ours", res["runner_ours"], flush=True)
    if not args.skip_old:
        hf = HFPolicy(model, tok, batch_size=256)
        res["tree_old"] = tree_rollout(hf, args, seed=1)
        print("tree old", res["tree_old"], flush=True)
        Path(args.out).with_suffix(".partial.json").write_text(json.dumps(res, indent=2))
        res["runner_old"] = runner(hf, args)
        print("runner old", res["runner_old"], flush=True)
        res["rollout_speedup"] = res["tree_ours"]["tok_s"] / res["tree_old"]["tok_s"]
        res["runner_speedup"] = res["runner_ours"]["tok_s"] / res["runner_old"]["tok_s"]
    res["gpu_idle_fraction"] = res["tree_ours"]["idle_s"] / res["tree_ours"]["wall_s"]
    res["tree_outside_engine_fraction"] = 1 - res["tree_ours"]["generate_s"] / res["tree_ours"]["wall_s"]
    res["runner_gpu_idle_fraction"] = res["runner_ours"]["idle_s"] / res["runner_ours"]["wall_s"]
    res["rounds_gpu_idle_fraction"] = (
        1 - res["tree_ours_rounds"]["generate_s"] / res["tree_ours_rounds"]["wall_s"]
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2))
    lines = ["# rollout", "", f"Command: `{res['command']}`", f"Machine: {res['gpu']}; torch {torch.__version__}", "",
             f"{args.tasks} Calculator-v0 tasks x {args.budget} leaves, <= {args.turns} turns, <= {args.new} tokens a turn, "
             f"{args.latency * 1e3:.0f} ms per env step; SmolLM2-135M shape, random weights, real tokenizer/template. "
             f"Load average {res['load_avg']:.1f}.", "",
             "| path | wall s | generated tokens | tok/s |", "|---|---:|---:|---:|"]  # fmt: skip
    for key in ("tree_old", "tree_ours_rounds", "tree_ours", "tree_ours_admit4", "runner_old", "runner_ours"):
        if key in res:
            r = res[key]
            lines.append(f"| {key} | {r['wall_s']:.2f} | {r['tokens']:,} | {r['tok_s']:,.0f} |")
    lines.append("")
    for key in ("rollout_speedup", "gpu_idle_fraction", "tree_outside_engine_fraction", "rounds_gpu_idle_fraction",
                "runner_speedup", "runner_gpu_idle_fraction"):  # fmt: skip
        if key in res:
            lines.append(f"- `{key}`: {res[key]:.3f}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
