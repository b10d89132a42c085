"""Sandbox latency: plain docker against our one-shot runs, session calls and forks, in one run.

    python benchmarks/sandbox_latency.py [--quick] [--out benchmarks/results/sandbox_latency.md]
        [--compare-ref GIT_REF]

Rows: `docker run` of a fresh hardened container (`python3 -c pass`); `docker exec` of `python3 -c pass`
in a running one; a bare persistent interpreter on an exec stream (no supervisor: the floor); our one-shot
`Sandbox.run` (sequential latency, then throughput from 2 threads); our session call; our fork. Every
container uses the same image and hardened settings. Ratios are against `docker run`.

``--compare-ref REF`` also measures the sandbox package as it was at git ``REF`` (extracted to a temporary
dir and run in a subprocess, in the same run, on the same machine), so a change's cost is read off one
table even on a shared, noisy machine. Results go to ``--out`` (markdown) and the same name with ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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


def toolgym_rows(k: int) -> tuple[list[tuple[str, list[float]]], dict[str, float]]:
    """Our one-shot runs, session calls and forks (whichever toolgym.sandboxes is importable)."""
    sb = get_sandbox("docker", pool_size=2)
    rows: list[tuple[str, list[float]]] = []
    sb.warmup()
    sb.run("pass", timeout=10)
    rows.append(("toolgym one-shot Sandbox.run", timed(lambda: sb.run("pass", timeout=10), 300 // k)))
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
    rows.append(("toolgym session call (warm)", lat))
    forks = []
    for _ in range(200 // k):
        t = time.perf_counter()
        f = s.fork()
        forks.append(time.perf_counter() - t)
        f.close()
    rows.append(("toolgym fork (copy-on-write branch)", forks))
    s.close()
    sb.close()
    rates = {
        "toolgym one-shot Sandbox.run": oneshot_rate,
        "toolgym session call (warm)": 1 / statistics.mean(lat),
    }
    return rows, rates


def docker_rows(k: int) -> list[tuple[str, list[float]]]:
    cli = client()
    lim = get_sandbox("docker", pool_size=1).limits
    rows: list[tuple[str, list[float]]] = []
    user = lim.user

    def docker_run() -> None:
        kw = container_kwargs(lim, f"bench-run-{time.monotonic_ns()}")
        kw.update(command=["python3", "-c", "pass"], detach=False, remove=True, user=user)
        kw.pop("stop_signal")
        cli.containers.run(**kw)

    rows.append(("docker run (fresh hardened container)", timed(docker_run, 20 // k)))
    kw = container_kwargs(lim, f"bench-exec-{os.getpid()}")
    box = cli.containers.run(**kw)
    try:
        rows.append(
            (
                "docker exec python3 -c pass",
                timed(lambda: box.exec_run(["python3", "-c", "pass"], user=user), 50 // k),
            )
        )
        exec_id = cli.api.exec_create(
            box.id, ["python3", "-u", "-c", BARE], stdin=True, user=user, environment=ENV
        )
        sock = cli.api.exec_start(exec_id["Id"], socket=True)
        ch = DockerExecChannel(getattr(sock, "_sock", sock))

        def bare() -> None:
            ch._send(b"pass\n")
            ch._take(2, time.monotonic() + 5)

        bare()
        rows.append(("bare persistent interpreter (no supervisor)", timed(bare, 3000 // k)))
        ch.close()
    finally:
        box.remove(force=True)
    return rows


def old_rows(ref: str, k: int) -> tuple[list[tuple[str, list[float]]], dict[str, float]]:
    """`toolgym_rows` for the sandbox package at git ``ref``, in a subprocess that imports it instead."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        pkg = Path(tmp) / "toolgym"
        pkg.mkdir()
        for item in (repo / "toolgym").iterdir():
            (pkg / item.name).symlink_to(item)
        for part in ("envs", "rewards", "agents", "trainers"):
            if (repo / part).exists():
                (pkg / part).symlink_to(repo / part)
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", ref, "sandboxes"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        (pkg / "sandboxes").symlink_to(Path(tmp) / "sandboxes")
        out = Path(tmp) / "rows.json"
        env = {**os.environ, "PYTHONPATH": tmp}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--toolgym-only", str(out), "--k", str(k)]
        subprocess.run(cmd, env=env, cwd=tmp, check=True)
        data = json.loads(out.read_text())
    return [(n, xs) for n, xs in data["rows"]], data["rates"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples (CI smoke)")
    ap.add_argument("--out", default=None, help="also write the markdown table here (and NAME.json)")
    ap.add_argument("--compare-ref", default=None, help="also measure the sandbox package at this git ref")
    ap.add_argument("--toolgym-only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    k = args.k or (5 if args.quick else 1)
    if args.toolgym_only:
        rows, rates = toolgym_rows(k)
        Path(args.toolgym_only).write_text(json.dumps({"rows": rows, "rates": rates}))
        return
    cli = client()
    lim = get_sandbox("docker", pool_size=1).limits
    rows = docker_rows(k)
    named: list[tuple[str, list[float]]] = list(rows)
    rates: dict[str, float] = {}
    if args.compare_ref:
        old, old_rates = old_rows(args.compare_ref, k)
        named += [(f"{n} @ {args.compare_ref}", xs) for n, xs in old]
        rates.update({f"{n} @ {args.compare_ref}": r for n, r in old_rates.items()})
    new, new_rates = toolgym_rows(k)
    named += new
    rates.update(new_rates)
    base = statistics.median(named[0][1])
    lines = [
        f"Sandbox latency, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), docker {cli.version()['Version']}, image {lim.image}, "
        f"load average {os.getloadavg()[0]:.1f} (the machine is shared), "
        f"`python benchmarks/sandbox_latency.py{' --quick' if args.quick else ''}"
        f"{f' --compare-ref {args.compare_ref}' if args.compare_ref else ''}`.",
        "",
        "| what | n | p50 ms | p99 ms | per second | p50 vs docker run |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    table = {}
    for name, xs in named:
        rate = rates.get(name, 1 / statistics.mean(xs))
        p50, p99 = statistics.median(xs) * 1e3, pct(xs, 0.99) * 1e3
        table[name] = {"n": len(xs), "p50_ms": p50, "p99_ms": p99, "per_second": rate}
        lines.append(
            f"| {name} | {len(xs)} | {p50:.2f} | {p99:.2f} | {rate:,.0f} | {p50 / 1e3 / base:.4f}x |"
        )
    lines += [
        "",
        "`per second` is 1 / mean latency from one thread, except the one-shot rows: runs/s from 2 threads "
        f"({2 * (200 // k)} runs over the 2-container pool). Goals (issue 3): session p50 <= 1 ms and p99 <= 10 ms, "
        "fork <= 20 ms, >= 1,000 session calls/s, >= 30 one-shot runs/s on 2 cores.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
