"""Household-v0 speed and planner quality, beside the real text-game engines in the same run.

Household: env.step steps/s (random admissible commands), resets/s, and forking (get_state + set_state);
the planner over 300 seeds per task type (success, steps / optimal) and a random-admissible policy.
Engines: TextWorld (the engine ALFWorld runs on: the anchor), ScienceWorld and TextWorldExpress, each
through its own Python API ("engine") and through the toolgym adapter ("adapter"), steps/s and resets/s.
Household rates are timed in blocks, per second of this process's CPU time: the best block (the one that
had the core to itself on a shared machine: the headline keys), the median block, and overall wall-clock;
engine rates are per wall second (their JVMs are other processes). Goals: household_steps_per_s >= 20,000, household_resets_per_s >=
1,000, fork_us <= 200.

    python benchmarks/household.py [--seconds 3] [--seeds 300] [--out benchmarks/results/household]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import toolgym  # noqa: F401
from toolgym.envs.base import CommandOutcome, Task, ToolEnv
from toolgym.envs.household.catalog import TASK_TYPES
from toolgym.envs.household.env import HouseholdEnv


class Clock:
    """CPU and wall time of a block, summed over uses."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def __enter__(self) -> Clock:
        self._c, self._w = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu += time.process_time() - self._c
        self.wall += time.perf_counter() - self._w


def rates(n: int, clock: Clock) -> tuple[float, float]:
    return n / max(clock.cpu, 1e-9), n / max(clock.wall, 1e-9)


class EchoEnv(ToolEnv):
    """The base loop's floor: a command env whose world does nothing (same text sizes as Household)."""

    action_format = "command"
    reward_keys = ("success", "format")

    def make_task(self) -> Task:
        return Task("echo", "You are in the middle of a room. Your task is to: put a mug in cabinet 1.")

    def run_command(self, command: str) -> CommandOutcome:
        return CommandOutcome("You arrive at cabinet 1. On the cabinet 1, you see a mug 1, and a plate 2.")


def _blocks(run: Callable[[], int], seconds: float) -> tuple[float, float, float]:
    """Time ``run`` (which does some units of work and returns how many) over and over for ``seconds``:
    (best block, median block, wall overall) in units per CPU second. On a shared machine the best block is
    the one that had the core to itself."""
    per_block: list[float] = []
    clock, units = Clock(), 0
    while clock.wall < seconds:
        with clock:
            start = time.process_time()
            n = run()
            spent = time.process_time() - start
        units += n
        if spent > 0:
            per_block.append(n / spent)
    return max(per_block), float(np.median(per_block)), units / clock.wall


def bench_household(seconds: float) -> dict[str, float]:
    out: dict[str, float] = {}
    env = HouseholdEnv(max_turns=10**9)
    # record random admissible-command episodes first (untimed), then time replaying them in blocks
    rng = np.random.default_rng(0)
    episodes: list[tuple[dict[str, Any], list[str]]] = []
    for seed in range(20):
        _, info = env.reset(seed=seed)
        state, commands = env.get_state(), []
        for _ in range(200):
            options = info["admissible_commands"]
            commands.append(options[int(rng.integers(len(options)))])
            _, _, term, _, info = env.step(commands[-1])
            if term:
                break
        episodes.append((state, commands))
    turn = {"i": 0}

    def steps() -> int:
        state, commands = episodes[turn["i"] % len(episodes)]
        turn["i"] += 1
        env.set_state(state)
        for command in commands:
            env.step(command)
        return len(commands)

    best, median, wall = _blocks(steps, seconds)
    out["household_steps_per_s"], out["household_steps_per_s_median"], out["household_steps_per_s_wall"] = (
        best,
        median,
        wall,
    )
    seeds = {"next": 0}

    def resets() -> int:
        for _ in range(20):
            env.reset(seed=seeds["next"])
            seeds["next"] += 1
        return 20

    best, median, wall = _blocks(resets, seconds)
    (
        out["household_resets_per_s"],
        out["household_resets_per_s_median"],
        out["household_resets_per_s_wall"],
    ) = (
        best,
        median,
        wall,
    )
    echo = EchoEnv(max_turns=10**9)
    echo.reset(seed=0)

    def echo_steps() -> int:
        for _ in range(200):
            echo.step("go to cabinet 1")
        return 200

    out["base_loop_steps_per_s"], out["base_loop_steps_per_s_median"], _ = _blocks(echo_steps, seconds / 2)
    # forking: at the start of an episode, and ten turns in (the base deep-copies the transcript)
    fork = HouseholdEnv()
    for turns, key in ((0, "fork_us"), (10, "fork_us_turn10")):
        fork.reset(seed=3)
        for _ in range(turns):
            fork.step("look")

        def forks() -> int:
            for _ in range(100):
                fork.set_state(fork.get_state())
            return 100

        best, median, _ = _blocks(forks, seconds / 3)
        out[key], out[f"{key}_median"] = 1e6 / best, 1e6 / median
    world = fork.world
    assert world is not None

    def world_forks() -> int:
        for _ in range(1000):
            world.restore(world.snapshot())
        return 1000

    best, _, _ = _blocks(world_forks, seconds / 3)
    out["world_fork_us"] = 1e6 / best
    return out


