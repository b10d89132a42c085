"""Calculator-v0 env steps/s (scripted expert: one tool call + one answer per episode) beside a gymnasium
CartPole-v1 baseline, in the same run, on one core. Goal: >= 10,000 Calculator steps/s.

    python benchmarks/env_step.py [--seconds 3] [--out benchmarks/results/env_step.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import gymnasium as gym

import toolgym  # noqa: F401
from toolgym.envs.base import tool_env


def bench_calculator(seconds: float) -> tuple[float, float]:
    """(steps/s counting only env.step time, steps/s counting reset + expert + step)."""
    env = gym.make("toolgym/Calculator-v0")
    inner = tool_env(env)
    steps, step_time, seed = 0, 0.0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=seed)
        seed += 1
        done = False
        while not done:
            action = inner.expert_action()
            t = time.perf_counter()
            _, _, term, trunc, _ = env.step(action)
            step_time += time.perf_counter() - t
            steps += 1
            done = term or trunc
    total = time.perf_counter() - start
    return steps / step_time, steps / total


def bench_cartpole(seconds: float) -> float:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(steps % 2)
        steps += 1
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=None, help="also write the table as markdown here")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the goal says
    calc_step, calc_all = bench_calculator(args.seconds)
    cart = bench_cartpole(args.seconds)
    rows = [
        ("gymnasium CartPole-v1 (baseline)", cart, 1.0),
        ("toolgym Calculator-v0, env.step only", calc_step, calc_step / cart),
        ("toolgym Calculator-v0, reset + expert + step", calc_all, calc_all / cart),
    ]
    lines = ["| what | steps/s | ratio to CartPole |", "|---|---:|---:|"]
    lines += [f"| {name} | {rate:,.0f} | {ratio:.3f} |" for name, rate, ratio in rows]
    verdict = "met" if calc_step >= 10_000 else "NOT met"
    lines.append(f"\nGoal >= 10,000 Calculator steps/s on one core: {verdict} ({calc_step:,.0f}).")
    table = "\n".join(lines)
    print(table)
    if args.out:
        header = (
            f"# env_step\n\nCommand: `python benchmarks/env_step.py --seconds {args.seconds:g}`\n"
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, pinned to one; "
            f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d')}\n\n"
        )
        with open(args.out, "w") as f:
            f.write(header + table + "\n")


if __name__ == "__main__":
    main()
