"""The sandbox's hardening against untrusted code, one attack class at a time, on both backends where they
apply: forged results through the supervisor's channels, turning the code's own failure into
``sandbox_error``, state that leaks across calls and pooled episodes, and the process backend reaching the
host. Each test names the class it guards."""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
import warnings

import pytest

from tests.sandboxes.hostile_checks import contained
from toolgym.sandboxes import Sandbox

T = 5.0

# -- 1. forged results -------------------------------------------------------------------------------------

FORGE_ONESHOT = """
import json, os, struct
head = json.dumps({"status": "ok", "exit_code": 0, "duration_s": 0.0, "truncated": False, "detail": "",
                   "clean": True, "alive": True, "n": 1, "exc": None, "exit": 0,
                   "blobs": [["stdout", 6]]}).encode()
frame = struct.pack(">II", len(head), 6) + head + b"forged"
reply = json.dumps({"n": 1, "exc": None, "exit": 0}).encode()
for fd in range(0, 256):
    for data in (frame, reply):
        try:
            os.write(fd, data)
        except OSError:
            pass
os._exit(3)
"""


@pytest.mark.bound(30)
def test_forged_frames_cannot_change_a_one_shot_result(any_sb: Sandbox) -> None:
    """Class 1: the status is the worker's exit status from waitpid, whatever it writes wherever."""
    t0 = time.monotonic()
    res = any_sb.run(FORGE_ONESHOT, timeout=T)
    assert res.status == "error" and res.exit_code == 3, res
    contained(any_sb, res, {"error"}, T + 3, t0)
    res = any_sb.run(FORGE_ONESHOT.replace("os._exit(3)", "import sys\nsys.exit(3)"), timeout=T)
    assert res.status == "error" and res.exit_code == 3, res


# Every way code from one call could try to be the one that answers the next call.
TAKEOVER = {
    # a thread that keeps reading the request socket and answers with forged output
    "thread": """
import os, socket, threading
def serve():
    while True:
        data, fds, _, _ = socket.recv_fds(socket.socket(fileno=os.dup(3)), 4096, 8)
        for fd in fds[2:4]:
            os.write(fd, b"FORGED\\n")
        os.write(fds[-1], data.replace(b"exec ", b'{"n": ').rstrip() + b', "exc": null, "exit": 0}')
        for fd in fds:
            os.close(fd)
threading.Thread(target=serve, daemon=True).start()
""",
    # the main thread answers its own call through its reply pipe and then serves the socket itself
    "main": """
import os, socket, stat
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if fd > 3 and stat.S_ISFIFO(st.st_mode) and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
        try:
            os.write(fd, b'{"n": %d, "exc": null, "exit": 0}' % (CALL,))
            os.close(fd)
        except OSError:
            pass
for target in (0, 1, 2):
    os.dup2(os.open(os.devnull, os.O_RDWR), target)
door = socket.socket(fileno=3)
while True:
    data, fds, _, _ = socket.recv_fds(door, 4096, 8)
    n = int(data.split()[1])
    for fd in fds[2:4]:
        os.write(fd, b"FORGED\\n" + os.read(fds[1], 100) + b"\\n")
    os.write(fds[-1], b'{"n": %d, "exc": null, "exit": 0}' % n)
    for fd in fds:
        os.close(fd)
""",
    # rebinding what the worker loop calls, in its module and in builtins
    "patch": """
import builtins, sys
def forged(*a, **k):
    sys.stdout.write("FORGED\\n")
    return None, 0
for name, mod in list(sys.modules.items()):
    if name.endswith("worker") and hasattr(mod, "exec_code"):
        mod.exec_code = forged
        mod.exec_code.__code__ = forged.__code__
builtins.exec = lambda *a, **k: sys.stdout.write("FORGED\\n")
""",
}


