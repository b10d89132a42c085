"""Fixtures for the sandbox tests: one docker sandbox and one process sandbox for the whole run, a hard
time bound per test, and the checks every hostile case ends with.

Under CI (``CI`` set) the docker tests fail when docker is missing; elsewhere they are skipped.
"""

from __future__ import annotations

import glob
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolgym.sandboxes import ExecResult, Sandbox, get_sandbox

IMAGE = os.environ.get("TOOLGYM_SANDBOX_IMAGE", "toolgym-sandbox:latest")
POOL = 2
os.environ["TOOLGYM_TEST_HOST_SECRET"] = "hunter2"  # must never be visible inside a sandbox


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "bound(seconds): fail the test when it runs longer (default 60 s)")


@pytest.fixture(autouse=True)
def _time_bound(request: Any) -> Iterator[None]:
    marker = request.node.get_closest_marker("bound")
    seconds = marker.args[0] if marker else 60

    def expire(*_: object) -> None:
        raise TimeoutError(f"test ran past its bound of {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def docker_sb() -> Iterator[Sandbox]:
    from toolgym.sandboxes.docker_backend import docker_problem

    problem = docker_problem(IMAGE)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"docker sandbox unavailable under CI: {problem}")
        pytest.skip(f"docker sandbox unavailable: {problem}")
    sb = get_sandbox("docker", image=IMAGE, pool_size=POOL)
    sb.warmup()
    yield sb
    sb.close()


@pytest.fixture(scope="session")
def process_sb() -> Iterator[Sandbox]:
    sb = get_sandbox("process", pool_size=POOL)
    yield sb
    sb.close()


@pytest.fixture(params=["docker", "process"])
def any_sb(request: Any) -> Sandbox:
    """Both backends: for the cases the process backend claims to cover."""
    return request.getfixturevalue(f"{request.param}_sb")


def host_pids() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


def survivors(sb: Sandbox) -> list[str]:
    """Processes in this sandbox's boxes beyond PID 1 and the supervisor (call when no session is open;
    workers are forks of the supervisor, so they are counted, not matched by name)."""
    left: list[str] = []
    if sb.backend == "docker":
        from toolgym.sandboxes.docker_backend import client

        for c in client().containers.list(filters={"name": sb._prefix}):  # type: ignore[attr-defined]
            try:
                procs = c.top(ps_args="-o pid,stat,args")["Processes"] or []
            except Exception:  # removed meanwhile (the pool replaced it)
                continue
            if len(procs) > 2:
                left += [" ".join(p) for p in procs]
    else:
        from toolgym.sandboxes.process_backend import MARK

        groups: dict[bytes, list[str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"unshare\0"):  # the namespace launcher in front of the supervisor
                continue
            for var in env:
                if var.startswith(f"{MARK}=".encode()):
                    groups.setdefault(var, []).append(f"{entry} {cmd.decode(errors='replace')}")
        left = [p for procs in groups.values() if len(procs) > 1 for p in procs]
    return left


HOST_PIDS_AT_START = host_pids()


def host_unaffected() -> None:
    """Files the hostile code writes (all named /tmp/tg-hostile-*) never appear on the host, and the host's
    process count stays near where it was (a leaked fork bomb would blow it up)."""
    assert not glob.glob("/tmp/tg-hostile-*"), glob.glob("/tmp/tg-hostile-*")
    assert host_pids() < HOST_PIDS_AT_START + 400, (host_pids(), HOST_PIDS_AT_START)


def contained(sb: Sandbox, res: ExecResult, statuses: set[str], max_s: float, t0: float) -> None:
    """The checks every hostile case ends with: typed status, elapsed bound, host unaffected, no survivors,
    still serving."""
    elapsed = time.monotonic() - t0
    assert res.status in statuses, res
    assert elapsed < max_s, f"took {elapsed:.1f} s (bound {max_s} s): {res}"
    deadline = time.monotonic() + 3
    while (left := survivors(sb)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes survived the call: {left}"
    host_unaffected()
    after = sb.run("print(6 * 7)", timeout=10)
    assert after.status == "ok" and after.stdout == "42\n", after
