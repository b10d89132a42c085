"""The process backend: each box is a bubblewrap (``bwrap``) sandbox on this machine, for hosts without a
docker daemon. Opt in explicitly with ``get_sandbox("process")``; ``auto`` never falls back to it.

Each box: its own pid, IPC, UTS and cgroup namespaces and (unless ``network``) its own empty network
namespace; a read-only view of the host file system with a private tmpfs ``/tmp`` (``tmp_mb``) and
``/dev/shm``, a private ``/dev`` and ``/proc``; ``/run`` (the docker socket), ``/var/tmp``, ``/home`` and
``/root`` replaced by empty tmpfs (the Python installation is bound back read-only where it lives there);
``/etc/shadow``, ``/etc/gshadow`` and ``/proc/kallsyms`` masked. The supervisor runs as root inside with
only the capabilities to drop the code, kill it and clean up after it; the code runs under a uid of its
own (``UID_BASE`` + n, one per box, no capabilities, ``no_new_privs``) with rlimits: address space
``memory_mb``, processes ``pids`` (counted per uid, so per box), ``nofile``, ``fsize_mb``, an 8 MiB stack,
no core files. Needs root on the host (to start boxes and give each its own uid) and bubblewrap.

What is covered and what is not: see docs/sandboxes.md ("Threat model"); each row has a test in
tests/sandboxes/.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

from toolgym.errors import InfrastructureError
from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.box import Box
from toolgym.sandboxes.channel import PipeChannel
from toolgym.sandboxes.inside import boot_args, package_blobs
from toolgym.sandboxes.inside.frames import encode
from toolgym.sandboxes.limits import Limits

UID_BASE = 200000  # box n's code runs as uid/gid UID_BASE + n: no host account, no files on the host
UID_SPAN = 100000
INSIDE_ROOT = "/run/toolgym"  # inside the box's private /run tmpfs, root-owned: the code cannot write it
HIDDEN = ("/run", "/var/tmp", "/home", "/root")  # replaced by empty tmpfs in every box
MASKED = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
# (Not CAP_SYS_RESOURCE: bwrap 0.8 then keeps every capability. The OOM score is set before bwrap starts.)
CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_PTRACE")
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8:backslashreplace",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
_uids = itertools.count()
_uid_lock = threading.Lock()
# bwrap's --die-with-parent fires when the *thread* that started it ends, so every box is started from this
# one long-lived thread: boxes die with the program (even on SIGKILL), not with a caller's worker thread.
_spawner = ThreadPoolExecutor(1, thread_name_prefix="bwrap-spawner")


@cache
def process_problem() -> str | None:
    """None when boxes can be made here; otherwise what is missing and what to do."""
    if not shutil.which("bwrap"):
        return "bubblewrap is missing: apt-get install bubblewrap (the process backend runs boxes with it)"
    if os.geteuid() != 0:
        return (
            "the process backend needs root (it gives each box's code a uid of its own); run as root or use "
            "the docker backend"
        )
    try:
        probe = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--dev", "/dev", "true"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap does not run here: {exc}"
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces here: {probe.stderr.decode(errors='replace').strip()[:300]}"
    return None


def _protect_from_oom() -> None:
    """In the bwrap child before exec: bwrap, its init and the supervisor inherit -1000 (never OOM-killed);
    the code's processes raise theirs to 1000."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")  # refused on some kernels: the code's 1000 still makes it the OOM killer's choice


def _python_dirs() -> list[str]:
    """Where this Python lives, when that is under a hidden dir (e.g. pyenv in /root): bound back read-only."""
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    keep = [d for d in sorted(dirs) if any(d == h or d.startswith(h + "/") for h in HIDDEN)]
    return [d for d in keep if not any(d != o and d.startswith(o + "/") for o in keep)]