@pytest.mark.bound(40)
@pytest.mark.parametrize("how", list(TAKEOVER))
def test_session_takeover_never_answers_a_later_grader_call(any_sb: Sandbox, how: str) -> None:
    """Class 1: code that tries to keep serving the worker's request socket (or to rebind the loop that
    does) never answers a later call: the grader's call runs for real, on a restarted interpreter when the
    old one misbehaved, and its nonce only reaches the grader's own code."""
    nonce = secrets.token_hex(8)
    grader = "import sys\nprint('digest', sys.stdin.read()[::-1])"
    with any_sb.session() as s:
        s.run("x = 1")
        first = s.run(TAKEOVER[how].replace("CALL", "2"), timeout=3)
        assert first.status != "sandbox_error", first
        res = s.run(grader, stdin=nonce, timeout=5)
        assert res.ok and res.stdout == f"digest {nonce[::-1]}\n", res
        assert "FORGED" not in res.stdout
        if how != "patch":
            assert res.restarted, res
        again = s.run(grader, stdin=nonce, timeout=5)
        assert again.ok and again.stdout == f"digest {nonce[::-1]}\n", again


GARBAGE = [
    b'{"n": "1", "exc": null, "exit": 0}',
    b'{"n": CALL, "exc": null, "exit": "nope"}',
    b'{"n": CALL, "exc": [], "exit": 0}',
    b'{"n": CALL, "exc": "x y", "exit": 0}',
    b'{"n": CALL, "exc": null, "exit": 4096}',
    b'{"n": CALL, "exc": null, "exit": 0, "stdout": "x"}',
    b"[1, 2, 3]",
    b"null",
    b"\xff" * 64,
    b"x" * 100_000,
]


@pytest.mark.bound(60)
def test_typed_garbage_on_the_reply_channel_is_the_codes_error(any_sb: Sandbox) -> None:
    """Class 1: anything on a call's reply pipe that is not exactly the worker's reply is the code's
    ``error``, the worker is restarted (``restarted=True`` next), the supervisor keeps serving."""
    write_all = """
import os, stat
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        if fd > 3 and stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, PAYLOAD)
    except OSError:
        pass
"""
    with any_sb.session() as s:
        for i, payload in enumerate(GARBAGE):
            assert s.run(f"v = {i}").ok
            call = 2 if i == 0 else 1  # after the first restart every worker starts counting at 1 again
            code = write_all.replace("PAYLOAD", repr(payload.replace(b"CALL", str(call).encode())))
            res = s.run(code, timeout=T)
            assert res.status == "error" and "reply channel" in res.detail, (payload[:40], res)
            nxt = s.run("print(1)")
            assert nxt.ok and nxt.restarted and nxt.stdout == "1\n", nxt
    assert any_sb.run("print(2)").stdout == "2\n"


def test_reply_parser_rejects_every_malformed_reply() -> None:
    from toolgym.sandboxes.inside.server import Server

    assert Server._parse_reply(b'{"n": 1, "exc": null, "exit": 0}', 1) == (None, 0, False)
    assert Server._parse_reply(b'{"n": 1, "exc": "KeyError", "exit": 1}', 1) == ("KeyError", 1, False)
    assert Server._parse_reply(b'{"n": 1, "exc": null, "exit": 0, "retire": 1}', 1) == (None, 0, True)
    assert Server._parse_reply(b'{"n": 1, "exc": null, "exit": 0, "retire": 2}', 1) is None
    for raw in [*GARBAGE, b'{"n": 2, "exc": null, "exit": 0}', b'{"n": true, "exc": null, "exit": 0}', b""]:
        assert Server._parse_reply(raw.replace(b"CALL", b"1"), 1) is None, raw


# -- 2. the code's failure is never sandbox_error -----------------------------------------------------

SIGNALS = """
import os, signal
denied = []
for sig in range(1, signal.NSIG):
    if sig in (signal.SIGKILL, signal.SIGSTOP) and TARGET == 0:
        continue
    try:
        os.kill(TARGET, sig)
    except PermissionError:
        denied.append(sig)
    except (OSError, ValueError):
        pass
print(len(denied))
"""


