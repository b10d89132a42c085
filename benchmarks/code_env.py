"""Code env throughput: PythonMath-v0 episodes on docker sessions against `docker exec` per call, one run.

    python benchmarks/code_env.py [--quick] [--seconds 6]

An episode is three Python calls (``import math; x = factorial(20)``, ``y = x % 1000003``, ``print(y)``)
and a boxed final answer. Ours: ``toolgym/PythonMath-v0`` on the docker backend (a warm pool, one session
per episode, the box reset when the episode ends), whole env steps (parsing, transcript, reward). The
anchor, the common approach: the same three calls as ``docker exec <container> python3 -c CODE`` in a
running container of the same image and hardened settings (the docker SDK's ``exec_run``, which is cheaper
than the ``docker`` CLI); state comes from replaying the earlier cells, since each exec is a fresh
interpreter. Both run 1, 4 and 16 episodes at once from threads, each thread with its own env or container.

Then ``fork_ms_p50``: ``env.unwrapped.get_state()`` of an episode with a live interpreter (the session fork
plus the copy of the transcript), and ``set_state`` (a branch of that snapshot).
Writes benchmarks/results/code_env.md and code_env.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gymnasium as gym

import toolgym  # noqa: F401
from toolgym.envs.coding.interpreter import shared_sandbox
from toolgym.sandboxes.docker_backend import client, container_kwargs

CELLS = ("import math\nx = math.factorial(20)", "y = x % 1000003", "print(y)")
ANSWER = str(__import__("math").factorial(20) % 1000003)
LEVELS = (1, 4, 16)
RESULTS = Path(__file__).parent / "results"


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def ours_episode(env: Any, seed: int) -> None:
    env.reset(seed=seed)
    for cell in CELLS:
        obs, *_ = env.step(call(cell))
    assert obs[0]["content"] == ANSWER, obs
    # The task's own answer: checked on math_match's exact fast path, as an expert's would be. (A wrong
    # answer in another form, e.g. an integer against a fraction, goes to the Math-Verify process pool:
    # the first such answer starts the pool, seconds of start-up that once landed inside a timed cell.)
    env.step(f"\\boxed{{{env.unwrapped.task.answer}}}")


def exec_episode(box: Any, user: str) -> None:
    for i in range(len(CELLS)):
        code, out = box.exec_run(["python3", "-c", "\n".join(CELLS[: i + 1])], user=user)
        assert code == 0, out
    assert out.decode().strip() == ANSWER, out


def throughput(workers: int, seconds: float, episode: Any, make: Any) -> tuple[float, int]:
    """Episodes per second with ``workers`` threads looping for ``seconds`` (each thread its own state)."""
    counts = [0] * workers
    start = threading.Barrier(workers + 1)
    errors: list[BaseException] = []

    def loop(i: int) -> None:
        state = make(i)
        start.wait()
        stop = time.perf_counter() + seconds
        try:
            while time.perf_counter() < stop:
                episode(state, i * 100_000 + counts[i])
                counts[i] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - t0), sum(counts)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def humaneval_sweep(sb: Any, threads: int) -> dict[str, Any]:
    """Every HumanEval problem through Coding-v0's submit: the canonical solution, then each cheat."""
    from toolgym.envs.coding.cheats import CHEATS, cheat_code
    from toolgym.envs.coding.tasks import humaneval

    problems = humaneval()
    jobs = [(i, name) for i in range(len(problems)) for name in ["canonical", *CHEATS]]
    passed = dict.fromkeys(["canonical", *CHEATS], 0)
    errors: list[str] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        env = gym.make("toolgym/Coding-v0", sandbox=sb)
        try:
            for i, name in jobs[k::threads]:
                env.reset(options={"index": i})
                code = problems[i].canonical if name == "canonical" else cheat_code(name, problems[i])
                submit = json.dumps({"name": "submit", "arguments": {"code": code}})
                _, reward, _, truncated, info = env.step(f"<tool_call>{submit}</tool_call>")
                with lock:
                    passed[name] += reward == 1.0
                    if truncated:
                        errors.append(f"{problems[i].task_id} {name}: {info.get('infra_error')}")
        finally:
            env.close()

    t0 = time.perf_counter()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {
        "humaneval_problems": len(problems),
        "humaneval_passed": passed,
        "humaneval_env_errors": errors,
        "humaneval_seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per throughput measurement")
    ap.add_argument("--forks", type=int, default=200)
    ap.add_argument(
        "--humaneval", action="store_true", help="also submit every HumanEval canonical and cheat"
    )
    ap.add_argument("--out", default=str(RESULTS / "code_env"), help="results path without the suffix")
    args = ap.parse_args()
    seconds = 1.5 if args.quick else args.seconds
    pool = max(LEVELS) + 2
    sb = shared_sandbox("docker", pool_size=pool)
    for n in range(2, pool + 1, 2):  # a few containers at a time: a busy daemon times out big batches
        sb.warmup(n)
    lim = sb.limits
    envs: dict[int, Any] = {}

    def make_env(i: int) -> Any:
        if i not in envs:
            envs[i] = gym.make("toolgym/PythonMath-v0", sandbox=sb)
        return envs[i]

    cli = client()
    boxes = [
        cli.containers.run(**container_kwargs(lim, f"bench-code-env-{os.getpid()}-{i}"))
        for i in range(max(LEVELS))
    ]
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    try:
        for i in range(max(LEVELS)):  # warm both: first episodes pay for imports and page cache
            ours_episode(make_env(i), i)
            exec_episode(boxes[i], lim.user)
        for n in LEVELS:
            ours, ours_n = throughput(n, seconds, ours_episode, make_env)
            anchor, anchor_n = throughput(
                n, seconds, lambda b, _s: exec_episode(b, lim.user), lambda i: boxes[i]
            )
            rows.append(
                {"concurrency": n, "ours": ours, "ours_n": ours_n, "exec": anchor, "exec_n": anchor_n}
            )
            print(
                f"{n:>2} at once: ours {ours:8.1f} episodes/s ({ours_n}), docker exec {anchor:6.2f} ({anchor_n})"
            )
        env = make_env(0)
        env.reset(seed=1)
        for cell in CELLS:
            env.step(call(cell))
        inner = env.unwrapped
        forks, restores = [], []
        for _ in range(args.forks // (4 if args.quick else 1)):
            t = time.perf_counter()
            state = inner.get_state()
            forks.append(time.perf_counter() - t)
            t = time.perf_counter()
            inner.set_state(state)
            restores.append(time.perf_counter() - t)
            del state
        obs, *_ = env.step(call("print(y)"))
        assert obs[0]["content"] == ANSWER
    finally:
        for box in boxes:
            box.remove(force=True)
        for env in envs.values():
            env.close()
    sweep = humaneval_sweep(sb, threads=4) if args.humaneval else {}
    load_after = os.getloadavg()[0]
    result: dict[str, Any] = {}
    for r in rows:
        n = r["concurrency"]
        result[f"episodes_per_s_{n}"] = round(r["ours"], 2)
        result[f"docker_exec_episodes_per_s_{n}"] = round(r["exec"], 2)
        result[f"speedup_vs_docker_exec_{n}"] = round(r["ours"] / r["exec"], 1)
    result.update(
        fork_ms_min=round(1000 * min(forks), 2),
        fork_ms_p50=round(1000 * statistics.median(forks), 2),
        fork_ms_p90=round(1000 * pct(forks, 0.9), 2),
        set_state_ms_p50=round(1000 * statistics.median(restores), 2),
        set_state_ms_p90=round(1000 * pct(restores, 0.9), 2),
        forks=len(forks),
        seconds_per_measurement=seconds,
        cores=os.cpu_count(),
        machine=platform.machine(),
        docker=cli.version().get("Version"),
        load_average=[round(load_before, 1), round(load_after, 1)],
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python benchmarks/code_env.py"
        + (" --quick" if args.quick else "")
        + (" --humaneval" if args.humaneval else ""),
        **sweep,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Code env throughput (PythonMath-v0, 3-call episodes)",
        "",
        f"{result['date']}, {result['cores']} cores ({result['machine']}), docker {result['docker']}, "
        f"load average {load_before:.1f} before / {load_after:.1f} after (the machine is shared by several "
        f"engineers), `{result['command']}`, {seconds:g} s per cell.",
        "",
        "| episodes at once | toolgym sessions, episodes/s | docker exec per call, episodes/s | speedup |",
        "|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['ours']:,.1f} ({r['ours_n']} episodes) | {r['exec']:,.2f} "
            f"({r['exec_n']} episodes) | {r['ours'] / r['exec']:,.1f}x |"
        )
    lines += [
        "",
        "| fork of a live episode | min ms | p50 ms | p90 ms |",
        "|---|---:|---:|---:|",
        f"| `get_state()` (session fork + transcript copy) | {result['fork_ms_min']} | {result['fork_ms_p50']} | {result['fork_ms_p90']} |",
        f"| `set_state(state)` (a branch of the snapshot) | {round(1000 * min(restores), 2)} | {result['set_state_ms_p50']} | {result['set_state_ms_p90']} |",
        "",
        *_sweep_lines(sweep),
        "Ours runs whole env episodes (reset, three python steps, a boxed answer checked by math_match; the "
        "session's box is reset when the episode ends). The anchor runs only the three `exec_run` calls, "
        "replaying earlier cells for state. Goals set when the code envs were built: `speedup_vs_docker_exec_16` >= 20, "
        "`fork_ms_p50` <= 20.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


def _sweep_lines(sweep: dict[str, Any]) -> list[str]:
    if not sweep:
        return []
    n = sweep["humaneval_problems"]
    lines = [
        f"HumanEval through Coding-v0's submit ({sweep['humaneval_seconds']} s, 4 threads): passed of {n}",
        "",
        "| submission | passed |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {k}/{n} |" for name, k in sweep["humaneval_passed"].items()]
    lines += ["", f"env errors (excluded episodes): {len(sweep['humaneval_env_errors'])}", ""]
    return lines


if __name__ == "__main__":
    main()
