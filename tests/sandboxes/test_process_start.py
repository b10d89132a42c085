"""The process backend starts wherever its Python lives (a venv under /tmp included), binds nothing of the
project or the user's files, keeps the host's IPC limits out of reach, and when it cannot start, says so
up front with bwrap's own words (class 4 and 5 of docs/sandboxes.md's threat model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes
from toolgym.errors import InfrastructureError
from toolgym.sandboxes import Sandbox, get_sandbox


@pytest.mark.bound(180)
def test_class5_a_venv_under_tmp_runs_boxes(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = Path("/tmp") / f"tg-venv-test-{os.getpid()}"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
    )
    try:
        code = (
            "from toolgym.sandboxes import get_sandbox\n"
            "sb = get_sandbox('process', pool_size=1)\n"
            "print(sb.run('print(6 * 7)').stdout.strip())\n"
            "s = sb.session(); s.run('x = 1'); print(s.fork().run('print(x + 1)').stdout.strip()); s.close()\n"
            "sb.close()"
        )
        out = processes.run([str(venv / "bin" / "python"), "-c", code], timeout=120, cwd="/")
        assert out.returncode == 0 and out.stdout.split() == ["42", "2"], out.stderr[-2000:]
    finally:
        subprocess.run(["rm", "-rf", str(venv)], check=False)


@pytest.mark.bound(60)
def test_class4_the_box_sees_no_project_no_sys_and_no_host_mounts(process_sb: Sandbox) -> None:
    import toolgym

    project = str(Path(toolgym.__file__).resolve().parents[1])
    probe = (
        "import os, json\n"
        f"print(json.dumps({{'project': os.path.exists({project!r}), 'net': os.path.exists('/sys/class/net'),"
        " 'mounts': open('/proc/self/mountinfo').read(), 'home': os.path.exists('/home') and os.listdir('/home')}))"
    )
    res = process_sb.run(probe, timeout=10)
    assert res.ok, res
    import json

    out = json.loads(res.stdout)
    assert not out["project"] and not out["net"] and not out["home"], out
    assert project not in out["mounts"] and "/var/lib/docker" not in out["mounts"], out["mounts"]


@pytest.mark.bound(60)
def test_class4_sysv_shared_memory_cannot_grow_past_the_box(process_sb: Sandbox) -> None:
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "ids = [libc.shmget(0, 64 << 20, 0o1600) for _ in range(4)]\n"
        "small = [libc.shmget(0, 4 << 20, 0o1600) for _ in range(8)]\n"
        "print(sum(i >= 0 for i in ids), sum(i >= 0 for i in small))"
    )
    res = process_sb.run(code, timeout=10)
    assert res.ok and res.stdout.split() == ["0", "4"], res  # 16 MiB in all


def test_class5_a_box_that_cannot_start_fails_up_front_with_bwraps_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from toolgym.sandboxes import process_backend

    real = process_backend.bwrap_command
    monkeypatch.setattr(
        process_backend,
        "bwrap_command",
        lambda lim, uid: [*real(lim, uid)[:1], "--ro-bind", "/nonexistent-tg", "/x", *real(lim, uid)[1:]],
    )
    process_backend.process_problem.cache_clear()
    try:
        problem = process_backend.process_problem()
        assert problem is not None and "nonexistent-tg" in problem, problem
        with pytest.raises(InfrastructureError, match="nonexistent-tg"):
            get_sandbox("process")
    finally:
        process_backend.process_problem.cache_clear()


def test_class5_doctor_and_docker_advise_no_broken_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from toolgym.cli.sandbox import cmd_doctor
    from toolgym.sandboxes import docker_backend, process_backend

    monkeypatch.setattr(docker_backend, "docker_problem", lambda image: "no docker daemon answers")
    monkeypatch.setattr(process_backend, "process_problem", lambda: "the process sandbox did not start: x")
    with pytest.raises(InfrastructureError) as err:
        get_sandbox("auto")
    assert "process" not in str(err.value), err.value
    cmd_doctor(argparse.Namespace(image="toolgym-sandbox:latest", json=False, prune=False))
    out = capsys.readouterr().out
    assert "ok process backend" not in out and "-- process backend" in out, out
