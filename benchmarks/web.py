"""Web envs (MiniWoB++ in Chromium): steps/s with 1 and 8 concurrent envs in one shared browser, beside one
browser per env (the anchors' way: BrowserGym and MiniWoB++'s own env start a browser per env), on the same
tasks in the same run; per-step latency; observation size; the scripted solvers' success rates; and the
Chromium processes left after close().

Each env plays its scripted solver's episodes for ``--seconds`` (reset + steps; only env.step is timed for
latency, steps/s counts steps per wall second over the whole run, resets included). Concurrent envs are
driven by one Python thread each (the sync gymnasium face; the browser loop runs their calls concurrently).
Observation tokens are estimated as characters / 4 (no tokenizer download). BrowserGym's MiniWoB env
(PyPI browsergym-miniwob) pins playwright==1.44, which would downgrade the project's Playwright, so it is
run only when importable (``--browsergym``), else reported as not run.

    python benchmarks/web.py [--seconds 20] [--solver-episodes 10] [--out benchmarks/results/web]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import toolgym  # noqa: F401
from toolgym.envs.web import miniwob_tasks
from toolgym.envs.web.solvers import SOLVERS

TASKS = ("click-button", "enter-text", "login-user", "choose-list", "click-checkboxes", "click-option",
         "enter-password", "click-dialog")  # fmt: skip


def _chromium_processes() -> int:
    """Chromium processes below this one (read from /proc)."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        names[int(d.name)] = stat[stat.index("(") + 1 : stat.rindex(")")]
        parent[int(d.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    me, count = os.getpid(), 0
    for pid, name in names.items():
        if "chrom" not in name.lower():
            continue
        p = pid
        while p > 1 and p in parent:
            p = parent[p]
            if p == me:
                count += 1
                break
    return count


def _drive(
    env: Any, seconds: float, seed0: int, lat: list[float], tokens: list[int], counts: list[int]
) -> None:
    inner = env.unwrapped
    deadline = time.perf_counter() + seconds
    seed, steps = seed0, 0
    while time.perf_counter() < deadline:
        obs, _ = env.reset(seed=seed)
        tokens.append(len(obs[-1]["content"]) // 4)
        seed += 1
        for _ in range(inner.max_turns):
            action = inner.expert_action()
            t = time.perf_counter()
            obs, _, term, trunc, _ = env.step(action)
            lat.append((time.perf_counter() - t) * 1000)
            steps += 1
            if obs and isinstance(obs[-1].get("content"), str):
                tokens.append(len(obs[-1]["content"]) // 4)
            if term or trunc:
                break
    counts.append(steps)


def run_mode(n_envs: int, own_browser: bool, seconds: float) -> dict[str, Any]:
    """n_envs envs (tasks round-robin over TASKS), one thread each, for ``seconds``."""
    envs = [
        gym.make(f"toolgym/MiniWoB-{TASKS[i % len(TASKS)]}-v0", own_browser=own_browser)
        for i in range(n_envs)
    ]
    lat: list[float] = []
    tokens: list[int] = []
    counts: list[int] = []
    try:
        for i, env in enumerate(envs):  # warm: browser launch and page load are not steps
            env.reset(seed=10_000 + i)
        start = time.perf_counter()
        threads = [
            threading.Thread(target=_drive, args=(env, seconds, 100 * i, lat, tokens, counts))
            for i, env in enumerate(envs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        for env in envs:
            env.close()
    steps = sum(counts)
    return {
        "envs": n_envs,
        "browsers": n_envs if own_browser else 1,
        "steps": steps,
        "steps_per_s": steps / wall,
        "step_p50_ms": statistics.median(lat) if lat else float("nan"),
        "step_p90_ms": statistics.quantiles(lat, n=10)[-1] if len(lat) > 10 else float("nan"),
        "obs_tokens_p50": statistics.median(tokens) if tokens else 0,
        "obs_tokens_max": max(tokens) if tokens else 0,
    }


def solver_rates(episodes: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    from toolgym.envs.web.browser import BrowserHost

    host = BrowserHost.shared()
    host.acquire()  # one browser for all tasks
    try:
        for task in sorted(SOLVERS):
            env = gym.make(f"toolgym/MiniWoB-{task}-v0")
            inner: Any = env.unwrapped
            wins = 0
            for seed in range(episodes):
                env.reset(seed=1000 + seed)
                info: dict[str, Any] = {}
                for _ in range(inner.max_turns):
                    _, _, term, trunc, info = env.step(inner.expert_action())
                    if term or trunc:
                        break
                wins += bool(info.get("success"))
            env.close()
            rates[task] = wins / episodes
            print(f"  solver {task}: {wins}/{episodes}", flush=True)
    finally:
        host.release()
    return rates


def browsergym_mode(seconds: float) -> dict[str, Any] | str:
    try:
        import browsergym.miniwob  # noqa: F401
    except Exception as exc:  # not installed (it pins an older Playwright): say so in the results
        return f"not run: browsergym-miniwob is not importable here ({type(exc).__name__})"
    return "not run: the BrowserGym driver is not wired in this script yet"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--solver-episodes", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/web")
    args = ap.parse_args()
    results: dict[str, Any] = {"modes": {}}
    for name, n, own in (("shared_1", 1, False), ("shared_8", 8, False), ("browser_per_env_8", 8, True)):
        print(f"mode {name} ...", flush=True)
        results["modes"][name] = run_mode(n, own, args.seconds)
        print(f"  {results['modes'][name]}", flush=True)
    results["browsergym"] = browsergym_mode(args.seconds)
    results["chromium_processes_after_close"] = _chromium_processes()
    rates = solver_rates(args.solver_episodes)
    m = results["modes"]
    results.update(
        {
            "steps_per_s_1_env": m["shared_1"]["steps_per_s"],
            "steps_per_s_8_envs": m["shared_8"]["steps_per_s"],
            "steps_per_s_8_envs_browser_per_env": m["browser_per_env_8"]["steps_per_s"],
            "speedup_8_envs_vs_1": m["shared_8"]["steps_per_s"] / m["shared_1"]["steps_per_s"],
            "speedup_8_envs_vs_browser_per_env": m["shared_8"]["steps_per_s"]
            / m["browser_per_env_8"]["steps_per_s"],
            "step_p50_ms": m["shared_1"]["step_p50_ms"],
            "obs_tokens_p50": m["shared_1"]["obs_tokens_p50"],
            "solver_success": rates,
            "solver_episodes": args.solver_episodes,
            "tasks": list(TASKS),
            "registered_tasks": len(miniwob_tasks()),
            "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()}), load {os.getloadavg()[0]:.1f}",
            "seconds": args.seconds,
        }
    )
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    rows = "\n".join(
        f"| {k} | {v['envs']} | {v['browsers']} | {v['steps_per_s']:.1f} | {v['step_p50_ms']:.1f} | "
        f"{v['step_p90_ms']:.1f} | {v['obs_tokens_p50']:.0f} |"
        for k, v in m.items()
    )
    solver_rows = "\n".join(f"| {t} | {r:.0%} |" for t, r in rates.items())
    md = f"""# Web envs (MiniWoB++ in Chromium): benchmark

Command: `python benchmarks/web.py --seconds {args.seconds:g} --solver-episodes {args.solver_episodes}`
Machine: {results["machine"]}. NOTE: a 2-core machine shared by up to 8 engineers at the time of the run; absolute
rates are low and noisy, ratios measured in the same run.

Tasks (round-robin over the envs, scripted solvers acting): {", ".join(TASKS)}.

| mode | envs | browsers | steps/s | step p50 ms | step p90 ms | obs tokens p50 |
|---|---|---|---|---|---|---|
{rows}

- `speedup_8_envs_vs_browser_per_env`: {results["speedup_8_envs_vs_browser_per_env"]:.2f} (goal >= 4)
- `speedup_8_envs_vs_1`: {results["speedup_8_envs_vs_1"]:.2f}
- `step_p50_ms` (1 env): {results["step_p50_ms"]:.1f} (goal <= 60)
- `obs_tokens_p50` (chars/4): {results["obs_tokens_p50"]:.0f} (goal <= 800)
- Chromium processes after close(): {results["chromium_processes_after_close"]}
- BrowserGym MiniWoB: {results["browsergym"]}

## Scripted solvers ({args.solver_episodes} episodes each, seeds 1000..)

| task | success |
|---|---|
{solver_rows}
"""
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
