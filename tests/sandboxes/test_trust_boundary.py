"""Nothing a call does reaches what serves another call, candidate or episode (the trust boundary), on both
backends: the box's spare worker is out of the code's reach, no hook, timer, buffered output, priority or
rlimit of one call acts in the next, and what the code can break is the code's status, never
``sandbox_error``. Each test names the class of hole it covers (docs/sandboxes.md, "Threat model")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.processes import start, stop
from toolgym.sandboxes import Sandbox, get_sandbox

from .conftest import IMAGE

# Run in a session: finds the box's spare worker and tries everything that used to poison it.
ATTACK_SPARE = r"""
import ctypes, os, resource, signal
spare = [p for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == 'tg-spare']
out = {'found': len(spare)}
for p in map(int, spare):
    tries = {
        'mem': lambda: open(f'/proc/{p}/mem', 'r+b').close(),
        'stop': lambda: os.kill(p, signal.SIGSTOP),
        'nice': lambda: os.setpriority(os.PRIO_PROCESS, p, 19),
        'idle': lambda: os.sched_setscheduler(p, os.SCHED_IDLE, os.sched_param(0)),
        'prlimit': lambda: resource.prlimit(p, resource.RLIMIT_NOFILE, (6, 6)),
        'oom': lambda: open(f'/proc/{p}/oom_score_adj', 'w').write('-1000'),
    }
    for name, attack in tries.items():
        try:
            attack()
            out[name] = 'done'
        except OSError as exc:
            out[name] = type(exc).__name__
print(out)
"""
VITALS = (
    "import os, resource; print(os.getuid(), os.nice(0), os.sched_getscheduler(0), "
    "resource.getrlimit(resource.RLIMIT_NOFILE))"
)


def _make(kind: str, pool_size: int) -> Sandbox:
    if kind == "process":
        return get_sandbox("process", pool_size=pool_size)
    from toolgym.sandboxes.docker_backend import docker_problem, runtime_problem

    problem = docker_problem(IMAGE) or (runtime_problem("runsc") if kind == "gvisor" else None)
    if problem is not None:
        pytest.skip(f"{kind} sandbox unavailable: {problem}")
    extra = {"runtime": "runsc"} if kind == "gvisor" else {}
    return get_sandbox("docker", image=IMAGE, pool_size=pool_size, **extra)


@pytest.fixture(scope="module", params=["docker", "process", "gvisor"])
def one_box(request: Any) -> Iterator[Sandbox]:
    """A sandbox of one box: the next session is served by what the last one could touch."""
    sb = _make(request.param, 1)
    yield sb
    sb.close()


@pytest.fixture(scope="module", params=["docker", "process", "gvisor"])
def every_sb(request: Any) -> Iterator[Sandbox]:
    """Every backend, gVisor where it is registered with dockerd (skipped elsewhere)."""
    sb = _make(request.param, 2)
    yield sb
    sb.close()


def _first_vitals(sb: Sandbox) -> str:
    with sb.session() as s:
        res = s.run(VITALS, timeout=10)
        assert res.ok, res
        return res.stdout


@pytest.mark.bound(120)
def test_class1_the_spare_worker_is_out_of_the_codes_reach(one_box: Sandbox) -> None:
    clean = _first_vitals(one_box)
    with one_box.session() as s:
        res = s.run(ATTACK_SPARE, timeout=10)
    assert res.ok, res
    out = eval(res.stdout)
    assert out["found"] >= (1 if one_box.supports_fork else 0), out  # visible but untouchable (gVisor: none)
    assert all(v in ("PermissionError", "ProcessLookupError") for k, v in out.items() if k != "found"), out
    t0 = time.monotonic()
    assert _first_vitals(one_box) == clean  # the next session: same priority, policy, rlimits
    assert time.monotonic() - t0 < 5


STOP_SPARE = r"""
import os, signal
for p in os.listdir('/proc'):
    if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == 'tg-spare':
        try:
            os.kill(int(p), signal.SIGSTOP)
        except OSError:
            pass