@pytest.mark.bound(60)
@pytest.mark.parametrize("target", ["1", "os.getppid()"], ids=["pid1", "supervisor"])
def test_signals_to_pid1_and_the_supervisor(any_sb: Sandbox, target: str) -> None:
    """Class 2: every signal to init or the supervisor is refused (another uid); the box keeps serving."""
    for _ in range(2):
        t0 = time.monotonic()
        res = any_sb.run(SIGNALS.replace("TARGET", target), timeout=T)
        assert res.ok and int(res.stdout) >= 60, res
        contained(any_sb, res, {"ok"}, T + 3, t0)
    with any_sb.session() as s:
        assert s.run(SIGNALS.replace("TARGET", target)).ok
        assert s.run("print('alive')").stdout == "alive\n"


@pytest.mark.bound(120)
@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(1 << 34)",
        "x = []\nwhile True:\n    x.append(bytearray(10**7))\n    x[-1][::4096] = b'1' * len(x[-1][::4096])",
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'x = []\\nwhile True:\\n    x.append(b\"1\" * 10**7)'], check=True)",
        # fill the tmpfs first (its pages count against the cap), then allocate
        "open('/dev/shm/f', 'wb').write(b'1' * (15 << 20))\nopen('/tmp/f', 'wb').write(b'1' * (60 << 20))\n"
        "x = []\nwhile True:\n    x.append(bytearray(10**7))\n    x[-1][::4096] = b'1' * len(x[-1][::4096])",
    ],
    ids=["huge", "touching", "grandchild", "tmpfs-then-heap"],
)
def test_oom_is_always_oom(docker_sb: Sandbox, code: str) -> None:
    """Class 2: an OOM kill lands on the code's processes only (init and the supervisor have
    oom_score_adj -1000), so it is ``oom`` every time, never ``sandbox_error`` or the supervisor's death."""
    for _ in range(4):
        t0 = time.monotonic()
        res = docker_sb.run(code, timeout=20)
        assert res.status == "oom", res
        contained(docker_sb, res, {"oom"}, 25, t0)
    with docker_sb.session() as s:
        s.run("keep = 1")
        assert s.run(code, timeout=20).status == "oom"
        nxt = s.run("print('next')")
        assert nxt.ok and nxt.stdout == "next\n", nxt  # restarted unless the OOM took a grandchild only


@pytest.mark.bound(30)
def test_init_and_supervisor_are_out_of_the_oom_killers_reach(any_sb: Sandbox) -> None:
    code = (
        "import os\nprint(open('/proc/self/oom_score_adj').read().strip(),"
        " open(f'/proc/{os.getppid()}/oom_score_adj').read().strip(), open('/proc/1/oom_score_adj').read().strip())"
    )
    res = any_sb.run(code, timeout=T)
    mine, supervisor, init = res.stdout.split()
    # -1000 where the kernel lets us lower it (some refuse even root); the code is always the first choice
    assert mine == "1000" and int(supervisor) <= 0 and int(init) <= 0, res


# -- 3. no state leaks across calls or pooled episodes -----------------------------------------------------


@pytest.mark.bound(60)
def test_priority_changes_do_not_reach_later_runs_or_episodes(any_sb: Sandbox) -> None:
    """Class 3: a per-user (or per-process) priority the code sets dies with its processes; later runs and
    sessions on every pooled box start at nice 0 and the supervisor's vitals are unchanged."""
    renice = (
        "import os\nos.setpriority(os.PRIO_USER, os.getuid(), 19)\nos.setpriority(os.PRIO_PROCESS, 0, 19)\n"
        "try:\n    os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)\nexcept PermissionError:\n    print('denied')"
    )
    assert any_sb.run(renice, timeout=T).stdout == "denied\n"
    with any_sb.session() as s:
        s.run(renice)
    probe = (
        "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, os.getppid()))"
    )
    base = any_sb.run(probe, timeout=T).stdout.split()[1]  # the supervisor's: -10 where it may raise it
    for _ in range(any_sb.limits.size + 1):
        assert any_sb.run(probe, timeout=T).stdout == f"0 {base}\n"
        with any_sb.session() as s:
            assert s.run(probe).stdout == f"0 {base}\n"


