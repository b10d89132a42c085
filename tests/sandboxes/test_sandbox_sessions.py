"""Persistent sessions (reference cases 23-27) and fork."""

from __future__ import annotations

import time

import pytest

from tests.sandboxes.hostile_checks import host_unaffected, survivors
from toolgym.sandboxes import Sandbox


def _closed_cleanly(sb: Sandbox) -> None:
    deadline = time.monotonic() + 3
    while (left := survivors(sb)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left
    host_unaffected()
    assert sb.run("print(1)", timeout=10).stdout == "1\n"


@pytest.mark.bound(30)
def test_24_state_persists_across_turns(any_sb: Sandbox) -> None:
    with any_sb.session() as s:
        assert s.run("x = 41").ok
        res = s.run("print(x + 1)")
        assert res.ok and res.stdout == "42\n" and not res.restarted, res
        assert s.run("import math\ny = math.sqrt(16)").ok
        assert s.run("print(y)").stdout == "4.0\n"
    _closed_cleanly(any_sb)


@pytest.mark.bound(30)
def test_stdin_traceback_and_exit_codes_in_a_session(any_sb: Sandbox) -> None:
    with any_sb.session() as s:
        assert s.run("print(input())", stdin="hello").stdout == "hello\n"
        err = s.run("1 / 0")
        assert err.status == "error" and "ZeroDivisionError" in err.stderr and "<cell" in err.stderr
        assert s.run("import sys\nsys.exit(0)").ok  # SystemExit does not end the session
        assert s.run("print('still here')").stdout == "still here\n"


@pytest.mark.bound(40)
@pytest.mark.parametrize(
    "crash, status",
    [
        ("import os\nos._exit(1)", "error"),
        ("import ctypes\nctypes.string_at(0)", "error"),
        ("import time\ntime.sleep(100)", "timeout"),
    ],
    ids=["exit", "segfault", "timeout"],
)
def test_25_a_dead_interpreter_is_replaced_and_says_so(any_sb: Sandbox, crash: str, status: str) -> None:
    with any_sb.session() as s:
        s.run("x = 1")
        t0 = time.monotonic()
        res = s.run(crash, timeout=1.0)
        assert res.status == status and time.monotonic() - t0 < 4, res
        nxt = s.run("print('x' in dir())")
        assert nxt.ok and nxt.restarted and nxt.stdout == "False\n", nxt
        assert not s.run("print(1)").restarted
    _closed_cleanly(any_sb)


@pytest.mark.bound(40)
def test_26_oom_inside_a_session_and_the_episode_goes_on(docker_sb: Sandbox) -> None:
    with docker_sb.session() as s:
        s.run("keep = 'me'")
        res = s.run(
            "x = []\nwhile True:\n    x.append(bytearray(10**7))\n    x[-1][::4096] = b'1' * len(x[-1][::4096])",
            timeout=20,
        )
        assert res.status == "oom", res
        nxt = s.run("print(2 + 2)")
        assert nxt.ok and nxt.restarted and nxt.stdout == "4\n", nxt
    _closed_cleanly(docker_sb)


@pytest.mark.bound(30)
def test_26_memory_error_in_a_process_session(process_sb: Sandbox) -> None:
    with process_sb.session() as s:
        s.run("keep = 'me'")
        assert s.run("b = bytearray(10**11)").status == "oom"
        assert s.run("print(keep)").stdout == "me\n"  # a MemoryError does not kill the interpreter


@pytest.mark.bound(30)
def test_23_background_writer_does_not_flood_the_next_turn(any_sb: Sandbox) -> None:
    """A thread left running after its call restarts the interpreter (a session keeps no threads between
    calls), so nothing it writes reaches a later call."""
    with any_sb.session() as s:
        first = s.run(
            "import threading, sys\ndef spam():\n    while True:\n        sys.stdout.write('z' * 4096)\n"
            "threading.Thread(target=spam, daemon=True).start()"
        )
        assert "thread" in first.detail, first
        t0 = time.monotonic()
        res = s.run("print('answer')", timeout=5)
        assert time.monotonic() - t0 < 6
        assert res.ok and res.stdout == "answer\n" and res.restarted, res
    _closed_cleanly(any_sb)


@pytest.mark.bound(30)
def test_27_sessions_are_isolated(docker_sb: Sandbox) -> None:
    with docker_sb.session() as a, docker_sb.session() as b:
        assert a.run(
            "secret = 's3'\nopen('/tmp/tg-hostile-a', 'w').write('a')\nopen('mine', 'w').write('x')"
        ).ok
        res = b.run(
            "import os\nprint('secret' in dir(), os.path.exists('/tmp/tg-hostile-a'), os.path.exists('mine'))"
        )
        assert res.stdout == "False False False\n", res
    _closed_cleanly(docker_sb)


@pytest.mark.bound(30)
def test_27_a_returned_session_box_is_reset(docker_sb: Sandbox) -> None:
    with docker_sb.session() as a:
        a.run(
            "open('/tmp/tg-hostile-trace', 'w').write('x')\nimport subprocess\nsubprocess.Popen(['sleep', '1000'])"
        )
    for _ in range(docker_sb.limits.size):
        with docker_sb.session() as b:
            assert b.run("import os\nprint(os.path.exists('/tmp/tg-hostile-trace'))").stdout == "False\n"
    _closed_cleanly(docker_sb)


@pytest.mark.bound(30)
def test_fork_copies_state_and_branches_diverge(any_sb: Sandbox) -> None:
    with any_sb.session() as s:
        s.run("import numpy as np\nx = np.arange(3)\nn = 1")
        t0 = time.monotonic()
        f = s.fork()
        assert time.monotonic() - t0 < 0.5
        with f:
            assert f.run("n += 10\nprint(n, x.sum())").stdout == "11 3\n"
            assert s.run("n += 1\nprint(n)").stdout == "2\n"
            g = f.fork()
            assert g.run("print(n)").stdout == "11\n"
            g.close()
            assert f.run("print(n)").stdout == "11\n"
        assert s.run("print(n)").stdout == "2\n"
    _closed_cleanly(any_sb)


@pytest.mark.bound(40)
def test_a_branch_is_a_full_process_of_its_own(any_sb: Sandbox) -> None:
    """A branch is made with one clone(CLONE_PARENT) (a child of the supervisor, not of its parent
    interpreter): it gets a new ``random`` seed as after ``os.fork``, runs threads, subprocesses and forks
    of its own, and a signal it raises on itself reaches only itself."""
    probe = (
        "import os, random, subprocess, threading\n"
        "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os._exit(7)\n"
        "print(os.waitpid(pid, 0)[1] >> 8, subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout.strip())"
    )
    with any_sb.session() as s:
        s.run("import random\nrandom.seed(1)\nv = 5")
        first = s.run("print(random.random())").stdout
        s.run("random.seed(1)")
        with s.fork() as f:
            assert f.run("print(random.random())").stdout != first
            assert f.run(probe, timeout=10).stdout == "7 sub\n"
            res = f.run("import signal\nsignal.raise_signal(signal.SIGKILL)")
            assert res.status == "error" and res.exit_code == -9, res
            assert f.run("print(v)").restarted
        assert s.run("print(random.random())").stdout == first  # the parent's state is its own
        assert s.run("print(v)").stdout == "5\n"
    _closed_cleanly(any_sb)


@pytest.mark.bound(30)
def test_fork_of_a_timed_out_branch_leaves_siblings_alone(docker_sb: Sandbox) -> None:
    with docker_sb.session() as s:
        s.run("v = 7")
        f = s.fork()
        assert f.run("import time\ntime.sleep(100)", timeout=0.5).status == "timeout"
        assert s.run("print(v)").stdout == "7\n"  # the sibling's timeout did not kill the parent branch
        f.close()
    _closed_cleanly(docker_sb)


@pytest.mark.bound(30)
def test_a_child_forked_by_the_code_cannot_answer_for_the_interpreter(any_sb: Sandbox) -> None:
    with any_sb.session() as s:
        s.run("z = 5")
        res = s.run("import os\npid = os.fork()\nprint('parent' if pid else 'child')", timeout=5)
        assert res.ok, res
        # The fallen-through child exited; replies stay in step with requests. (The child's own late print
        # may land in the next call's output, as in case 23.)
        for _ in range(3):
            out = s.run("print(z)").stdout
            lines = out.split()
            assert lines.count("5") == 1 and set(lines) <= {"5", "child"}, out
    _closed_cleanly(any_sb)


@pytest.mark.bound(30)
def test_a_session_call_past_the_output_cap_is_truncated_but_keeps_its_state(any_sb: Sandbox) -> None:
    with any_sb.session() as s:
        s.run("k = 3")
        res = s.run("print('x' * (3 << 20))", timeout=10)
        assert res.ok and res.truncated and len(res.stdout) == any_sb.limits.output_bytes, res.status
        assert s.run("print(k)").stdout == "3\n"


@pytest.mark.bound(30)
def test_the_survivor_check_sees_a_live_worker(any_sb: Sandbox) -> None:
    """Guards the suite itself: `survivors` must notice processes, or every 'no survivor' check is vacuous."""
    s = any_sb.session()
    s.run("import subprocess\np = subprocess.Popen(['sleep', '30'])")
    assert survivors(any_sb), "an open session's worker and its child were not seen"
    s.close()
    _closed_cleanly(any_sb)


@pytest.mark.bound(30)
def test_killing_the_supervisor_from_a_session_is_refused(any_sb: Sandbox) -> None:
    with any_sb.session() as s:
        s.run("x = 1")
        res = s.run("import os\nos.kill(os.getppid(), 9)", timeout=5)
        assert res.status == "error" and "PermissionError" in res.stderr, res
        nxt = s.run("print('x' in dir())")
        assert nxt.ok and not nxt.restarted and nxt.stdout == "True\n", nxt
    _closed_cleanly(any_sb)


@pytest.mark.bound(60)
def test_01_fork_bomb_inside_a_session_and_the_episode_goes_on(docker_sb: Sandbox) -> None:
    with docker_sb.session() as s:
        s.run("import os")
        t0 = time.monotonic()
        res = s.run("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout=2)
        assert res.status == "timeout" and time.monotonic() - t0 < 2 + 4, res
        nxt = s.run("print('alive')")
        assert nxt.ok and nxt.restarted, nxt
    _closed_cleanly(docker_sb)