"""


@pytest.mark.bound(120)
def test_class3_stopping_the_spare_cannot_get_the_next_candidate_excluded(one_box: Sandbox) -> None:
    with one_box.session() as s:
        assert s.run(STOP_SPARE, timeout=5).status == "ok"
    t0 = time.monotonic()
    with one_box.session() as s:  # served from that spare: never a stall, never sandbox_error
        honest = s.run("print(6 * 7)", timeout=2)
    assert honest.status == "ok" and honest.stdout == "42\n" and time.monotonic() - t0 < 3, honest
    hostile = one_box.run("import os, signal\nos.kill(-1, signal.SIGSTOP)", timeout=5)
    assert hostile.status in ("ok", "error", "timeout"), hostile  # (kill(-1) spares the caller)
    assert one_box.run("print(1)", timeout=2).stdout == "1\n"


HOOKS = r"""
import sys, time, os
def hook(frame, event, arg):
    # Acts once the call returned: when the worker's loop receives the next request.
    if event == 'c_return' and getattr(arg, '__name__', '') == 'recvmsg':
        os.write(1, b'HOOKED')
        for fd in range(4, 64):
            try:
                os.write(fd, b'{"n": 3, "exc": null, "exit": 0}')
            except OSError:
                pass
        time.sleep(12)