def bench_planner(seeds: int) -> tuple[dict[str, Any], float]:
    table: dict[str, Any] = {}
    for task_type in TASK_TYPES:
        env = HouseholdEnv(task_types=[task_type])
        wins, ratios, optimal = 0, [], []
        for seed in range(seeds):
            env.reset(seed=seed)
            while True:
                _, _, term, trunc, info = env.step(env.expert_action())
                if term or trunc:
                    break
            wins += bool(info["success"])
            ratios.append(info["turn"] / info["optimal_steps"])
            optimal.append(info["optimal_steps"])
        table[task_type] = {
            "success": wins / seeds,
            "steps_over_optimal": float(np.mean(ratios)),
            "optimal_steps": float(np.mean(optimal)),
        }
    env = HouseholdEnv()
    rng = np.random.default_rng(1)
    wins = 0
    for seed in range(seeds):
        _, info = env.reset(seed=seed)
        while True:
            commands = info["admissible_commands"]
            _, _, term, trunc, info = env.step(commands[int(rng.integers(len(commands)))])
            if term or trunc:
                wins += bool(info["success"])
                break
    return table, wins / seeds


def _loop(
    seconds: float, reset: Callable[[int], list[str]], step: Callable[[str], bool], max_resets: int
) -> dict[str, float]:
    """Play gold paths (reset gives one) for ``seconds``: steps/s and resets/s, CPU and wall."""
    steps_clock, reset_clock, steps, resets = Clock(), Clock(), 0, 0
    while steps_clock.wall + reset_clock.wall < seconds and resets < max_resets:
        with reset_clock:
            gold = reset(resets)
        resets += 1
        for command in gold:
            with steps_clock:
                done = step(command)
            steps += 1
            if done:
                break
    s_cpu, s_wall = rates(steps, steps_clock)
    r_cpu, r_wall = rates(resets, reset_clock)
    # engines work in other processes (a JVM) too, so wall time is their honest measure
    return {
        "steps_per_s": s_wall,
        "steps_per_s_cpu": s_cpu,
        "resets_per_s": r_wall,
        "resets_per_s_cpu": r_cpu,
    }


def adapter(env_id: str, seconds: float, max_resets: int) -> dict[str, float]:
    import gymnasium as gym

    env = gym.make(env_id)
    inner = env.unwrapped
    try:

        def reset(i: int) -> list[str]:
            env.reset(seed=i)
            return list(inner._gold)

        def step(command: str) -> bool:
            _, _, term, trunc, _ = env.step(command)
            return bool(term or trunc)

        env.reset(seed=0)  # start the engine (and make the first game) outside the timing
        return _loop(seconds, reset, step, max_resets)
    finally:
        env.close()


def engine_textworld(seconds: float, max_resets: int) -> dict[str, float]:
    import textworld

    from toolgym.envs.text_games.textworld_env import game_file

    infos = textworld.EnvInfos(admissible_commands=True, inventory=True, won=True, score=True, max_score=True)
    games = [game_file(2, s) for s in range(10)]
    holder: dict[str, Any] = {}

    def reset(i: int) -> list[str]:
        if "env" in holder:
            holder["env"].close()
        path = games[i % len(games)]
        holder["env"] = textworld.start(str(path), request_infos=infos)
        holder["env"].reset()
        return list(textworld.Game.load(str(path.with_suffix(".json"))).walkthrough)

    def step(command: str) -> bool:
        _, _, done = holder["env"].step(command)
        return bool(done)

    return _loop(seconds, reset, step, max_resets)


def engine_scienceworld(seconds: float, max_resets: int) -> dict[str, float]:
    from scienceworld import ScienceWorldEnv

    sw = ScienceWorldEnv("", envStepLimit=10**6)
    names = sw.get_task_names()
    try:

        def reset(i: int) -> list[str]:
            sw.load(names[i % len(names)], 0, "easy", generateGoldPath=True)
            sw.reset()
            return list(sw.get_gold_action_sequence())

        def step(command: str) -> bool:
            _, _, done, _ = sw.step(command)
            return bool(done)

        return _loop(seconds, reset, step, max_resets)
    finally:
        sw.close()