def bwrap_command(lim: Limits, uid: int) -> list[str]:
    cmd = ["bwrap", "--die-with-parent", "--new-session"]
    cmd += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not lim.network:
        cmd.append("--unshare-net")
    cmd += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    cmd += ["--perms", "1777", "--size", str(16 << 20), "--tmpfs", "/dev/shm"]
    cmd += ["--perms", "1777", "--size", str(lim.tmp_mb << 20), "--tmpfs", "/tmp"]
    for hidden in HIDDEN:
        if os.path.isdir(hidden) and not os.path.islink(hidden):
            cmd += ["--tmpfs", hidden]
    for d in _python_dirs():
        parts = d.strip("/").split("/")
        for i in range(2, len(parts)):  # bwrap would make the parents 0700: the code's uid must pass
            cmd += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
        cmd += ["--ro-bind", d, d]
    for masked in (*MASKED, "/proc/kallsyms"):
        if os.path.exists(masked):
            cmd += ["--ro-bind", "/dev/null", masked]
    cmd += ["--cap-drop", "ALL"]
    from toolgym.sandboxes.docker_backend import host_caps

    for cap in CAPS + (("CAP_SYS_NICE",) if host_caps() >> 23 & 1 else ()):
        cmd += ["--cap-add", cap]
    cmd += ["--hostname", "sandbox", "--chdir", "/tmp", "--clearenv"]
    for k, v in ENV.items():
        cmd += ["--setenv", k, v]
    limits = {
        "RLIMIT_AS": lim.memory_mb << 20,
        "RLIMIT_NPROC": lim.pids,
        "RLIMIT_NOFILE": lim.nofile,
        "RLIMIT_FSIZE": lim.fsize_mb << 20,
        "RLIMIT_CORE": 0,
        "RLIMIT_STACK": 8 << 20,  # deep recursion ends in a crash, fast
    }
    cmd += [sys.executable, *boot_args(INSIDE_ROOT), "serve", "--contained", f"--uid={uid}", f"--gid={uid}"]
    cmd += ["--scratch=/tmp", "--scratch=/dev/shm", f"--max-output={lim.output_bytes}"]
    cmd += [f"--limit={k}={v}" for k, v in limits.items()]
    cmd += [f"--preload={m}" for m in lim.preload]
    return cmd


class ProcessSandbox(Sandbox):
    backend = "process"

    def describe(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "backend": self.backend,
            "isolation": "bubblewrap: own pid/ipc/uts/cgroup"
            + ("" if lim.network else "/network")
            + " namespaces, read-only host file system, private /tmp /dev/shm /dev /proc /run",
            "code uid": f"{UID_BASE}+n (one per box), no capabilities, no_new_privs",
            "network_namespace": not lim.network,
            "pid_namespace": True,
            "memory_mb (RLIMIT_AS)": lim.memory_mb,
            "pids (RLIMIT_NPROC)": lim.pids,
            "tmp_mb": lim.tmp_mb,
            "nofile": lim.nofile,
            "fsize_mb": lim.fsize_mb,
            "output_bytes": lim.output_bytes,
            "timeout_s": lim.timeout_s,
            "pool_size": lim.size,
            "not covered": "CPU quota, memory cgroup (page cache, tmpfs), seccomp, kernel exploits",
        }

    def _new_box(self) -> Box:
        problem = process_problem()
        if problem:
            raise InfrastructureError(problem)
        with _uid_lock:
            uid = UID_BASE + next(_uids) % UID_SPAN
        proc = _spawner.submit(
            subprocess.Popen,
            bwrap_command(self.limits, uid),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_protect_from_oom,
        ).result()
        assert proc.stdin is not None and proc.stdout is not None
        channel = PipeChannel(os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno()))
        proc.stdin.close()
        proc.stdout.close()

        def destroy() -> None:
            channel.close()
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)  # --die-with-parent takes the whole box down with it
            proc.wait()

        box = Box(
            channel,
            name=f"bwrap-{proc.pid}",
            grace_s=self.limits.grace_s,
            is_running=lambda: proc.poll() is None,
            destroy=destroy,
        )
        with contextlib.suppress(OSError):  # a failure is reported by the ping below
            channel._send(encode({}, package_blobs()))
        if not box.ping():
            box.destroy()
            raise InfrastructureError("the process sandbox did not start (bwrap or the supervisor failed)")
        return box


def process_sandbox(limits: Limits | None = None, **overrides: Any) -> ProcessSandbox:
    return ProcessSandbox((limits or Limits()).updated(**overrides))
