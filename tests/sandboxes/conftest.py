"""Fixtures for the sandbox tests: one docker sandbox and one process sandbox for the whole run, a hard
time bound per test, and the checks every hostile case ends with.

Under CI (``CI`` set) the docker tests fail when docker is missing; elsewhere they are skipped. The checks
every hostile case ends with live in `hostile_checks` (imported by the test files).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from toolgym.sandboxes import Sandbox, get_sandbox

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