def engine_twx(seconds: float, max_resets: int) -> dict[str, float]:
    from textworld_express import TextWorldExpressEnv

    from toolgym.envs.text_games.twx_env import DEFAULT_PARAMS

    twx = TextWorldExpressEnv(envStepLimit=10**6)
    games = list(DEFAULT_PARAMS.items())
    try:

        def reset(i: int) -> list[str]:
            game, params = games[i % len(games)]
            twx.reset(seed=i, gameFold="train", gameName=game, gameParams=params, generateGoldPath=True)
            return list(twx.getGoldActionSequence())

        def step(command: str) -> bool:
            _, _, done, _ = twx.step(command)
            return bool(done)

        return _loop(seconds, reset, step, max_resets)
    finally:
        twx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seeds", type=int, default=300, help="planner seeds per task type")
    parser.add_argument("--engine-seconds", type=float, default=20.0)
    parser.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the goals say
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    result: dict[str, Any] = bench_household(args.seconds)
    planner, random_rate = bench_planner(args.seeds)
    result["planner"] = planner
    result["random_admissible_success"] = random_rate
    engines = {
        "textworld": (lambda: engine_textworld(args.engine_seconds, 40), "toolgym/TextWorld-v0"),
        "scienceworld": (lambda: engine_scienceworld(args.engine_seconds, 6), "toolgym/ScienceWorld-v0"),
        "textworld_express": (lambda: engine_twx(args.engine_seconds, 40), "toolgym/TextWorldExpress-v0"),
    }
    rows = []
    for name, (engine_fn, env_id) in engines.items():
        for how, fn in (
            ("engine", engine_fn),
            ("adapter", lambda i=env_id: adapter(i, args.engine_seconds, 40)),
        ):
            try:
                r = fn()
            except Exception as exc:  # an engine that cannot run here is reported, not fatal
                result[f"{name}_{how}_error"] = f"{type(exc).__name__}: {exc}"
                continue
            prefix = name if how == "adapter" else f"{name}_engine"
            for key, value in r.items():
                result[f"{prefix}_{key}"] = value
            rows.append((f"{name} ({how})", r))
    result["load_average"] = load
    lines = [
        "| Household-v0 | best block (CPU) | median block (CPU) | overall (wall) |",
        "|---|---:|---:|---:|",
        f"| env.step, replaying random admissible commands (steps/s) | {result['household_steps_per_s']:,.0f} | {result['household_steps_per_s_median']:,.0f} | {result['household_steps_per_s_wall']:,.0f} |",
        f"| env.reset (resets/s) | {result['household_resets_per_s']:,.0f} | {result['household_resets_per_s_median']:,.0f} | {result['household_resets_per_s_wall']:,.0f} |",
        f"| base loop floor: a command env whose world does nothing (steps/s) | {result['base_loop_steps_per_s']:,.0f} | {result['base_loop_steps_per_s_median']:,.0f} | |",
        f"| fork_us: get_state + set_state at turn 0 (µs) | {result['fork_us']:.1f} | {result['fork_us_median']:.1f} | |",
        f"| get_state + set_state at turn 10 (µs) | {result['fork_us_turn10']:.1f} | {result['fork_us_turn10_median']:.1f} | |",
        f"| world snapshot + restore alone (µs) | {result['world_fork_us']:.2f} | | |",
        "",
        f"| task type ({args.seeds} seeds each) | planner success | steps / optimal | optimal steps |",
        "|---|---:|---:|---:|",
    ]
    for task_type, p in planner.items():
        lines.append(
            f"| {task_type} | {p['success']:.3f} | {p['steps_over_optimal']:.3f} | {p['optimal_steps']:.2f} |"
        )
    lines += [
        f"\nRandom admissible-command policy, {args.seeds} episodes of 50 turns: success {random_rate:.3f}.",
        "",
        "| engine | steps/s (wall) | steps/s (this process's CPU) | resets/s (wall) | resets/s (CPU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, r in rows:
        lines.append(
            f"| {label} | {r['steps_per_s']:,.1f} | {r['steps_per_s_cpu']:,.1f} | {r['resets_per_s']:,.2f} | {r['resets_per_s_cpu']:,.2f} |"
        )
    for key, value in result.items():
        if key.endswith("_error"):
            lines.append(f"\n{key}: {value}")
    goals = [
        ("household_steps_per_s >= 20,000", result["household_steps_per_s"] >= 20_000),
        ("household_resets_per_s >= 1,000", result["household_resets_per_s"] >= 1_000),
        ("fork_us <= 200", result["fork_us"] <= 200),
    ]
    lines.append("\nGoals: " + "; ".join(f"{g}: {'met' if ok else 'NOT met'}" for g, ok in goals) + ".")
    table = "\n".join(lines)
    print(table)
    if args.out:
        header = (
            f"# household\n\nCommand: `python benchmarks/household.py --seconds {args.seconds:g} --seeds {args.seeds} "
            f"--engine-seconds {args.engine_seconds:g} --out {args.out}`\n"
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, pinned to one, "
            f"shared with other jobs (1-minute load average {load:.1f} at the start); Python "
            f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M')}. Engine rates are per wall second: "
            "the JVM engines work in another process, which this process's CPU time does not count.\n\n"
        )
        with open(f"{args.out}.md", "w") as f:
            f.write(header + table + "\n")
        with open(f"{args.out}.json", "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
