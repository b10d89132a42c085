"""Envs past one process: make_vec async vs one by one, MCP call latency, Terminal-v0 step/reset, one run.

    python benchmarks/env_breadth.py [--quick]

1. ``make_vec_async_speedup_16``: 16 ``toolgym/Coding-v0`` envs (docker sandboxes) played by the scripted
   expert (run the visible tests, submit: graded in the sandbox) through ``toolgym.make_vec``: ``async``
   (a worker process per env) against ``sync`` (the same envs stepped one by one in this process), the same
   seeds and steps, after one warm-up episode each (sandbox pools started). Speedup = sync s / async s.
2. ``mcp_call_p50_ms``: one ``get_price`` call on the shop MCP server over stdio through ``MCPClient``
   (the official SDK), against ``mcp_direct_call_p50_ms``, the same function called in this process; the
   streamable-HTTP transport too (``mcp_http_call_p50_ms``).
3. ``terminal_step_p50_ms``: ``env.step`` of one ``shell`` call (``echo hi``) in Terminal-v0's persistent
   shell; ``terminal_reset_p50_ms``: ``env.reset`` of a built-in task (a warm container, the task's files
   and setup, a new shell). Anchor: ``docker_exec_fresh_container_p50_ms``, the common approach of a fresh
   container per command (the same image and hardened settings: ``containers.run`` + ``exec_run``); and
   ``docker_exec_warm_container_p50_ms``, ``exec_run`` in one running container (no state between calls).
4. ``terminal_expert_success``: the scripted expert over every built-in task, one episode each.
5. With ``--web``: ``make_vec_async_speedup_8_web``, 8 ``toolgym/Web-v0`` envs (Chromium) the same way.

Writes benchmarks/results/env_breadth.md and env_breadth.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gymnasium as gym

import toolgym
from toolgym.envs.mcp import shop
from toolgym.envs.mcp.client import MCPClient, ServerConfig
from toolgym.envs.mcp.env import start_http_shop
from toolgym.envs.terminal.container import Resources as TermResources
from toolgym.envs.terminal.container import _kwargs, _remove
from toolgym.envs.terminal.image import BASE_IMAGE, ensure_base
from toolgym.envs.terminal.tasks import TASKS
from toolgym.sandboxes.docker_backend import client

RESULTS = Path(__file__).parent / "results"
MODES = ("sync", "async")


def p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def make_coding_vec(mode: str, n: int) -> Any:
    # the same 2 boxes per env either way: in one process the envs share one sandbox pool (2n boxes), in
    # async mode each worker process has its own (2 boxes)
    pool = 2 * n if mode == "sync" else 2
    vec = toolgym.make_vec(
        "toolgym/Coding-v0", n, mode=mode, sandbox="docker", sandbox_options={"pool_size": pool}, max_turns=4
    )
    vec.reset(seed=list(range(n)))
    for _ in range(4):  # warm-up: two expert episodes per env (run_tests, submit): the boxes are started
        vec.step(list(vec.call("expert_action")))
    return vec


def timed_steps(vec: Any, steps: int) -> tuple[dict[str, float], float]:
    """(seconds of ``steps`` expert steps of every env, split by what the step was: ``run_tests`` or
    ``submit``; the summed reward). The envs move in lockstep (every episode is the same two turns), and the
    expert's actions are read before the clock starts: only the envs' steps are timed."""
    seconds = {"run_tests": 0.0, "submit": 0.0}
    reward = 0.0
    for _ in range(steps):
        actions = list(vec.call("expert_action"))
        kind = "submit" if '"submit"' in actions[0] else "run_tests"
        t0 = time.perf_counter()
        _, rewards, *_ = vec.step(actions)
        seconds[kind] += time.perf_counter() - t0
        reward += float(rewards.sum())
    return seconds, reward


def vec_speedup(n: int, steps: int, rounds: int) -> dict[str, Any]:
    """Both vector envs live at once; rounds alternate sync and async, so load on the shared machine
    falls on both alike."""
    sync_vec, async_vec = make_coding_vec("sync", n), make_coding_vec("async", n)
    totals: dict[str, dict[str, float]] = {m: {"run_tests": 0.0, "submit": 0.0, "reward": 0.0} for m in MODES}
    try:
        for _ in range(rounds):
            for mode, vec in (("sync", sync_vec), ("async", async_vec)):
                seconds, reward = timed_steps(vec, steps)
                for kind, value in seconds.items():
                    totals[mode][kind] += value
                totals[mode]["reward"] += reward
    finally:
        sync_vec.close()
        async_vec.close()
    env_steps = n * steps * rounds
    wall = {m: totals[m]["run_tests"] + totals[m]["submit"] for m in MODES}
    return {
        "make_vec_sync_s": round(wall["sync"], 2),
        "make_vec_async_s": round(wall["async"], 2),
        "make_vec_async_speedup_16": round(wall["sync"] / wall["async"], 2),
        "make_vec_async_speedup_16_run_tests_steps": round(
            totals["sync"]["run_tests"] / totals["async"]["run_tests"], 2
        ),
        "make_vec_async_speedup_16_submit_steps": round(
            totals["sync"]["submit"] / totals["async"]["submit"], 2
        ),
        "make_vec_env_steps_each": env_steps,
        "make_vec_mean_reward_sync": round(totals["sync"]["reward"] / env_steps, 3),
        "make_vec_mean_reward_async": round(totals["async"]["reward"] / env_steps, 3),
    }


def web_speedup(n: int, steps: int) -> dict[str, Any]:
    """``toolgym/Web-v0`` (MiniWoB++ in Chromium) the same way, n envs, one round each (browsers are heavy)."""
    out: dict[str, float] = {}
    for mode in MODES:
        vec = toolgym.make_vec("toolgym/Web-v0", n, mode=mode)
        try:
            vec.reset(seed=list(range(n)))
            for _ in range(3):
                vec.step(list(vec.call("expert_action")))
            vec.reset(seed=list(range(50, 50 + n)))
            out[mode] = 0.0
            for _ in range(steps):
                actions = list(vec.call("expert_action"))
                t0 = time.perf_counter()
                vec.step(actions)
                out[mode] += time.perf_counter() - t0
        finally:
            vec.close()
    return {
        f"make_vec_web_sync_s_{n}": round(out["sync"], 2),
        f"make_vec_web_async_s_{n}": round(out["async"], 2),
        f"make_vec_async_speedup_{n}_web": round(out["sync"] / out["async"], 2),
    }


def mcp_latency(calls: int) -> dict[str, float]:
    direct = []
    for _ in range(calls):
        t0 = time.perf_counter()
        shop.get_price("apple")
        direct.append(time.perf_counter() - t0)
    out = {"mcp_direct_call_p50_ms": round(statistics.median(direct) * 1000, 5)}
    stdio = MCPClient(ServerConfig(command=[sys.executable, "-m", "toolgym.envs.mcp.shop"]))
    proc, url = start_http_shop()
    http = MCPClient(ServerConfig(url=url))
    try:
        for name, conn in (("mcp_call_p50_ms", stdio), ("mcp_http_call_p50_ms", http)):
            for _ in range(10):
                conn.call("get_price", {"product": "apple"})
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                text, _ = conn.call("get_price", {"product": "apple"})
                samples.append(time.perf_counter() - t0)
                assert text == "0.45", text
            out[name] = p50_ms(samples)
    finally:
        stdio.close()
        http.close()
        proc.kill()
    return out


def terminal(steps: int, resets: int) -> dict[str, Any]:
    ensure_base()
    env = gym.make("toolgym/Terminal-v0")
    inner: Any = env.unwrapped
    call = '<tool_call>{"name": "shell", "arguments": {"command": "echo hi"}}</tool_call>'
    try:
        reset_s, step_s = [], []
        env.reset(seed=0, options={"task": "count-errors"})  # the pool's first container, the image check
        for i in range(resets):
            time.sleep(1.0)  # the next warm container starts in the background, as between real episodes
            t0 = time.perf_counter()
            env.reset(seed=i, options={"index": i % len(TASKS)})
            reset_s.append(time.perf_counter() - t0)
            for _ in range(steps // resets):
                t0 = time.perf_counter()
                obs, *_ = env.step(call)
                step_s.append(time.perf_counter() - t0)
                assert obs[0]["content"].startswith("hi"), obs
        wins, failed = 0, []
        for task in TASKS:
            env.reset(seed=0, options={"task": task.name})
            info: dict[str, Any] = {}
            for _ in range(inner.max_turns):
                _, _, term, trunc, info = env.step(inner.expert_action())
                if term or trunc:
                    break
            wins += bool(info.get("success"))
            if not info.get("success"):
                failed.append(task.name)
    finally:
        env.close()
    cli = client()
    fresh = []
    for _ in range(max(5, resets // 2)):
        t0 = time.perf_counter()
        container = cli.containers.run(**_kwargs(BASE_IMAGE, TermResources(), "/app"))
        _, out = container.exec_run(["bash", "-c", "echo hi"])
        fresh.append(time.perf_counter() - t0)
        assert out.strip() == b"hi"
        _remove(container)
    container = cli.containers.run(**_kwargs(BASE_IMAGE, TermResources(), "/app"))
    warm = []
    for _ in range(20):
        t0 = time.perf_counter()
        container.exec_run(["bash", "-c", "echo hi"])
        warm.append(time.perf_counter() - t0)
    _remove(container)
    return {
        "terminal_step_p50_ms": p50_ms(step_s),
        "docker_exec_warm_container_p50_ms": p50_ms(warm),
        "terminal_reset_p50_ms": p50_ms(reset_s),
        "docker_exec_fresh_container_p50_ms": p50_ms(fresh),
        "terminal_expert_success": round(wins / len(TASKS), 4),
        "terminal_tasks": len(TASKS),
        "terminal_expert_failed": failed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--web", action="store_true", help="Web-v0 too (8 envs: 8 browsers in async mode)")
    args = parser.parse_args()
    results: dict[str, Any] = {"load_average_at_start": os.getloadavg()[0]}
    results.update(vec_speedup(16, steps=4, rounds=1 if args.quick else 3))
    if args.web:
        results.update(web_speedup(8, steps=6))
    print(json.dumps(results))
    results.update(mcp_latency(50 if args.quick else 300))
    print(json.dumps(results))
    results.update(terminal(steps=20 if args.quick else 60, resets=6 if args.quick else 20))
    results["load_average_at_end"] = os.getloadavg()[0]
    results["machine"] = f"{platform.node()} ({os.cpu_count()} CPUs, shared), {platform.python_version()}"
    results["when"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(json.dumps(results, indent=1))
    (RESULTS / "env_breadth.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