sys.setprofile(hook)
"""


@pytest.mark.bound(120)
def test_class2_a_hook_set_in_one_call_never_acts_in_the_next(every_sb: Sandbox) -> None:
    with every_sb.session() as s:
        s.run("x = 41", timeout=5)  # call 1; the hook forges call 3's reply
        res = s.run(HOOKS, timeout=5)
        assert res.status in ("ok", "error", "timeout"), res
        t0 = time.monotonic()
        after = s.run("print(x + 1 if 'x' in dir() else 'fresh')", timeout=5)
        assert after.status == "ok" and "HOOKED" not in after.stdout, after
        assert after.stdout in ("42\n", "fresh\n"), after
        if every_sb.supports_fork:
            branch = s.fork()  # never an InfrastructureError, never a wait on the hook
            assert branch.run("print('b')", timeout=5).stdout == "b\n"
            branch.close()
        assert time.monotonic() - t0 < 5
        added = s.run("import sys\nsys.addaudithook(lambda *a: os.write(1, b'AUDIT'))\nprint('x')", timeout=5)
        assert added.status in ("ok", "error"), added
        assert "AUDIT" not in s.run("print('y')", timeout=5).stdout


@pytest.mark.bound(120)
def test_class2_output_and_timers_of_one_call_stay_in_it(every_sb: Sandbox) -> None:
    with every_sb.session() as s:
        s.run(
            "import os, sys\nsys.stdout.write('LEAK1')\nos.close(1)\nos.close(2)\nprint('LEAK2')", timeout=5
        )
        assert s.run("print('clean')", timeout=5).stdout == "clean\n"
        s.run("import os\nos.close(0)\nos.close(1)\nos.close(2)\nprint('LEAK3' * 100)", timeout=5)
        assert s.run("print('clean')", timeout=5).stdout == "clean\n"
        s.run(
            "import signal\nsignal.signal(signal.SIGALRM, lambda *a: print('ALARM'))\n"
            "signal.setitimer(signal.ITIMER_REAL, 0.05)",
            timeout=5,
        )
        res = s.run("import time\ntime.sleep(0.3)\nprint('clean')", timeout=5)
        assert res.status == "ok" and res.stdout == "clean\n", res
        posix = s.run(
            "import ctypes\nprint(ctypes.CDLL(None).timer_create(0, None, ctypes.byref(ctypes.c_void_p())))"
        )
        assert posix.stdout.strip() == "-1", posix  # a POSIX timer could signal the loop: refused


@pytest.mark.bound(120)
@pytest.mark.parametrize(
    "change",
    [
        "os.nice(19)",
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))",
        "resource.setrlimit(resource.RLIMIT_NOFILE, (6, 6))",
    ],
)
def test_class2_priority_and_rlimits_of_one_call_do_not_carry_over(every_sb: Sandbox, change: str) -> None:
    with every_sb.session() as s:
        clean = s.run(VITALS, timeout=5).stdout
        res = s.run(f"import os, resource\n{change}", timeout=5)
        if res.status == "error" and every_sb.limits.runtime == "runsc":
            return  # gVisor has no SCHED_IDLE: nothing changed
        assert res.status == "ok", res
        after = s.run(VITALS, timeout=5)
        assert after.status == "ok" and after.restarted and after.stdout == clean, after
        assert "priority" in after.detail, after


@pytest.mark.bound(120)
def test_class4_posix_message_queues_do_not_survive_a_run(every_sb: Sandbox) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.mq_open.restype = ctypes.c_int\n"
        "fd = libc.mq_open(b'/tgq', {flags}, 0o600, None)\nprint(fd >= 0, ctypes.get_errno())"
    )
    made = every_sb.run(code.format(flags="os.O_CREAT | os.O_RDWR"), timeout=5)
    if every_sb.limits.runtime == "runsc":  # no mqueue file system to wipe there: queues are refused
        assert made.stdout.startswith("False"), made
        return
    assert made.stdout.startswith("True"), made
    for _ in range(3):  # whichever box serves next
        left = every_sb.run(code.format(flags="os.O_RDWR"), timeout=5)
        assert left.stdout.startswith("False"), left
    with every_sb.session() as s:
        s.run(code.format(flags="os.O_CREAT | os.O_RDWR"), timeout=5)
    with every_sb.session() as s:
        assert s.run(code.format(flags="os.O_RDWR"), timeout=5).stdout.startswith("False")


HOLD_A_BOX = (
    "import sys\nfrom toolgym.sandboxes import get_sandbox\n"
    "sb = get_sandbox(sys.argv[1], pool_size=1)\ns = sb.session()\n"
    "print(s.run('import os; print(os.getuid())').stdout.strip(), flush=True)\n"
    "sys.stdin.read()\ns.close()\nsb.close()"
)


@pytest.mark.bound(120)
def test_class4_6_every_box_has_a_uid_of_its_own(any_sb: Sandbox) -> None:
    """Boxes alive at once never share a uid: two of one program (docker boxes all had 65534), nor the
    boxes of two other programs running now (process boxes restarted at 200000 in every program)."""
    import subprocess
    import sys

    a, b = any_sb.session(), any_sb.session()  # both boxes of the pool, held while the others run
    ua = a.run("import os; print(os.getuid())", timeout=5).stdout.strip()
    ub = b.run("import os; print(os.getuid())", timeout=5).stdout.strip()
    others = [
        start(
            [sys.executable, "-c", HOLD_A_BOX, any_sb.backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        theirs = [p.stdout.readline().strip() for p in others if p.stdout is not None]
    finally:
        try:
            for p in others:
                p.communicate("", timeout=60)
        finally:
            for p in others:
                stop(p)  # a holder stuck past the timeout: its group, box included, ends with the test
            a.close()
            b.close()
    uids = [ua, ub, *theirs]
    assert all(u.isdigit() and int(u) >= 200000 for u in uids) and len(set(uids)) == 4, uids


INOTIFY = (
    "import ctypes\nlibc = ctypes.CDLL(None)\nfds = [libc.inotify_init1(0) for _ in range({n})]\n"
    "print(sum(fd >= 0 for fd in fds))"
)


@pytest.mark.bound(120)
def test_class6_one_box_holding_every_inotify_instance_leaves_the_others_theirs(docker_sb: Sandbox) -> None:
    with docker_sb.session() as hog, docker_sb.session() as other:
        assert int(hog.run(INOTIFY.format(n=200), timeout=10).stdout) >= 100
        assert other.run(INOTIFY.format(n=1), timeout=10).stdout == "1\n"


def test_class7_gvisor_boxes_say_up_front_that_sessions_cannot_fork() -> None:
    from toolgym.sandboxes.docker_backend import DockerSandbox
    from toolgym.sandboxes.limits import Limits

    sb = DockerSandbox(Limits(runtime="runsc", pool_size=1))
    assert sb.supports_fork is False
    sb.close()
    assert DockerSandbox(Limits(pool_size=1)).supports_fork is True
    from toolgym.envs.python_math.env import PythonMathEnv

    # Envs see it before any episode (no sandbox started), so rollouts replay prefixes instead of forking.
    assert PythonMathEnv(sandbox="docker", sandbox_options={"runtime": "runsc"}).supports_fork is False
    assert PythonMathEnv(sandbox="docker").supports_fork is True


@pytest.mark.bound(120)
def test_class2_a_fork_the_code_broke_is_a_fresh_branch_not_an_infrastructure_error(any_sb: Sandbox) -> None:
    """``Session.fork`` (an env's ``get_state``) of an interpreter whose code broke branching: the branch is a
    fresh interpreter whose first call says so; the rollout never sees an ``InfrastructureError``. (Not
    gVisor: sessions there do not fork, and say so up front.)"""
    with any_sb.session() as s:
        s.run("x = 1", timeout=5)
        s.run(
            "import os, sys\nsys.modules['inside.worker']._clone[:] = [None]\n"
            "def boom():\n    raise OSError(11, 'refused by the code')\nos.fork = boom",
            timeout=5,
        )
        branch = s.fork()
        res = branch.run("print('x' in dir())", timeout=5)
        assert res.ok and res.restarted and res.stdout == "False\n", res
        assert "could not copy" in res.detail, res
        branch.close()
        assert s.run("print(x)", timeout=5).stdout == "1\n"
