"""The process backend: each box is a bubblewrap (``bwrap``) sandbox on this machine, for hosts without a
docker daemon. Opt in explicitly with ``get_sandbox("process")``; ``auto`` never falls back to it.

Each box: its own pid, UTS and cgroup namespaces and (unless ``network``) its own empty network namespace;
its own IPC namespace with small caps (SysV shared memory 16 MiB in all, few queues: objects there would
otherwise escape ``memory_mb``), made before bwrap starts, and its POSIX message queues mounted at
``/dev/mqueue`` so they are wiped with the rest. Only what a box needs of the host file system, read-only:
the system dirs (``/usr``, ``/bin``, ``/lib*``, ``/sbin``, ``/etc``) and the Python installation it runs
(its prefix, its base prefix), wherever they live, ``/tmp`` included; never the project's source, the
user's files, ``/sys`` or ``/run``. A private tmpfs ``/tmp`` (``tmp_mb``) and ``/dev/shm``, a private
``/dev`` and ``/proc``; ``/etc/shadow``, ``/etc/gshadow`` and ``/proc/kallsyms`` masked. The supervisor
runs as root inside with only the capabilities to drop the code, kill it and clean up after it; the code
runs under a uid of its own (leased host-wide, see `toolgym.sandboxes.uids`: no other box of any program
has it), no capabilities, ``no_new_privs``, with rlimits: address space ``memory_mb``, processes ``pids``
(counted per uid, so per box), ``nofile``, ``fsize_mb``, an 8 MiB stack, no core files. Needs root on the
host (to start boxes and give each its own uid) and bubblewrap.

What is covered and what is not: see docs/sandboxes.md ("Threat model"); each row has a test in
tests/sandboxes/.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

from toolgym.errors import InfrastructureError
from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.box import Box
from toolgym.sandboxes.channel import PipeChannel
from toolgym.sandboxes.inside import boot_args, package_blobs
from toolgym.sandboxes.inside.frames import encode
from toolgym.sandboxes.limits import BOX_ENV, Limits
from toolgym.sandboxes.uids import UID_BASE, UID_SPAN, lease_uid

INSIDE_ROOT = "/run/toolgym"  # inside the box's private /run tmpfs, root-owned: the code cannot write it
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MASKED = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
# (Not CAP_SYS_RESOURCE: bwrap 0.8 then keeps every capability. The OOM score is set before bwrap starts.)
CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_PTRACE")
CLONE_NEWIPC = 0x08000000
_libc = ctypes.CDLL(None, use_errno=True)
# Caps of the box's own IPC namespace (per namespace, so set once before bwrap starts): SysV shared memory is
# not counted by RLIMIT_AS, POSIX queues and SysV queues hold kernel memory.
IPC_SYSCTLS = {
    "kernel/shmmax": 16 << 20,
    "kernel/shmall": (16 << 20) // 4096,
    "kernel/shmmni": 64,
    "kernel/shm_rmid_forced": 1,
    "kernel/msgmni": 16,
    "fs/mqueue/queues_max": 16,
}
# bwrap's --die-with-parent fires when the *thread* that started it ends, so every box is started from this
# one long-lived thread: boxes die with the program (even on SIGKILL), not with a caller's worker thread.
_spawner = ThreadPoolExecutor(1, thread_name_prefix="bwrap-spawner")


def _host_problem() -> str | None:
    if not shutil.which("bwrap"):
        return "bubblewrap is missing: apt-get install bubblewrap (the process backend runs boxes with it)"
    if os.geteuid() != 0:
        return (
            "the process backend needs root (it gives each box's code a uid of its own); run as root or use "
            "the docker backend"
        )
    return None


@cache
def process_problem() -> str | None:
    """None when boxes can be made here; otherwise what is missing and what to do. Starts one real box
    (the same command, binds and supervisor every box gets) and pings it, so it fails exactly when boxes
    would, with bwrap's or the supervisor's own message."""
    problem = _host_problem()
    if problem is not None:
        return problem
    try:
        ProcessSandbox(Limits(pool_size=1))._start_box().destroy()
    except InfrastructureError as exc:
        return str(exc)
    return None


def _prepare_child() -> None:
    """In the bwrap child before exec: bwrap, its init and the supervisor inherit OOM score -1000 (never
    OOM-killed; the code's processes raise theirs to 1000), and the box gets an IPC namespace of its own
    with `IPC_SYSCTLS` (bwrap inherits it: it is not asked to make another)."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")  # refused on some kernels: the code's 1000 still makes it the OOM killer's choice
    if _libc.unshare(CLONE_NEWIPC) != 0:  # (nothing is imported here: the parent has threads)
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWIPC) failed: the box needs an IPC namespace")
    for name, value in IPC_SYSCTLS.items():
        with open(f"/proc/sys/{name}", "w") as f:
            f.write(str(value))


def python_dirs() -> list[str]:
    """What of this Python a box needs, outside the system dirs: its prefix and base prefix (a venv and the
    interpreter it was made from) and the directory of the executable, resolved; none inside another."""
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
    dirs.add(os.path.dirname(os.path.realpath(sys.executable)))
    dirs.add(os.path.dirname(os.path.abspath(sys.executable)))
    system = [os.path.realpath(d) for d in SYSTEM_DIRS if os.path.exists(d)]
    keep = [d for d in sorted(dirs) if not any(d == s or d.startswith(s + "/") for s in system)]
    return [d for d in keep if not any(d != o and d.startswith(o + "/") for o in keep)]