@pytest.mark.bound(40)
@pytest.mark.parametrize(
    "damage",
    [
        "import os\nos.close(1)\nos.close(2)",
        "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 1)",
        "import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = None",
        "import sys\nsys.stdout.close()",
        "import os\nos.close(0)",
    ],
    ids=["close-fds", "dup2", "rebind", "close-object", "close-stdin"],
)
def test_stdio_is_reestablished_every_call(any_sb: Sandbox, damage: str) -> None:
    """Class 3: whatever a call does to stdin/stdout/stderr, the next call of the session has them back."""
    with any_sb.session() as s:
        s.run("keep = 'me'")
        s.run(damage)
        res = s.run("import sys\nprint(keep)\nprint('err', file=sys.stderr)\nprint(input())", stdin="in\n")
        assert res.ok and res.stdout == "me\nin\n" and res.stderr == "err\n" and not res.restarted, res


PTH = """
import os, site, subprocess, sys
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
open(os.path.join(d, "evil.pth"), "w").write("import sys; sys.stdout.write('HOOKED\\\\n')\\n")
"""
CHILD = "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True, text=True).stdout)"


@pytest.mark.bound(40)
def test_child_interpreters_ignore_user_site_hooks(any_sb: Sandbox) -> None:
    """Class 3: a .pth in the user site dir is never loaded by child interpreters, in the same run, in
    later calls of a session (even after the code edits its environment), or in later pooled runs."""
    res = any_sb.run(PTH + CHILD, timeout=10)
    assert res.ok and "HOOKED" not in res.stdout, res
    with any_sb.session() as s:
        s.run(PTH + "os.environ.pop('PYTHONNOUSERSITE', None)")
        res = s.run(CHILD, timeout=10)
        assert res.ok and "HOOKED" not in res.stdout and "1" in res.stdout, res
    for _ in range(any_sb.limits.size):
        res = any_sb.run(
            CHILD + "\nimport os, site\nprint(os.path.exists(site.getusersitepackages()))", timeout=10
        )
        assert "HOOKED" not in res.stdout and res.stdout.endswith("False\n"), res


@pytest.mark.bound(40)
def test_leftover_processes_are_killed_after_each_session_call(any_sb: Sandbox) -> None:
    """Class 3: a session call leaves nothing running behind it (processes are killed, a thread restarts
    the interpreter)."""
    with any_sb.session() as s:
        s.run(
            "import subprocess\np = subprocess.Popen(['sleep', '1000'])\nq = subprocess.Popen(['sleep', '1000'], start_new_session=True)"
        )
        res = s.run("print(p.poll(), q.poll())")
        assert res.ok and res.stdout == "-9 -9\n", res


FORGE_THEN = """
import os, stat, subprocess, time
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        if fd > 3 and stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b'{"n": CALL, "exc": null, "exit": 0}')
    except OSError:
        pass
time.sleep(0.3)
print("STALE", flush=True)
"""


@pytest.mark.bound(40)
@pytest.mark.parametrize("after", ["print", "child"])
def test_output_after_a_forged_reply_never_reaches_a_later_call(any_sb: Sandbox, after: str) -> None:
    """Class 3: a session's stdout/stderr pipes outlive single calls (a call is over when its reply comes),
    so code that answers its own call and goes on printing, or starts a process after the reply, must not
    reach the next call's output: the next call finds the process and restarts, or drops the stale bytes."""
    code = FORGE_THEN.replace("CALL", "2")
    if after == "child":
        code += "subprocess.Popen(['sh', '-c', 'while true; do echo CHILD; sleep 0.05; done'])\n"
    with any_sb.session() as s:
        s.run("x = 1")
        s.run(code, timeout=T)
        time.sleep(0.6)
        res = s.run("print('clean')")
        assert res.ok and res.stdout == "clean\n" and res.stderr == "", res
        assert res.restarted == (after == "child"), res
        res = s.run("print('again')")
        assert res.ok and res.stdout == "again\n" and not res.restarted, res


