"""Web envs (MiniWoB++ in Chromium): steps/s with 1 and 8 concurrent envs in one shared browser, beside one
browser per env (MiniWoB++'s own env keeps a browser per env) and beside BrowserGym's MiniWoB env (PyPI
browsergym-miniwob) on the same tasks in the same run; per-step latency and CPU; observation size; the
scripted solvers' success rates; the Chromium processes left after close().

Every mode plays the same 8 tasks (``TASKS``) with a scripted policy: ours act with the scripted solvers on
our text observation; BrowserGym's env acts with a fixed action plan (click/fill/select_option on its bids)
that a small script reads off its first accessibility-tree observation. 1 env plays the tasks one after
the other (``--seconds``/8 each, at least one episode); 8 envs play one task each at the same time. Only
env.step is timed for latency; steps/s counts steps per wall second of the timed window, resets
included (warm-up resets, browser launch and page load are not). CPU ms/step is the CPU time of the
whole process tree (Python, Playwright's driver, every Chromium process) over the window, per step: it
says what a step costs when the 2 shared cores are busy with other work. Observation tokens are
characters / 4 (no tokenizer download).

BrowserGym pins playwright==1.44, which would downgrade ours, so it runs in its own virtualenv as a
subprocess of this script (``--browsergym-python``, default /tmp/bgym/bin/python; made with ``python -m
venv /tmp/bgym && /tmp/bgym/bin/pip install browsergym-miniwob``), driven by this same file
(``--browsergym-driver``), on the same Chromium (its ``launch`` is given ``executable_path``) and the same
MiniWoB HTML (``MINIWOB_URL`` = the installed ``miniwob`` package's pages, file://). 8 BrowserGym envs are
8 processes (its sync Playwright cannot share a thread). It runs as shipped (``slow_mo`` 100 ms per
Playwright call, ``pre_observation_delay`` 0.5 s) and, for its floor, with both set to 0 ("tuned").

    python benchmarks/web.py [--seconds 24] [--solver-episodes 10] [--out benchmarks/results/web]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TASKS = ("click-button", "enter-text", "login-user", "choose-list", "click-checkboxes", "click-option",
         "enter-password", "click-dialog")  # fmt: skip
MAX_STEPS = 10  # per episode, both sides
CLK = os.sysconf("SC_CLK_TCK")


# ----- processes -------------------------------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, command name, CPU ticks user+system), from /proc."""
    table = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(d.name)] = (
            int(fields[1]),
            stat[stat.index("(") + 1 : stat.rindex(")")],
            int(fields[11]) + int(fields[12]),
        )
    return table


