"""Hostile inputs that attack resources (reference cases 1-13, sandboxes_rewards.md §4). Each one checks the
typed status, the time bound, that no process survives and that the pool still serves (`contained`)."""

from __future__ import annotations

import time

import pytest

from tests.sandboxes.hostile_checks import contained, host_pids
from toolgym.sandboxes import Sandbox

T = 3.0  # the wall clock given to each hostile run
BOUND = T + 3.0  # what the caller may wait at most: timeout + grace + cleanup


@pytest.mark.bound(60)
@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['bash', '-c', ':(){ :|:& };:'])",
    ],
    ids=["python", "shell"],
)
def test_01_fork_bomb(docker_sb: Sandbox, code: str) -> None:
    before = host_pids()
    t0 = time.monotonic()
    res = docker_sb.run(code, timeout=T)
    # The shell bomb's first bash returns at once ("ok"); what matters is that its children die with the run.
    contained(docker_sb, res, {"timeout", "error", "ok"}, BOUND, t0)
    assert host_pids() < before + 50  # the pids cap held: nothing leaked onto the host


@pytest.mark.bound(30)
def test_02_thread_bomb(docker_sb: Sandbox) -> None:
    code = "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(100,)).start()"
    t0 = time.monotonic()
    res = docker_sb.run(code, timeout=T)
    contained(docker_sb, res, {"error", "timeout"}, BOUND, t0)
    assert "can't start new thread" in res.stderr or res.status == "timeout", res


@pytest.mark.bound(30)
@pytest.mark.parametrize(
    "code",
    ["b = bytearray(10**11)", "x = []\nwhile True:\n    x.append(bytearray(10**7))"],
    ids=["huge", "growing"],
)
def test_03_memory_bomb(any_sb: Sandbox, code: str) -> None:
    t0 = time.monotonic()
    res = any_sb.run(code, timeout=10)
    contained(any_sb, res, {"oom"}, 10 + 3, t0)


@pytest.mark.bound(30)
def test_04_slow_leak_is_oom_not_timeout(docker_sb: Sandbox) -> None:
    code = "import time\nx = []\nwhile True:\n    x.append(b'x' * 10**7)\n    time.sleep(0.02)"  # ~400 MB/s
    t0 = time.monotonic()
    res = docker_sb.run(code, timeout=15)
    contained(docker_sb, res, {"oom"}, 15, t0)


@pytest.mark.bound(30)
def test_05_cpu_spin(any_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = any_sb.run("while True:\n    pass", timeout=1.0)
    assert time.monotonic() - t0 < 1.0 + 1.0
    contained(any_sb, res, {"timeout"}, 3.0, t0)


@pytest.mark.bound(30)
def test_06_sleep_is_a_wall_clock_kill(any_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = any_sb.run("import time\ntime.sleep(10**6)", timeout=1.0)
    contained(any_sb, res, {"timeout"}, 3.0, t0)


@pytest.mark.bound(30)
def test_07_blocking_stdin_gets_eof(any_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = any_sb.run("input()", timeout=T)
    assert "EOFError" in res.stderr
    contained(any_sb, res, {"error"}, 1.5, t0)


@pytest.mark.bound(30)
@pytest.mark.parametrize(
    "code",
    [
        "import sys\nwhile True:\n    sys.stdout.write('y\\n' * 10000)",
        "import subprocess\nsubprocess.run(['yes'])",
        "print('x' * 10**8)",
    ],
    ids=["loop", "yes", "one-print"],
)
def test_08_output_flood_is_cut_at_the_source(any_sb: Sandbox, code: str) -> None:
    t0 = time.monotonic()
    res = any_sb.run(code, timeout=T)
    contained(any_sb, res, {"output_limit"}, BOUND, t0)
    assert res.truncated and len(res.stdout.encode()) <= any_sb.limits.output_bytes


@pytest.mark.bound(30)
def test_09_invalid_utf8_is_replaced(any_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = any_sb.run("import os, sys\nsys.stdout.buffer.write(os.urandom(10**5) + b'\\xff\\xfe')", timeout=T)
    contained(any_sb, res, {"ok"}, BOUND, t0)
    assert "\ufffd" in res.stdout


@pytest.mark.bound(30)
def test_10_disk_fill(any_sb: Sandbox) -> None:
    code = "f = open('big', 'wb')\nfor _ in range(10**4):\n    f.write(b'0' * 10**6)"  # 10 GB
    t0 = time.monotonic()
    res = any_sb.run(code, timeout=10)
    contained(any_sb, res, {"error"}, 13, t0)
    assert "No space left" in res.stderr or "File too large" in res.stderr, res.stderr[-500:]


@pytest.mark.bound(60)
def test_11_inode_exhaustion(docker_sb: Sandbox) -> None:
    code = "for i in range(10**6):\n    open(f'f{i}', 'w').close()"
    t0 = time.monotonic()
    res = docker_sb.run(code, timeout=20)
    contained(docker_sb, res, {"error"}, 23, t0)
    assert "No space left" in res.stderr, res.stderr[-500:]


@pytest.mark.bound(30)
def test_12_fd_exhaustion(any_sb: Sandbox) -> None:
    code = "import socket\nfs = []\nwhile True:\n    fs.append(open('/dev/null'))\n    fs.append(socket.socket())"
    t0 = time.monotonic()
    res = any_sb.run(code, timeout=T)
    contained(any_sb, res, {"error"}, BOUND, t0)
    assert "Too many open files" in res.stderr, res.stderr[-500:]


@pytest.mark.bound(30)
def test_13_deep_recursion(any_sb: Sandbox) -> None:
    code = "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1) + 1\nf(0)"
    t0 = time.monotonic()
    res = any_sb.run(code, timeout=T)
    # Python 3.11+ keeps Python frames off the C stack, so this may also just eat memory or time: any of
    # these is the code's failure, never a sandbox_error.
    contained(any_sb, res, {"error", "oom", "timeout"}, BOUND, t0)