@pytest.mark.bound(40)
def test_unset_hardening_variables_come_back_for_child_interpreters(any_sb: Sandbox) -> None:
    """Class 3: the C environment children inherit is re-hardened every call, even when the code went
    around os.environ."""
    with any_sb.session() as s:
        s.run("import os\nos.unsetenv('PYTHONNOUSERSITE')\nos.putenv('PYTHONPATH', '/tmp/evil')")
        res = s.run(
            "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', "
            '\'import os; print(os.environ.get("PYTHONNOUSERSITE"), os.environ.get("PYTHONPATH"))\'],'
            " capture_output=True, text=True).stdout)"
        )
        assert res.ok and res.stdout.startswith("1 None"), res


def test_non_ascii_exception_names_are_a_plain_error(any_sb: Sandbox) -> None:
    """A genuine reply naming a non-ASCII exception class is the code's error, not a misbehaving worker."""
    with any_sb.session() as s:
        s.run("x = 1")
        res = s.run("class Ошибка(Exception):\n    pass\nraise Ошибка('x')")
        assert res.status == "error" and "Ошибка: x" in res.stderr and "reply" not in res.detail, res
        nxt = s.run("print(x)")
        assert nxt.ok and nxt.stdout == "1\n" and not nxt.restarted, nxt


# -- process backend: the host -------------------------------------------------------------------------

HOST_PROBE = """
import json, os, socket, subprocess
out = {"uid": os.getuid(), "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0]}
for path in ["/var/run/docker.sock", "/run/docker.sock", "/etc/shadow", "/etc/gshadow", "/proc/kallsyms", "/root"]:
    try:
        if os.path.isdir(path):
            out[path] = os.listdir(path)
        else:
            out[path] = open(path, "rb").read(64).decode(errors="replace")
    except OSError as exc:
        out[path] = exc.errno
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/var/run/docker.sock")
    out["docker"] = "connected"
except OSError as exc:
    out["docker"] = exc.errno
out["ifs"] = [name for _, name in socket.if_nameindex()]
out["tmp"] = sorted(set(os.listdir("/tmp")) - {os.path.basename(os.getcwd())})
out["shm"] = sorted(os.listdir("/dev/shm"))
out["procs"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for name, cmd in [("unshare", ["unshare", "-r", "true"]), ("mount", ["mount", "-t", "tmpfs", "x", "/tmp"])]:
    out[name] = subprocess.run(cmd, capture_output=True).returncode
for name, fn in [("nice", lambda: os.setpriority(os.PRIO_PROCESS, 0, -20)),
                 ("fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))),
                 ("setuid0", lambda: os.setuid(0))]:
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = exc.errno
import ctypes
out["ptrace"] = ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0)
open("/tmp/tg-hostile-residue", "w").write("x")
open("/dev/shm/tg-hostile-residue", "w").write("x")
print(json.dumps(out))
"""