def _descendants(table: dict[int, tuple[int, str, int]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_cpu_ms() -> float:
    """CPU time (ms) of this process and every live process below it."""
    table = _proc_table()
    me = os.getpid()
    ticks = sum(table[p][2] for p in [me, *_descendants(table, me)] if p in table)
    return ticks * 1000 / CLK


def chromium_processes() -> int:
    """Chromium processes below this one."""
    table = _proc_table()
    return sum("chrom" in table[p][1].lower() for p in _descendants(table, os.getpid()))


def _summary(lat: list[float], tokens: list[int], steps: int, wall: float, cpu_ms: float) -> dict[str, Any]:
    return {
        "steps": steps,
        "steps_per_s": steps / wall if wall else 0.0,
        "step_p50_ms": statistics.median(lat) if lat else float("nan"),
        "step_p90_ms": statistics.quantiles(lat, n=10)[-1] if len(lat) > 10 else float("nan"),
        "cpu_ms_per_step": cpu_ms / steps if steps else float("nan"),
        "obs_tokens_p50": statistics.median(tokens) if tokens else 0,
        "obs_tokens_max": max(tokens) if tokens else 0,
    }


# ----- ours ------------------------------------------------------------------------------------------------
def _drive(env: Any, until: float, seed0: int, lat: list[float], tokens: list[int], counts: list[int],
           wins: list[int]) -> None:  # fmt: skip
    """Episodes until the deadline (the one in progress is finished; at least one)."""
    inner = env.unwrapped
    seed, steps, episodes = seed0, 0, 0
    while episodes == 0 or time.perf_counter() < until:
        obs, _ = env.reset(seed=seed)
        tokens.append(len(obs[-1]["content"]) // 4)
        seed, episodes = seed + 1, episodes + 1
        info: dict[str, Any] = {}
        for _ in range(MAX_STEPS):
            action = inner.expert_action()
            t = time.perf_counter()
            obs, _, term, trunc, info = env.step(action)
            lat.append((time.perf_counter() - t) * 1000)
            steps += 1
            if obs and isinstance(obs[-1].get("content"), str):
                tokens.append(len(obs[-1]["content"]) // 4)
            if term or trunc:
                break
        wins.append(int(bool(info.get("success"))))
    counts.append(steps)


def run_mode(n_envs: int, own_browser: bool, seconds: float) -> dict[str, Any]:
    """n_envs envs, env i playing TASKS[i]; one env plays every task in turn (seconds/len(TASKS) each)."""
    import gymnasium as gym

    import toolgym  # noqa: F401

    groups = [list(TASKS)] if n_envs > 1 else [[t] for t in TASKS]
    window = seconds if n_envs > 1 else seconds / len(TASKS)
    lat: list[float] = []
    tokens: list[int] = []
    counts: list[int] = []
    wins: list[int] = []
    wall = cpu = 0.0
    for tasks in groups:
        envs = [gym.make(f"toolgym/MiniWoB-{tasks[i % len(tasks)]}-v0", own_browser=own_browser)
                for i in range(n_envs)]  # fmt: skip
        try:
            for i, env in enumerate(envs):  # warm: browser launch and page load are not steps
                env.reset(seed=10_000 + i)
            time.sleep(0.5)  # nor the page's first paints
            cpu0, start = tree_cpu_ms(), time.perf_counter()
            threads = [
                threading.Thread(
                    target=_drive, args=(env, start + window, 100 * i, lat, tokens, counts, wins)
                )
                for i, env in enumerate(envs)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall += time.perf_counter() - start
            cpu += tree_cpu_ms() - cpu0
        finally:
            for env in envs:
                env.close()
    out: dict[str, Any] = {"envs": n_envs, "browsers": n_envs if own_browser else 1}
    out.update(_summary(lat, tokens, sum(counts), wall, cpu))
    out["success"] = sum(wins) / len(wins) if wins else 0.0
    return out


def solver_rates(episodes: int) -> dict[str, float]:
    import gymnasium as gym

    import toolgym  # noqa: F401
    from toolgym.envs.web.browser import BrowserHost
    from toolgym.envs.web.solvers import SOLVERS

    rates: dict[str, float] = {}
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


# ----- BrowserGym (runs in its own virtualenv: only the standard library and BrowserGym here) ----------------
_NODE = re.compile(r"^\s*\[(\w+)\] (\w+) '((?:[^'\\]|\\.)*)'(.*)$")


def browsergym_plan(task: str, goal: str, axtree: str) -> list[str]:
    """A fixed action sequence for one episode, read off the first observation (BrowserGym's action set)."""
    nodes = [m.groups() for line in axtree.splitlines() if (m := _NODE.match(line))]
    quoted = re.findall(r'"(.*?)"', goal)

    def bids(role: str, name: str | None = None) -> list[str]:
        return [b for b, r, n, _ in nodes if r == role and (name is None or n == name)]

    def click(bid: str) -> str:
        return f'click("{bid}")'

    submit = [click(b) for b in bids("button", "Submit")[:1]]
    if task == "click-button":
        return [click(b) for b in bids("button", quoted[0] if quoted else "")[:1]]
    if task == "click-dialog":
        want = quoted[0] if quoted else ""
        return [click(b) for b in bids("button", "Close" if want.lower() == "x" else want)[:1]]
    if task in ("enter-text", "enter-password", "login-user"):
        texts = {"enter-text": quoted[:1], "enter-password": quoted[:1] * 2, "login-user": quoted[:2]}[task]
        fills = [
            f"fill({json.dumps(b)}, {json.dumps(t)})" for b, t in zip(bids("textbox"), texts, strict=False)
        ]
        last = [click(b) for b in bids("button", "Login")[:1]] if task == "login-user" else submit
        return fills + last
    found = re.match(r"Select (.*?) (?:from the list )?and click Submit", goal)
    want = found.group(1).strip() if found else ""
    if task == "choose-list":
        return [f"select_option({json.dumps(b)}, {json.dumps(want)})" for b in bids("combobox")[:1]] + submit
    if task == "click-checkboxes":
        wanted = set() if want == "nothing" else {w.strip() for w in re.split(r",\s*", want) if w.strip()}
        return [click(b) for b, r, n, _ in nodes if r == "checkbox" and n in wanted] + submit
    if task == "click-option":
        return [click(b) for b in bids("radio", want)[:1]] + submit
    return []


def browsergym_driver(args: argparse.Namespace) -> None:
    """One process of BrowserGym envs: plays ``--tasks`` one after the other; prints READY, waits for a line
    on stdin, then prints one RESULT JSON line."""
    os.environ["MINIWOB_URL"] = args.miniwob_url
    import playwright.sync_api as pw_sync

    launch = pw_sync.BrowserType.launch

    def launch_ours(self: Any, *a: Any, **k: Any) -> Any:  # the same Chromium as ours (task and chat pages)
        k.setdefault("executable_path", args.chromium)
        return launch(self, *a, **k)

    pw_sync.BrowserType.launch = launch_ours  # type: ignore[method-assign]
    import browsergym.miniwob  # noqa: F401
    import gymnasium as gym
    from browsergym.utils.obs import flatten_axtree_to_str

    tasks = args.tasks.split(",")
    window = args.seconds / len(tasks)
    # timeout: its 5 s page-load limit is missed when 8 envs relaunch 16 Chromiums on 2 busy cores
    extra: dict[str, Any] = {"timeout": 30_000}
    if args.tuned:
        extra.update(slow_mo=0, pre_observation_delay=0.0)
    lat: list[float] = []
    tokens: list[int] = []
    wins: list[int] = []
    by_task: dict[str, list[int]] = {}
    failures: list[str] = []
    steps, wall, cpu, errors = 0, 0.0, 0.0, 0
    for k, task in enumerate(tasks):
        env = gym.make(f"browsergym/miniwob.{task}", **extra)
        for attempt in range(3):  # warm (a first launch can time out on a busy machine)
            try:
                obs, _ = env.reset(seed=10_000)
                break
            except Exception:
                if attempt == 2:
                    raise
        if k == 0:
            print("READY", flush=True)
            sys.stdin.readline()
        cpu0, start = tree_cpu_ms(), time.perf_counter()
        seed, episodes = 0, 0
        while episodes == 0 or time.perf_counter() < start + window:
            seed, episodes = seed + 1, episodes + 1
            try:
                obs, _ = env.reset(seed=seed)
            except Exception as exc:  # a page load that timed out: counted, and the episode is lost
                errors += 1
                print(f"reset failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
                wins.append(0)
                by_task.setdefault(task, []).append(0)
                continue
            text = flatten_axtree_to_str(obs["axtree_object"])
            tokens.append(len(text) // 4)
            reward: Any = 0.0
            info: dict[str, Any] = {}
            for action in browsergym_plan(task, obs["goal"], text)[:MAX_STEPS]:
                t = time.perf_counter()
                obs, reward, term, trunc, info = env.step(action)
                lat.append((time.perf_counter() - t) * 1000)
                steps += 1
                tokens.append(len(flatten_axtree_to_str(obs["axtree_object"])) // 4)
                if term or trunc:
                    break
            wins.append(int(float(reward) > 0))
            by_task.setdefault(task, []).append(wins[-1])
            if not wins[-1]:  # why, for the record: its last action error or MiniWoB's reason
                reason = obs.get("last_action_error") or str(info.get("task_info", {}).get("REWARD_REASON"))
                failures.append(f"{task} seed {seed}: {reason[:200]}")
        wall += time.perf_counter() - start
        cpu += tree_cpu_ms() - cpu0
        env.close()
    out = _summary(lat, tokens, steps, wall, cpu)
    out.update({"wall": wall, "cpu_ms": cpu, "episodes": len(wins), "wins": sum(wins), "lat": lat, "errors": errors,
                "wins_by_task": {t: f"{sum(w)}/{len(w)}" for t, w in by_task.items()}, "failures": failures,
                "chromium_after_close": chromium_processes()})  # fmt: skip
    print("RESULT " + json.dumps(out), flush=True)


def miniwob_url() -> str:
    from importlib.util import find_spec

    spec = find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("PyPI miniwob is not installed")
    return (Path(next(iter(spec.submodule_search_locations))) / "html" / "miniwob").as_uri() + "/"


def _browsergym_processes(
    base: list[str], groups: list[list[str]], logs: list[Any], seconds: float
) -> list[dict[str, Any]] | str:
    """Start one driver per group, wait until all are warm, start them together, collect their results."""
    procs = [
        subprocess.Popen(
            [*base, "--tasks", ",".join(g)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        for g, log in zip(groups, logs, strict=True)
    ]

    def log_tail(i: int) -> str:
        logs[i].seek(0)
        return str(logs[i].read()[-1500:])

    try:
        for i, p in enumerate(procs):  # every env launched and warm before any is timed
            assert p.stdout is not None
            line = p.stdout.readline()
            while line and line.strip() != "READY":
                line = p.stdout.readline()
            if not line:
                return f"failed: {log_tail(i)}"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for i, p in enumerate(procs):
            out, _ = p.communicate(timeout=seconds * 20 + 600)
            found = [line for line in out.splitlines() if line.startswith("RESULT ")]
            if not found:
                return f"failed: {log_tail(i)}"
            results.append(json.loads(found[-1][len("RESULT ") :]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_browsergym(python: str, n_envs: int, seconds: float, tuned: bool) -> dict[str, Any] | str:
    """BrowserGym in its own virtualenv: 1 env (one process, the tasks in turn) or n envs (n processes)."""
    from toolgym.envs.web.browser import chromium_path

    if not Path(python).exists():
        return f"not run: no BrowserGym virtualenv at {python} (see this script's docstring)"
    check = subprocess.run([python, "-c", "import browsergym.miniwob"], capture_output=True, text=True)
    if check.returncode:
        return f"not run: browsergym.miniwob does not import in {python}: {check.stderr.strip().splitlines()[-1:]}"
    groups = [list(TASKS)] if n_envs == 1 else [[TASKS[i % len(TASKS)]] for i in range(n_envs)]
    base = [python, __file__, "--browsergym-driver", "--seconds", str(seconds),
            "--chromium", chromium_path(), "--miniwob-url", miniwob_url()]  # fmt: skip
    if tuned:
        base.append("--tuned")
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in groups]  # it logs a lot: no pipe
        results = _browsergym_processes(base, groups, logs, seconds)
    if isinstance(results, str):
        return results
    lat = [x for r in results for x in r["lat"]]
    steps = sum(r["steps"] for r in results)
    wall = max(r["wall"] for r in results)
    out: dict[str, Any] = {
        "envs": n_envs,
        "browsers": 2 * n_envs,
    }  # a task browser and a chat browser per env
    out.update(_summary(lat, [], steps, wall, sum(r["cpu_ms"] for r in results)))
    out["obs_tokens_p50"] = statistics.median(r["obs_tokens_p50"] for r in results)
    out["success"] = sum(r["wins"] for r in results) / max(1, sum(r["episodes"] for r in results))
    out["chromium_after_close"] = sum(r["chromium_after_close"] for r in results)
    out["obs_tokens_max"] = max(r["obs_tokens_max"] for r in results)
    out["reset_errors"] = sum(r["errors"] for r in results)
    out["wins_by_task"] = {t: w for r in results for t, w in r["wins_by_task"].items()}
    out["failures"] = [f for r in results for f in r["failures"]]
    return out


# ----- main ------------------------------------------------------------------------------------------------
def _row(name: str, v: dict[str, Any] | str) -> str:
    if isinstance(v, str):
        return f"| {name} | | | {v} | | | | | |"
    return (f"| {name} | {v['envs']} | {v['browsers']} | {v['steps_per_s']:.1f} | {v['step_p50_ms']:.1f} | "
            f"{v['step_p90_ms']:.1f} | {v['cpu_ms_per_step']:.1f} | {v['obs_tokens_p50']:.0f} | {v['success']:.0%} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--solver-episodes", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/web")
    ap.add_argument("--browsergym-python", default="/tmp/bgym/bin/python")
    ap.add_argument("--skip-browsergym", action="store_true")
    # the BrowserGym driver role (run by this script in BrowserGym's virtualenv)
    ap.add_argument("--browsergym-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", default=",".join(TASKS), help=argparse.SUPPRESS)
    ap.add_argument("--chromium", default="/usr/bin/chromium", help=argparse.SUPPRESS)
    ap.add_argument("--miniwob-url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tuned", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.browsergym_driver:
        browsergym_driver(args)
        return

    from toolgym.envs.web import miniwob_tasks

    load_before = os.getloadavg()
    results: dict[str, Any] = {"modes": {}}
    plan: list[tuple[str, Any]] = [
        ("shared_1", lambda: run_mode(1, False, args.seconds)),
        ("shared_8", lambda: run_mode(8, False, args.seconds)),
        ("browser_per_env_8", lambda: run_mode(8, True, args.seconds)),
    ]
    if not args.skip_browsergym:
        py = args.browsergym_python
        plan += [
            ("browsergym_1", lambda: run_browsergym(py, 1, args.seconds, False)),
            ("browsergym_8", lambda: run_browsergym(py, 8, args.seconds, False)),
            ("browsergym_tuned_1", lambda: run_browsergym(py, 1, args.seconds, True)),
            ("browsergym_tuned_8", lambda: run_browsergym(py, 8, args.seconds, True)),
        ]
    results["load_1min_at_mode_start"] = {}
    for name, fn in plan:
        results["load_1min_at_mode_start"][name] = os.getloadavg()[0]
        print(f"mode {name} ... (load {os.getloadavg()[0]:.1f})", flush=True)
        results["modes"][name] = fn()
        print(f"  {results['modes'][name]}", flush=True)
    results["chromium_processes_after_close"] = chromium_processes()
    load_after = os.getloadavg()
    rates = solver_rates(args.solver_episodes)
    m = results["modes"]

    def ratio(a: str, b: str, key: str = "steps_per_s") -> float | None:
        if isinstance(m.get(a), dict) and isinstance(m.get(b), dict) and m[b][key]:
            return m[a][key] / m[b][key]
        return None

    results.update(
        {
            "steps_per_s_1_env": m["shared_1"]["steps_per_s"],
            "steps_per_s_8_envs": m["shared_8"]["steps_per_s"],
            "steps_per_s_8_envs_browser_per_env": m["browser_per_env_8"]["steps_per_s"],
            "speedup_8_envs_vs_1": ratio("shared_8", "shared_1"),
            "speedup_8_envs_vs_browser_per_env": ratio("shared_8", "browser_per_env_8"),
            "cpu_per_step_browser_per_env_vs_shared": ratio(
                "browser_per_env_8", "shared_8", "cpu_ms_per_step"
            ),
            "step_p50_ms": m["shared_1"]["step_p50_ms"],
            "obs_tokens_p50": m["shared_1"]["obs_tokens_p50"],
            "leftover_chromium_processes": results["chromium_processes_after_close"],
            "browsergym": {k[len("browsergym_") :]: v for k, v in m.items() if k.startswith("browsergym")},
            "speedup_8_envs_vs_browsergym_8": ratio("shared_8", "browsergym_8"),
            "speedup_8_envs_vs_browsergym_tuned_8": ratio("shared_8", "browsergym_tuned_8"),
            "speedup_1_env_vs_browsergym_1": ratio("shared_1", "browsergym_1"),
            "solver_success": rates,
            "solver_episodes": args.solver_episodes,
            "tasks": list(TASKS),
            "registered_tasks": len(miniwob_tasks()),
            "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()})",
            "load_average_before": load_before,
            "load_average_after": load_after,
            "seconds": args.seconds,
        }
    )
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    rows = "\n".join(_row(k, v) for k, v in m.items())
    solver_rows = "\n".join(f"| {t} | {r:.0%} |" for t, r in rates.items())

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    md = f"""# Web envs (MiniWoB++ in Chromium): benchmark

Command: `python benchmarks/web.py --seconds {args.seconds:g} --solver-episodes {args.solver_episodes}`
Machine: {results["machine"]}; load average (1, 5, 15 min) {", ".join(f"{x:.1f}" for x in load_before)} at the
start, {", ".join(f"{x:.1f}" for x in load_after)} at the end (1-min load as each mode started: {", ".join(f"{k} {v:.1f}" for k, v in results["load_1min_at_mode_start"].items())}; the 8 BrowserGym processes raise it themselves). NOTE: 2 cores shared with other engineers' jobs
during the run: absolute rates are low and noisy; the modes ran one after the other in one run.

Tasks: {", ".join(TASKS)}; 1 env plays them in turn, 8 envs play one each at the same time. Ours act with
the scripted solvers; BrowserGym (browsergym-miniwob {_bgym_version(args.browsergym_python)}, own virtualenv, same
Chromium and MiniWoB pages) acts with a fixed click/fill/select_option plan read off its first observation.
BrowserGym as shipped waits `slow_mo` 100 ms per Playwright call and 0.5 s before every observation;
"tuned" sets both to 0. Its obs tokens are its accessibility-tree text (chars/4); ours our element list.

| mode | envs | browsers | steps/s | step p50 ms | step p90 ms | CPU ms/step | obs tokens p50 | success |
|---|---|---|---|---|---|---|---|---|
{rows}

- `speedup_8_envs_vs_browser_per_env`: {fmt(results["speedup_8_envs_vs_browser_per_env"])} (goal >= 4)
- CPU per step, browser per env / shared: {fmt(results["cpu_per_step_browser_per_env_vs_shared"])}
- `speedup_8_envs_vs_1`: {fmt(results["speedup_8_envs_vs_1"])}
- `speedup_8_envs_vs_browsergym_8`: {fmt(results["speedup_8_envs_vs_browsergym_8"])} (tuned: {fmt(results["speedup_8_envs_vs_browsergym_tuned_8"])}); 1 env: {fmt(results["speedup_1_env_vs_browsergym_1"])}
- `step_p50_ms` (1 env): {results["step_p50_ms"]:.1f} (goal <= 60)
- `obs_tokens_p50` (chars/4): {results["obs_tokens_p50"]:.0f} (goal <= 800)
- `leftover_chromium_processes` after close(): {results["chromium_processes_after_close"]}

## What limits it

- Sharing one Chromium saves per-browser fixed costs, not per-step work: 8 envs in one browser have one
  browser process, one GPU/compositor process, one network and storage service, one Playwright driver
  and one event-loop thread instead of 8 of each (8 idle MiniWoB pages, measured once at load ~15: ~50 CPU
  ms/s shared against ~95 with a browser each) and far less memory. Every step still crosses Python,
  Playwright's driver, the browser process and the page's own renderer (browser contexts never share a
  renderer), so on 2 saturated cores both modes are bound by the same CPU per step and the steps/s ratio
  is about the ratio of CPU per step (table). With the old step path (Playwright handles, actionability
  polling, ~160 ms a step) 8 browsers polled more and the ratio was 2.2; with the lean path both modes got
  4-5x faster and the gap shrank. A speedup of 4 over a browser per env does not exist on this machine
  unless the baseline pays its browser per episode, as BrowserGym does.
- BrowserGym's rate is set by its reset: every episode closes and relaunches its task Chromium and its chat
  Chromium (seconds each here; with 8 envs, 16 launches compete for 2 cores), then each step waits 0.5 s
  (`pre_observation_delay`) plus 100 ms per Playwright call (`slow_mo`) and extracts a DOM snapshot and an
  accessibility tree (~0.6 s of CPU per step even tuned). Its episodes per task:
  {_wins_by_task(m)}.
- Latency of ours under load is mostly waiting for a core: a step is 1-2 sequential CDP round trips
  (click: point, then the mouse click together with the read of the page) at ~25-40 ms of CPU over four
  processes.

## Scripted solvers ({args.solver_episodes} episodes each, seeds 1000..)

| task | success |
|---|---|
{solver_rows}
"""
    out.with_suffix(".md").write_text(md)
    print(md)


def _wins_by_task(m: dict[str, Any]) -> str:
    parts = []
    for name, v in m.items():
        if name.startswith("browsergym") and isinstance(v, dict):
            wins = ", ".join(f"{t} {w}" for t, w in v.get("wins_by_task", {}).items())
            failed = "; ".join(v.get("failures", []))
            parts.append(f"{name}: {wins}" + (f" (failed: {failed})" if failed else ""))
    return "; ".join(parts) or "not run"


def _bgym_version(python: str) -> str:
    try:
        code = "import importlib.metadata as m; print(m.version('browsergym-miniwob'))"
        return (
            subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
            or "?"
        )
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    main()