def project_dirs() -> list[str]:
    """Where toolgym's own source lives, masked in a box when a bound Python holds it (a non-editable
    install): the code must not read the project (reference solutions, hidden tests)."""
    import toolgym

    roots = {os.path.dirname(os.path.realpath(toolgym.__file__))}
    for name in ("sandboxes", "envs", "rewards"):
        mod = sys.modules.get(f"toolgym.{name}")
        if mod is not None and getattr(mod, "__file__", None):
            roots.add(os.path.dirname(os.path.realpath(mod.__file__ or "")))
    return sorted(roots)


def bwrap_command(lim: Limits, uid: int) -> list[str]:
    cmd = ["bwrap", "--die-with-parent", "--new-session"]
    cmd += ["--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]  # IPC: `_prepare_child`
    if not lim.network:
        cmd.append("--unshare-net")
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    cmd += ["--dev", "/dev", "--proc", "/proc", "--mqueue", "/dev/mqueue"]
    cmd += ["--perms", "1777", "--size", str(16 << 20), "--tmpfs", "/dev/shm"]
    cmd += ["--perms", "1777", "--size", str(lim.tmp_mb << 20), "--tmpfs", "/tmp"]
    cmd += ["--perms", "0755", "--tmpfs", "/run"]
    bound = python_dirs()
    for d in bound:
        parts = d.strip("/").split("/")
        for i in range(1, len(parts)):  # bwrap would make the parents 0700: the code's uid must pass
            cmd += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
        cmd += ["--ro-bind", d, d]
    for d in project_dirs():
        if any(d == b or d.startswith(b + "/") for b in bound):
            cmd += ["--tmpfs", d]
    for masked in (*MASKED, "/proc/kallsyms"):
        if os.path.exists(masked):
            cmd += ["--ro-bind", "/dev/null", masked]
    cmd += ["--cap-drop", "ALL"]
    from toolgym.sandboxes.docker_backend import host_caps

    for cap in CAPS + (("CAP_SYS_NICE",) if host_caps() >> 23 & 1 else ()):
        cmd += ["--cap-add", cap]
    cmd += ["--hostname", "sandbox", "--chdir", "/tmp", "--clearenv"]
    for k, v in BOX_ENV.items():
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
    cmd += [
        "--scratch=/tmp",
        "--scratch=/dev/shm",
        "--scratch=/dev/mqueue",
        f"--max-output={lim.output_bytes}",
    ]
    # The chain of dirs down to a Python bound under /tmp is not the code's scratch: never wiped.
    cmd += [f"--keep=/tmp/{d.split('/')[2]}" for d in bound if d.startswith("/tmp/")]
    cmd += [f"--limit={k}={v}" for k, v in limits.items()]
    cmd += [f"--preload={m}" for m in lim.preload]
    return cmd


class ProcessSandbox(Sandbox):
    backend = "process"

    def __init__(self, limits: Limits) -> None:
        self.uids: set[int] = set()  # the code uids of this sandbox's live boxes
        super().__init__(limits)

    def describe(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "backend": self.backend,
            "isolation": "bubblewrap: own pid/ipc/uts/cgroup"
            + ("" if lim.network else "/network")
            + " namespaces; read-only system dirs and this Python only; private /tmp /dev/shm /dev /proc /run",
            "code uid": f"one per box, leased host-wide ({UID_BASE}-{UID_BASE + UID_SPAN - 1}), no capabilities",
            "ipc": "own namespace: SysV shared memory 16 MiB in all, POSIX queues wiped with /dev/mqueue",
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
        return self._start_box()

    def _start_box(self) -> Box:
        """A new box, pinged; InfrastructureError with bwrap's (or the supervisor's) own message when it
        does not answer."""
        lease = lease_uid()
        self.uids.add(lease.uid)
        # bwrap's and the supervisor's stderr: kept (never a pipe nobody reads) to explain a failed start.
        errors = os.memfd_create("bwrap-stderr", os.MFD_CLOEXEC)
        try:
            proc = _spawner.submit(
                subprocess.Popen,
                bwrap_command(self.limits, lease.uid),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_prepare_child,
            ).result()
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(errors)
            self.uids.discard(lease.uid)
            lease.release()
            raise InfrastructureError(f"the process sandbox did not start: {exc}") from exc
        assert proc.stdin is not None and proc.stdout is not None
        channel = PipeChannel(os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno()))
        proc.stdin.close()
        proc.stdout.close()

        def destroy() -> None:
            channel.close()
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)  # --die-with-parent takes the whole box down with it
            proc.wait()
            with contextlib.suppress(OSError):
                os.close(errors)
            self.uids.discard(lease.uid)
            lease.release()  # nothing runs under its uid any more

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
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)
            said = os.pread(errors, 4096, max(0, os.fstat(errors).st_size - 4096)).decode(errors="replace")
            box.destroy()
            why = said.strip() or f"no message; exit status {proc.returncode}"
            raise InfrastructureError(f"the process sandbox did not start: {why}")
        return box


def process_sandbox(limits: Limits | None = None, **overrides: Any) -> ProcessSandbox:
    return ProcessSandbox((limits or Limits()).updated(**overrides))