@pytest.mark.bound(40)
def test_the_code_cannot_reach_the_host(any_sb: Sandbox) -> None:
    """Class 4 (both backends; the process backend's table rows): another uid with no capabilities, no
    docker socket, no /etc/shadow or kernel symbols, no host network interfaces or processes, private
    /tmp and /dev/shm that leave nothing behind, no namespaces, mounts, real-time or negative-nice
    scheduling, no ptrace of the supervisor."""
    t0 = time.monotonic()
    res = any_sb.run(HOST_PROBE, timeout=15)
    contained(any_sb, res, {"ok"}, 20, t0)
    out = json.loads(res.stdout)
    assert out["uid"] not in (0,) and out["caps"] == "0000000000000000", out
    for path in ("/var/run/docker.sock", "/run/docker.sock", "/etc/shadow", "/etc/gshadow"):
        assert isinstance(out[path], int), (path, out[path])
    assert not isinstance(out["/proc/kallsyms"], str) or set(out["/proc/kallsyms"].split()[0]) <= {"0"}
    from toolgym.sandboxes.process_backend import python_dirs

    # Only what leads to the Python a box runs may show, wherever that Python lives (never assumed).
    python = python_dirs()
    assert out["/root"] in ([], 13, 2) or all(
        any(p.startswith(f"/root/{d}") for p in python) for d in out["/root"]
    ), out
    out["tmp"] = [d for d in out["tmp"] if not any(f"{p}/".startswith(f"/tmp/{d}/") for p in python)]
    assert isinstance(out["docker"], int) and out["ifs"] == ["lo"], out
    assert out["tmp"] == [] and out["shm"] == [], out  # other runs' and the host's files are not there
    assert max(out["procs"]) < 1000 or len(out["procs"]) < 10, out["procs"]  # own pid namespace
    assert out["unshare"] != 0 and out["mount"] != 0, out
    assert out["nice"] != "ok" and out["fifo"] != "ok" and out["setuid0"] != "ok" and out["ptrace"] != 0, out
    keep = [d.split("/")[2] for d in python if d.startswith("/tmp/")]  # a Python bound under /tmp stays
    again = any_sb.run(
        f"import os\nprint(sorted(set(os.listdir('/tmp')) - set({keep!r})) == [os.path.basename(os.getcwd())],"
        " os.listdir('/dev/shm'))",
        timeout=T,
    )
    assert again.stdout == "True []\n", again


@pytest.mark.bound(30)
def test_boxes_do_not_see_each_other(process_sb: Sandbox) -> None:
    with process_sb.session() as a, process_sb.session() as b:
        assert a.run("open('/tmp/tg-hostile-a', 'w').write('a')\nimport os\nprint(os.getuid())").ok
        res = b.run(
            "import os\nprint(os.path.exists('/tmp/tg-hostile-a'), len([p for p in os.listdir('/proc') if p.isdigit()]))"
        )
        assert res.stdout.split()[0] == "False" and int(res.stdout.split()[1]) < 10, res


