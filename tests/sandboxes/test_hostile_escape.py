"""Hostile inputs that try to get out (reference cases 14-22 and 29): network, host services, the file
system, secrets, privileges, the supervisor, the wall clock, the container itself."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.sandboxes.hostile_checks import contained
from toolgym.sandboxes import Sandbox

T = 5.0
BOUND = T + 3.0

PROBE_NET = """
import json, socket, urllib.request
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "reached"
    except Exception as exc:
        out[name] = type(exc).__name__
socket.setdefaulttimeout(2)
attempt("https", lambda: urllib.request.urlopen("https://example.com", timeout=2))
attempt("raw_dns_server", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
attempt("dns_lookup", lambda: socket.getaddrinfo("example.com", 80))
attempt("metadata", lambda: urllib.request.urlopen("http://169.254.169.254/latest/meta-data/", timeout=2))
attempt("gateway", lambda: socket.create_connection(("172.17.0.1", 2375), timeout=2))
print(json.dumps(out))
"""


@pytest.mark.bound(40)
def test_14_15_16_no_network_egress_dns_metadata_or_gateway(any_sb: Sandbox) -> None:
    if any_sb.backend == "process" and not any_sb.describe()["network_namespace"]:
        pytest.skip("the process backend isolates the network only where unshare -n works")
    t0 = time.monotonic()
    res = any_sb.run(PROBE_NET, timeout=15)
    contained(any_sb, res, {"ok"}, 15, t0)
    out = json.loads(res.stdout)
    assert "reached" not in out.values(), out
    assert time.monotonic() - t0 < 8, "failures must be fast (no route), not timeouts"


@pytest.mark.bound(30)
def test_16_docker_socket_absent(docker_sb: Sandbox) -> None:
    code = "import os\nprint([p for p in ('/var/run/docker.sock', '/run/docker.sock') if os.path.exists(p)])"
    t0 = time.monotonic()
    res = docker_sb.run(code, timeout=T)
    contained(docker_sb, res, {"ok"}, BOUND, t0)
    assert res.stdout.strip() == "[]"


LOCAL_SERVER = """
import http.server, threading, urllib.request
srv = http.server.HTTPServer(("127.0.0.1", 8765), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(urllib.request.urlopen("http://127.0.0.1:8765/", timeout=3).status)
srv.shutdown()
"""


@pytest.mark.bound(40)
def test_17_localhost_works_and_ports_do_not_clash(docker_sb: Sandbox) -> None:
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(docker_sb.run(LOCAL_SERVER, timeout=10)))
        for _ in range(2)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for res in results:
        assert res.status == "ok" and res.stdout.strip() == "200", res
    contained(docker_sb, results[0], {"ok"}, 20, t0)


WRITE_OUTSIDE = """
import glob, json
out = {}
for path in ["/etc/passwd", glob.glob("/usr/lib/python3*/os.py")[0], "/bin/bash", "/opt/toolgym/inside/main.py", "/x"]:
    try:
        open(path, "a").write("pwned")
        out[path] = "written"
    except OSError as exc:
        out[path] = exc.strerror
print(json.dumps(out))
"""


@pytest.mark.bound(30)
def test_18_writes_outside_the_work_dir_fail_and_later_runs_see_a_pristine_fs(docker_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = docker_sb.run(WRITE_OUTSIDE + "open('/tmp/tg-hostile-left', 'w').write('x')", timeout=T)
    contained(docker_sb, res, {"ok"}, BOUND, t0)
    out = json.loads(res.stdout)
    assert "written" not in out.values(), out
    for _ in range(3):  # whichever warm container the next runs land on
        again = docker_sb.run(
            "import os\nprint(os.listdir('/tmp'), 'pwned' in open('/etc/passwd').read())", timeout=T
        )
        assert again.stdout.split("] ")[1].strip() == "False" and "tg-hostile-left" not in again.stdout, again


SECRETS = """
import json, os
env = dict(os.environ)
try:
    init_env = open("/proc/1/environ").read()
except OSError as exc:
    init_env = exc.strerror
print(json.dumps({"env": env, "init_env": init_env, "aws": os.path.exists(os.path.expanduser("~/.aws")),
                  "uid": os.getuid()}))
"""


@pytest.mark.bound(30)
def test_19_no_host_secrets_or_environment(docker_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = docker_sb.run(SECRETS, timeout=T)
    contained(docker_sb, res, {"ok"}, BOUND, t0)
    out = json.loads(res.stdout)
    from toolgym.sandboxes.limits import BOX_ENV

    assert set(out["env"]) <= {*BOX_ENV, "HOSTNAME"}, out["env"]
    assert "hunter2" not in res.stdout and not out["aws"] and 200000 <= out["uid"] < 300000


@pytest.mark.bound(30)
def test_19_process_backend_scrubs_the_environment(process_sb: Sandbox) -> None:
    res = process_sb.run("import os\nprint(sorted(os.environ))", timeout=T)
    assert res.ok and "TOOLGYM_TEST_HOST_SECRET" not in res.stdout, res


PRIVILEGE = """
import ctypes, json, os, subprocess
out = {}
def attempt(name, fn):
    try:
        r = fn()
        out[name] = "ok" if r in (None, 0) else f"rc={r}"
    except Exception as exc:
        out[name] = type(exc).__name__
attempt("setuid0", lambda: os.setuid(0))
attempt("chroot", lambda: os.chroot("/tmp"))
attempt("mount", lambda: subprocess.run(["mount", "-t", "tmpfs", "x", "/mnt"], capture_output=True).returncode)
attempt("unshare_r", lambda: subprocess.run(["unshare", "-r", "true"], capture_output=True).returncode)
libc = ctypes.CDLL(None, use_errno=True)
# PTRACE_ATTACH to init and to the supervisor: same uid, but both made themselves non-dumpable.
attempt("ptrace_init", lambda: 0 if libc.ptrace(16, 1, 0, 0) == 0 else 1 / 0)
attempt("ptrace_supervisor", lambda: 0 if libc.ptrace(16, os.getppid(), 0, 0) == 0 else 1 / 0)
print(json.dumps(out))
"""


@pytest.mark.bound(30)
def test_20_privilege_escalation_fails(docker_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = docker_sb.run(PRIVILEGE, timeout=T)
    contained(docker_sb, res, {"ok"}, BOUND, t0)
    out = json.loads(res.stdout)
    assert "ok" not in out.values(), out


@pytest.mark.bound(40)
@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.kill(1, 9)",
        "import os\nos.killpg(0, 9)",
        "import os\nos.kill(os.getppid(), 9)\nimport time; time.sleep(30)",
        "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)",
        "import os\nos.kill(-1, 9)",
    ],
    ids=["init", "own-group", "supervisor", "stop-supervisor", "everything"],
)
def test_21_killing_the_supervisor_or_init_is_refused(any_sb: Sandbox, code: str) -> None:
    """The code runs under another uid than init and the supervisor: it can kill only its own processes,
    and whatever it does is its own ``error`` (never ``sandbox_error``, never a timeout of the box)."""
    t0 = time.monotonic()
    res = any_sb.run(code, timeout=T)
    if "getppid(), 9" in code or "kill(1" in code or "SIGSTOP" in code:
        assert "PermissionError" in res.stderr, res
    # kill(-1) reaches only the code's own processes, and never the caller itself: nothing to kill, "ok"
    contained(any_sb, res, {"ok"} if "kill(-1" in code else {"error"}, BOUND, t0)


ESCAPE = """
import os, subprocess, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
subprocess.Popen(["bash", "-c", "nohup sleep 1000 >/dev/null 2>&1 &"], start_new_session=True)
time.sleep(0.3)
print("escaped?")
"""


@pytest.mark.bound(30)
@pytest.mark.parametrize("wait", [False, True], ids=["returns", "times-out"])
def test_22_setsid_and_double_fork_do_not_escape(any_sb: Sandbox, wait: bool) -> None:
    t0 = time.monotonic()
    res = any_sb.run(ESCAPE + ("time.sleep(100)" if wait else ""), timeout=2.0)
    contained(any_sb, res, {"timeout"} if wait else {"ok"}, 6, t0)


@pytest.mark.bound(60)
def test_29_container_killed_mid_call(docker_sb: Sandbox) -> None:
    from toolgym.sandboxes.docker_backend import client

    before = {c.id for c in client().containers.list(filters={"name": docker_sb._prefix})}  # type: ignore[attr-defined]

    def killer() -> None:
        time.sleep(0.7)
        for c in client().containers.list(filters={"name": docker_sb._prefix}):  # type: ignore[attr-defined]
            for p in c.top(ps_args="-o pid,args")["Processes"] or []:
                if "sleep-marker" in " ".join(p):
                    c.kill()

    threading.Thread(target=killer).start()
    t0 = time.monotonic()
    res = docker_sb.run("import os\nos.execvp('sleep', ['sleep-marker', '30'])", timeout=10)
    assert res.status == "sandbox_error" and res.infra_failure, res
    contained(docker_sb, res, {"sandbox_error"}, 8, t0)
    deadline = time.monotonic() + 15  # the replacement is started in the background
    while docker_sb.pool.stats()["idle"] < docker_sb.limits.size and time.monotonic() < deadline:
        time.sleep(0.2)
    assert docker_sb.pool.stats()["idle"] == docker_sb.limits.size, docker_sb.pool.stats()  # warm again
    after = {c.id for c in client().containers.list(filters={"name": docker_sb._prefix})}  # type: ignore[attr-defined]
    assert after - before, "the pool replaced the dead container"


LEAVE_IPC = """
import ctypes, os
from multiprocessing import shared_memory
libc = ctypes.CDLL(None)
seg = libc.shmget(0x7047, 1 << 20, 0o1666)  # IPC_CREAT | 0666: a System V segment outlives processes
posix = shared_memory.SharedMemory(name="tg_left", create=True, size=4096)
posix.buf[:5] = b"taint"
open("/tmp/tg-hostile-taint", "w").write("x")
print(seg >= 0)
"""

FIND_IPC = """
import os
print(open("/proc/sysvipc/shm").read().count("\\n") - 1, sorted(os.listdir("/dev/shm")), sorted(os.listdir("/tmp")))
"""


@pytest.mark.bound(30)
def test_27_one_shot_runs_leave_nothing_for_the_next_run(docker_sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = docker_sb.run(LEAVE_IPC, timeout=T)
    assert res.ok and res.stdout == "True\n", res
    for _ in range(docker_sb.limits.size + 1):  # whichever container the next runs land on
        again = docker_sb.run(FIND_IPC, timeout=T)
        assert again.ok and again.stdout.startswith("0 [] ["), again
        assert "taint" not in again.stdout
    contained(docker_sb, res, {"ok"}, BOUND + 5, t0)
