"""The opt-in gVisor tier (``get_sandbox("docker", runtime="runsc")``): a clear error where the runtime is not
registered with dockerd, and a smoke test of what the tier covers where it is (skipped elsewhere)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.sandboxes import Sandbox, get_sandbox

IMAGE = os.environ.get("TOOLGYM_SANDBOX_IMAGE", "toolgym-sandbox:latest")


class _Daemon:
    def __init__(self, runtimes: dict[str, Any]) -> None:
        self.runtimes = runtimes

    def info(self) -> dict[str, Any]:
        return {"Runtimes": self.runtimes}


def test_an_unregistered_runtime_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolgym.sandboxes import docker_backend

    monkeypatch.setattr(docker_backend, "docker_problem", lambda image: None)
    monkeypatch.setattr(docker_backend, "client", lambda: _Daemon({"runc": {}}))
    with pytest.raises(InfrastructureError, match=r"'runsc' is not registered.*apt-get install runsc"):
        get_sandbox("docker", runtime="runsc")
    with pytest.raises(InfrastructureError, match="'kata' is not registered"):
        get_sandbox("auto", runtime="kata")
    monkeypatch.setattr(docker_backend, "client", lambda: _Daemon({"runc": {}, "runsc": {}}))
    assert docker_backend.runtime_problem("runsc") is None
    assert docker_backend.runtime_problem(None) is None


def test_a_runtime_belongs_to_the_docker_backend() -> None:
    with pytest.raises(ConfigError, match="docker runtime"):
        get_sandbox("process", runtime="runsc")


@pytest.fixture(scope="module")
def gvisor_sb() -> Iterator[Sandbox]:
    from toolgym.sandboxes.docker_backend import docker_problem, runtime_problem

    problem = docker_problem(IMAGE) or runtime_problem("runsc")
    if problem is not None:
        pytest.skip(f"no gVisor here: {problem}")
    sb = get_sandbox("docker", image=IMAGE, runtime="runsc", pool_size=1)
    yield sb
    sb.close()


@pytest.mark.bound(120)
def test_gvisor_runs_code_and_sessions_but_refuses_to_fork(gvisor_sb: Sandbox) -> None:
    """Under gVisor the code sees gVisor's kernel, not the host's; one-shot runs, sessions, leftover-process
    and thread checks work; forking a session is refused with a clear error (gVisor has no subreaper)."""
    res = gvisor_sb.run("import os\nprint(os.uname().release, os.getuid())", timeout=30)
    assert res.ok and 200000 <= int(res.stdout.split()[1]) < 300000, res  # a uid of its own per box
    assert res.stdout.split()[0] != os.uname().release  # the host kernel is not the one answering
    with gvisor_sb.session() as s:
        assert s.run("x = 41", timeout=30).ok
        s.run("import subprocess\np = subprocess.Popen(['sh', '-c', 'sleep 1000 & sleep 1000'])", timeout=30)
        res = s.run("x += 1\nprint(x, p.poll())", timeout=30)
        assert res.ok and res.stdout == "42 -9\n", res
        with pytest.raises(InfrastructureError, match="subreaper"):
            s.fork()
        res = s.run(
            "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", timeout=30
        )
        assert len(res.stdout.split(",")) <= 4, res  # init, the supervisor, this worker (and ps itself)


@pytest.mark.bound(120)
def test_gvisor_says_up_front_it_cannot_fork_and_an_oom_is_oom(gvisor_sb: Sandbox) -> None:
    """Class 7: envs and rollouts see ``supports_fork`` False before any episode; memory past the cap is the
    code's ``oom`` (RLIMIT_AS inside gVisor), fast, never a dead box (``sandbox_error``)."""
    assert gvisor_sb.supports_fork is False
    for code in ("x = bytearray(2 << 30)", "x = [bytearray(1 << 20) for _ in range(4096)]"):
        t0 = time.monotonic()
        res = gvisor_sb.run(code, timeout=30)
        assert res.status == "oom" and time.monotonic() - t0 < 15, res
    assert gvisor_sb.run("print(1)", timeout=30).stdout == "1\n"
