"""Sandbox latency: plain docker against our one-shot runs, session calls and forks, in one run.

    python benchmarks/sandbox_latency.py [--quick] [--out benchmarks/results/sandbox_latency.md]

Rows: `docker run` of a fresh hardened container (`python3 -c pass`); `docker exec` of `python3 -c pass`
in a running one; a bare persistent interpreter on an exec stream (no supervisor: the floor); our one-shot
`Sandbox.run` (sequential latency, then throughput from 2 threads); our session call; our fork. Every
container uses the same image and hardened settings. Ratios are against `docker run`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from toolgym.sandboxes import get_sandbox
from toolgym.sandboxes.channel import DockerExecChannel
from toolgym.sandboxes.docker_backend import ENV, client, container_kwargs

BARE = "import sys\nfor line in sys.stdin:\n    exec(line)\n    sys.stdout.write('.\\n')\n    sys.stdout.flush()\n"


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples (CI smoke)")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    args = ap.parse_args()
    k = 5 if args.quick else 1
    cli = client()
    sb = get_sandbox("docker", pool_size=2)
    lim = sb.limits
    rows: list[tuple[str, list[float], float | None]] = []

    def docker_run() -> None:
        kw = container_kwargs(lim, f"bench-run-{time.monotonic_ns()}")
        kw.update(command=["python3", "-c", "pass"], detach=False, remove=True)
        kw.pop("stop_signal")
        cli.containers.run(**kw)

    rows.append(("docker run (fresh hardened container)", timed(docker_run, 20 // k), None))

    kw = container_kwargs(lim, f"bench-exec-{os.getpid()}")
    box = cli.containers.run(**kw)
    try:
        rows.append(
            (
                "docker exec python3 -c pass",
                timed(lambda: box.exec_run(["python3", "-c", "pass"], user=lim.user), 50 // k),
                None,
            )
        )
        exec_id = cli.api.exec_create(
            box.id, ["python3", "-u", "-c", BARE], stdin=True, user=lim.user, environment=ENV
        )
        sock = cli.api.exec_start(exec_id["Id"], socket=True)
        ch = DockerExecChannel(getattr(sock, "_sock", sock))

        def bare() -> None:
            ch._send(b"pass\n")
            ch._take(2, time.monotonic() + 5)

        bare()
        rows.append(("bare persistent interpreter (no supervisor)", timed(bare, 3000 // k), None))
        ch.close()
    finally:
        box.remove(force=True)

    sb.warmup()
    sb.run("pass", timeout=10)
    rows.append(("toolgym one-shot Sandbox.run", timed(lambda: sb.run("pass", timeout=10), 300 // k), None))
    n_thr = 200 // k
    done = []

    def loop() -> None:
        for _ in range(n_thr):
            done.append(sb.run("pass", timeout=10).ok)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    oneshot_rate = len(done) / (time.perf_counter() - t0)
    assert all(done)

    s = sb.session()
    s.run("x = 0")
    lat = timed(lambda: s.run("x += 1"), 5000 // k)
    rows.append(("toolgym session call (warm)", lat, None))
    forks = []
    for _ in range(200 // k):
        t = time.perf_counter()
        f = s.fork()
        forks.append(time.perf_counter() - t)
        f.close()
    rows.append(("toolgym fork (copy-on-write branch)", forks, None))
    s.close()
    sb.close()

    base = statistics.median(rows[0][1])
    rates = {
        "toolgym one-shot Sandbox.run": oneshot_rate,
        "toolgym session call (warm)": 1 / statistics.mean(lat),
    }
    lines = [
        f"Sandbox latency, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), docker {cli.version()['Version']}, image {lim.image}, "
        f"load average {os.getloadavg()[0]:.1f} (the machine is shared), "
        f"`python benchmarks/sandbox_latency.py{' --quick' if args.quick else ''}`.",
        "",
        "| what | n | p50 ms | p99 ms | per second | p50 vs docker run |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, xs, _ in rows:
        rate = rates.get(name, 1 / statistics.mean(xs))
        lines.append(
            f"| {name} | {len(xs)} | {statistics.median(xs) * 1e3:.2f} | {pct(xs, 0.99) * 1e3:.2f} | {rate:,.0f} | "
            f"{statistics.median(xs) / base:.4f}x |"
        )
    lines += [
        "",
        "`per second` is 1 / mean latency from one thread, except the one-shot row: runs/s from 2 threads "
        f"({2 * n_thr} runs over the 2-container pool). Goals (issue 3): session p50 <= 1 ms and p99 <= 10 ms, "
        "fork <= 20 ms, >= 1,000 session calls/s, >= 30 one-shot runs/s on 2 cores.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