def test_auto_never_downgrades(monkeypatch: pytest.MonkeyPatch) -> None:
    """Class 4: without docker, ``auto`` is a clear error; the process backend only by name."""
    from toolgym.errors import InfrastructureError
    from toolgym.sandboxes import docker_backend, get_sandbox

    monkeypatch.setattr(docker_backend, "docker_problem", lambda image: "no docker daemon answers (test)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "falling back" warning either: an error
        with pytest.raises(InfrastructureError, match="never downgrades"):
            get_sandbox("auto")


# -- smaller -------------------------------------------------------------------------------------------


@pytest.mark.bound(40)
def test_system_exit_codes_map_as_cpython(any_sb: Sandbox) -> None:
    cases = {"2**70": 255, "256": 0, "-1": 255, "'msg'": 1, "True": 1, "None": 0, "3": 3, "[1]": 1}
    for arg, want in cases.items():
        res = any_sb.run(f"import sys\nsys.exit({arg})", timeout=T)
        assert res.exit_code == want and res.status == ("ok" if want == 0 else "error"), (arg, res)
    assert "msg" in any_sb.run("import sys\nsys.exit('msg')", timeout=T).stderr
    with any_sb.session() as s:
        for arg, want in cases.items():
            res = s.run(f"import sys\nsys.exit({arg})")
            assert res.exit_code == want and not res.restarted, (arg, res)


@pytest.mark.bound(30)
def test_atexit_and_del_run_at_the_end_of_a_one_shot_run(any_sb: Sandbox) -> None:
    code = (
        "import atexit\natexit.register(print, 'atexit ran')\n"
        "class K:\n    def __del__(self):\n        print('del ran')\nk = K()\nprint('body')"
    )
    res = any_sb.run(code, timeout=T)
    assert res.ok and res.stdout.splitlines() == ["body", "atexit ran", "del ran"], res
    slow = "import atexit, time\natexit.register(time.sleep, 100)"
    t0 = time.monotonic()
    assert any_sb.run(slow, timeout=1).status == "timeout" and time.monotonic() - t0 < 4


@pytest.mark.bound(60)
def test_grader_mode_hides_the_harness_from_the_candidate(any_sb: Sandbox) -> None:
    """For graders (`run(..., grader=True)`): the harness's stdin secret, memory and fds are out of reach of
    the candidate process it starts under the box uid, which also cannot signal it."""
    harness = """
import os, subprocess, sys
secret = sys.stdin.read()
uid, gid = int(os.environ["TOOLGYM_CANDIDATE_UID"]), int(os.environ["TOOLGYM_CANDIDATE_GID"])
me = os.getpid()
candidate = f'''
import os, signal
out = []
for path in ["/proc/{me}/fd/0", "/proc/{me}/mem", "/proc/{me}/environ", "/proc/{me}/cmdline"]:
    try:
        out.append(open(path, "rb").read(200))
    except OSError as exc:
        out.append(exc.errno)
try:
    os.kill({me}, signal.SIGKILL)
    out.append("killed")
except OSError as exc:
    out.append(exc.errno)
print(out, os.getuid())
'''
r = subprocess.run([sys.executable, "-c", candidate], user=uid, group=gid, extra_groups=[], capture_output=True, text=True)
print("REPORT", secret in r.stdout, "killed" in r.stdout, r.stdout.strip().rsplit(" ", 1)[-1] == str(uid))
"""
    nonce = secrets.token_hex(8)
    res = any_sb.run(harness, stdin=nonce, timeout=15, grader=True)
    assert res.ok and res.stdout.strip().endswith("REPORT False False True"), res
    assert any_sb.run("print(3)", timeout=T).stdout == "3\n"


@pytest.mark.bound(30)
def test_no_host_path_in_the_box_mounts(docker_sb: Sandbox) -> None:
    from pathlib import Path

    import toolgym.sandboxes as pkg

    res = docker_sb.run("print(open('/proc/self/mountinfo').read())", timeout=T)
    root = str(Path(pkg.__file__).resolve().parent.parent)
    assert res.ok and root not in res.stdout and "/inside" not in res.stdout, res.stdout


@pytest.mark.bound(120)
def test_discarded_boxes_are_removed_before_the_program_exits(docker_sb: Sandbox) -> None:
    """Boxes destroyed in the background are waited for at exit: no container outlives its program."""
    import sys

    from tests import processes
    from toolgym.sandboxes.docker_backend import client

    code = (
        "from toolgym.sandboxes import get_sandbox\nsb = get_sandbox('docker', pool_size=2)\nsb.warmup()\n"
        "print(sb._prefix, flush=True)\nfor box in list(sb.pool._idle):\n    box.broken = 'test'\n"
        "sb.run('print(1)', timeout=10)\n"
    )
    out = processes.run([sys.executable, "-c", code], timeout=100)
    prefix = out.stdout.split()[0]
    assert not client().containers.list(all=True, filters={"name": prefix}), out.stderr[-2000:]


@pytest.mark.bound(90)
def test_doctor_prune_removes_this_hosts_orphans_and_all_hosts_the_rest(
    docker_sb: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    """``doctor --prune`` removes this host's containers whose owner is gone and leaves other hosts' on a
    shared daemon (their pids mean nothing here; was: removed them too) and unlabelled ones, saying how many
    of which host it left; ``--prune --all-hosts`` removes those as well, saying how many of which host. A
    live owner's container stays either way."""
    import os
    import re
    import socket
    import sys

    from tests import processes
    from toolgym.cli.sandbox import _prune
    from toolgym.sandboxes.docker_backend import LABEL, OWNER, client

    dead = processes.run([sys.executable, "-c", "import os; print(os.getpid())"], timeout=30)
    host = socket.gethostname()
    other = f"gone-host-{os.getpid()}"
    made = {}
    for name, labels in (("orphan", {OWNER: f"{host}:{dead.stdout.strip()}"}), ("live", {OWNER: f"{host}:{os.getpid()}"}),
                         ("elsewhere", {OWNER: f"{other}:1"}), ("elsewhere2", {OWNER: f"{other}:{os.getpid()}"}),
                         ("unlabelled", {})):  # fmt: skip
        made[name] = client().containers.run(
            docker_sb.limits.image, ["sleep", "600"], detach=True, labels={LABEL: "1", **labels},
            network_mode="none", user="65534:65534",
        )  # fmt: skip

    def left() -> set[str]:
        ids = {c.id for c in client().containers.list(all=True, filters={"label": LABEL})}
        return {name for name, c in made.items() if c.id in ids}

    try:
        _prune(all_hosts=False)
        out = capsys.readouterr().out
        assert left() == {"live", "elsewhere", "elsewhere2", "unlabelled"}
        assert re.search(rf"of this host \({host}\) whose owner process is gone: \d+ of {host}\n", out), out
        assert f"2 of {other}" in out and re.search(r"\d+ of \?", out) and "--all-hosts" in out, out
        _prune(all_hosts=True)
        out = capsys.readouterr().out
        assert left() == {"live"}
        assert f"2 of {other}" in out and re.search(r"\d+ of \?", out) and f"of {host}" not in out, out
        assert "\nleft " not in out and "container(s) of other hosts" not in out, out
    finally:
        for c in made.values():
            with contextlib.suppress(Exception):
                c.remove(force=True)


@pytest.mark.bound(60)
def test_a_supervisor_stopped_by_the_host_is_sandbox_error(docker_sb: Sandbox) -> None:
    """Class 2's other side: ``sandbox_error`` is for what the code cannot cause, e.g. the supervisor
    stopped from outside (the host's deadline)."""
    import os
    import signal

    from toolgym.sandboxes.docker_backend import client

    def stop_supervisor() -> None:
        time.sleep(0.5)
        for c in client().containers.list(filters={"name": docker_sb._prefix}):  # type: ignore[attr-defined]
            for p in c.top(ps_args="-o pid,args")["Processes"] or []:
                if "sleep-marker" in " ".join(p):
                    for q in c.top(ps_args="-o pid,args")["Processes"] or []:
                        if "serve" in " ".join(q):
                            os.kill(int(q[0]), signal.SIGSTOP)

    threading.Thread(target=stop_supervisor).start()
    res = docker_sb.run("import os\nos.execvp('sleep', ['sleep-marker', '30'])", timeout=1)
    assert res.status == "sandbox_error", res
    assert docker_sb.run("print(5)", timeout=T).stdout == "5\n"


@pytest.mark.bound(60)
def test_a_new_sandbox_reaps_this_hosts_orphans_and_leaves_other_hosts(
    docker_sb: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed with its pool (SIGKILL, os._exit, a dead Ray worker) leaves its containers: the next
    sandbox made on this host removes those whose owner is gone, once a process; a live owner's and another
    host's (a shared daemon) stay."""
    import os
    import socket
    import sys

    from tests import processes
    from toolgym.sandboxes import docker_backend
    from toolgym.sandboxes.docker_backend import LABEL, OWNER, DockerSandbox, client

    dead = processes.run([sys.executable, "-c", "import os; print(os.getpid())"], timeout=30)
    gone_pid = int(dead.stdout.strip())
    host = socket.gethostname()
    made = {}
    for name, owner in (("orphan", f"{host}:{gone_pid}"), ("live", f"{host}:{os.getpid()}"),
                        ("elsewhere", "other-host:1")):  # fmt: skip
        made[name] = client().containers.run(
            docker_sb.limits.image, ["sleep", "600"], detach=True, labels={LABEL: "1", OWNER: owner},
            network_mode="none", user="65534:65534",
        )  # fmt: skip
    try:
        monkeypatch.setattr(docker_backend, "_reaped", docker_backend.threading.Event())
        DockerSandbox(docker_sb.limits)
        left = {c.id for c in client().containers.list(all=True, filters={"label": LABEL})}
        assert made["orphan"].id not in left
        assert made["live"].id in left and made["elsewhere"].id in left
        DockerSandbox(docker_sb.limits)  # once a process: no second sweep
        assert docker_backend._reaped.is_set()
    finally:
        for c in made.values():
            with contextlib.suppress(Exception):
                c.remove(force=True)
