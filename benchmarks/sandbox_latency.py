"""Sandbox latency: plain docker against our one-shot runs, session calls and forks, in one run.

    python benchmarks/sandbox_latency.py [--quick] [--out benchmarks/results/sandbox_latency.md]
        [--compare-ref GIT_REF]

Rows: `docker run` of a fresh hardened container (`python3 -c pass`); `docker exec` of `python3 -c pass`
in a running one; a bare persistent interpreter on an exec stream (no supervisor: the floor); our one-shot
`Sandbox.run` (sequential latency, then throughput from 2 threads); our session call; our fork. Every
container uses the same image and hardened settings. Ratios are against `docker run`.

``--compare-ref REF`` also measures the sandbox package as it was at git ``REF`` (extracted to a temporary
dir) against this checkout: two driver subprocesses, one per version, take turns in small batches, so both
see the same machine load and a change's cost is read off one table even on a shared, noisy machine. Results go to ``--out`` (markdown) and the same name with ``.json``.
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
from typing import Any

from toolgym.sandboxes import get_sandbox
from toolgym.sandboxes.channel import DockerExecChannel
from toolgym.sandboxes.docker_backend import client, container_kwargs

try:
    from toolgym.sandboxes.limits import BOX_ENV
except ImportError:  # a --compare-ref package from before the box environment moved to limits
    from toolgym.sandboxes.docker_backend import ENV as BOX_ENV  # type: ignore[attr-defined,no-redef]

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


def spare_rows(sb: Any, k: int) -> list[tuple[str, list[float]]]:
    """What the options for a session's first worker cost, on one box, timed at the supervisor's call: the
    box's spare (root until it takes the session, the default) against a fresh fork of the supervisor
    (what a box without a spare does: the option of no reuse at all)."""
    box = sb.pool.acquire()
    spare, fresh = [], []
    blobs = {"code": b"pass"}
    for i in range(2 * (100 // k)):
        if i % 2:  # a one-shot run drops the spare: the next session's worker is a fresh fork
            box.call({"op": "run", "timeout": 10}, {"code": b"pass"}, 10)
        else:
            box.call({"op": "reset"}, timeout=10)
            time.sleep(0.01)  # the spare is made at the session before: let it settle, as between episodes
        t = time.perf_counter()
        reply, _ = box.call({"op": "exec", "spawn": True, "timeout": 10}, blobs, 10)
        (fresh if i % 2 else spare).append(time.perf_counter() - t)
        box.call({"op": "kill", "wid": reply["wid"]}, timeout=10)
    sb.pool.release(box, reset=True)
    return [
        ("new session's first call: from the box's spare (default)", spare),
        ("new session's first call: a fresh fork (no spare)", fresh),
    ]


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
        t1 = time.perf_counter()
        f = s.fork()
        forks.append(time.perf_counter() - t1)
        f.close()
    rows.append(("toolgym fork (copy-on-write branch)", forks))
    s.close()
    rows += spare_rows(sb, k)
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
    user = "200000:200000" if lim.user == "box" else lim.user  # a box uid, as ours get

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
            box.id, ["python3", "-u", "-c", BARE], stdin=True, user=user, environment=BOX_ENV
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


def box_cpu(boxes: list[Any]) -> float:
    """CPU seconds used so far by these containers (cgroup v1 cpuacct or v2 cpu.stat), 0 if unreadable."""
    total = 0.0
    for c in boxes:
        for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{c.id}/cpuacct.usage", 1e-9),
                            (f"/sys/fs/cgroup/system.slice/docker-{c.id}.scope/cpu.stat", 1e-6)):  # fmt: skip
            try:
                text = Path(path).read_text()
            except OSError:
                continue
            total += scale * int(text.split()[1] if "usage_usec" in text else text)
            break
    return total


def drive() -> None:
    """Driver mode (a subprocess per implementation): one warm sandbox and session; each stdin line
    ``KIND N`` runs N timed calls of that kind and answers one JSON list of seconds."""
    sb = get_sandbox("docker", pool_size=2)
    sb.warmup()
    s = sb.session()
    s.run("x = 0")
    print("ready", flush=True)

    def fork() -> None:
        s.fork().close()

    def start() -> None:  # a new session's first call: served from the box's spare worker
        fresh = sb.session()
        fresh.run("pass")
        fresh.close()

    kinds = {
        "session": lambda: s.run("x += 1"),
        "oneshot": lambda: sb.run("pass", timeout=10),
        "fork": fork,
        "start": start,
    }
    box = client().containers.list(filters={"name": sb._prefix})  # type: ignore[attr-defined]
    for line in sys.stdin:
        kind, n = line.split()
        if kind == "cpu":  # CPU seconds the session's container spends per call: load-independent
            a = box_cpu(box)
            timed(kinds["session"], int(n))
            print(json.dumps([(box_cpu(box) - a) / int(n)]), flush=True)
            continue
        print(json.dumps(timed(kinds[kind], int(n))), flush=True)
    s.close()
    sb.close()


def interleaved(ref: str, k: int) -> list[tuple[str, list[float]]]:
    """Our one-shot, session and fork rows for the package at git ``ref`` and for this checkout, measured
    in alternating small batches from two driver subprocesses, so both see the same machine load."""
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
        me = str(Path(__file__).resolve())
        drivers = {
            f"@ {ref}": subprocess.Popen(
                [sys.executable, me, "--drive"],
                env={**os.environ, "PYTHONPATH": tmp},
                cwd=tmp,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            ),
            "(this checkout)": subprocess.Popen(
                [sys.executable, me, "--drive"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            ),
        }
        for d in drivers.values():
            assert d.stdout is not None and d.stdout.readline().strip() == "ready"
        plan = {
            "oneshot": (300 // k, 20),
            "session": (5000 // k, 250),
            "fork": (200 // k, 10),
            "start": (200 // k, 10),
            "cpu": (4000 // k, 500),
        }
        got: dict[tuple[str, str], list[float]] = {}
        for kind, (total, batch) in plan.items():
            for i in range(max(1, total // batch)):
                order = list(drivers.items()) if i % 2 == 0 else list(reversed(drivers.items()))
                for tag, d in order:
                    assert d.stdin is not None and d.stdout is not None
                    d.stdin.write(f"{kind} {batch}\n")
                    d.stdin.flush()
                    got.setdefault((kind, tag), []).extend(json.loads(d.stdout.readline()))
        for d in drivers.values():
            assert d.stdin is not None
            d.stdin.close()
            d.wait(timeout=60)
    names = {"oneshot": "toolgym one-shot Sandbox.run", "session": "toolgym session call (warm)",
             "fork": "toolgym fork (copy-on-write branch)",
             "start": "toolgym new session + first call + close",
             "cpu": "box CPU per session call (not latency)"}  # fmt: skip
    return [(f"{names[kind]} {tag}", xs) for (kind, tag), xs in got.items()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples (CI smoke)")
    ap.add_argument("--out", default=None, help="also write the markdown table here (and NAME.json)")
    ap.add_argument("--compare-ref", default=None, help="also measure the sandbox package at this git ref")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    k = 5 if args.quick else 1
    if args.drive:
        drive()
        return
    cli = client()
    lim = get_sandbox("docker", pool_size=1).limits
    rows = docker_rows(k)
    named: list[tuple[str, list[float]]] = list(rows)
    rates: dict[str, float] = {}
    if args.compare_ref:
        named += interleaved(args.compare_ref, k)
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
        f"({2 * (200 // k)} runs over the 2-container pool). Goals set when the sandboxes were built: session p50 <= 1 ms and p99 <= 10 ms, "
        "fork <= 20 ms, >= 1,000 session calls/s, >= 30 one-shot runs/s on 2 cores.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
