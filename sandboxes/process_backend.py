"""The process backend: the fallback where no docker daemon answers.

Each box is the supervisor (`toolgym.sandboxes.inside`) started as a child process: its own session and
process group, a private temp dir as working dir, TMPDIR and HOME, a scrubbed environment, rlimits
(address space = ``memory_mb``, ``nofile``, ``fsize_mb``, 8 MiB stack, no core files). Where ``unshare``
works (as root, or with user namespaces) it also gets its own network, pid, mount and IPC namespaces: the
supervisor is then PID 1 there, so the code cannot kill it, ``kill(-1)`` reaches only the sandbox's own
processes, and ``/proc`` lists only them.

What is covered: wall-clock timeouts (CPU spin, sleep, blocking stdin), memory bombs (``MemoryError`` at
the address-space cap), output floods and invalid UTF-8, big files (``fsize``), fd exhaustion (``nofile``),
deep recursion, 5 MB payloads, persistent sessions with fork, setsid/double-fork escapes (the supervisor
is a subreaper and kills strays); with namespaces also network egress, killing the supervisor, other
processes in ``/proc``, System V IPC left between runs.
What is not covered (use the docker backend for untrusted code): fork and thread bombs (no pids cap);
reading or writing anything the host user can reach on the file system (other sandboxes' temp dirs, the
host's secrets); privileges: the code runs as the host user, so as root it is root on the host's files;
CPU quotas; disk use outside TMPDIR; any of the namespace items where ``unshare`` does not work.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.box import Box
from toolgym.sandboxes.channel import PipeChannel
from toolgym.sandboxes.inside import launch_args
from toolgym.sandboxes.limits import Limits

SANDBOXES_DIR = str(Path(__file__).parent)  # holds the `inside` supervisor package
MARK = "TOOLGYM_SANDBOX_ID"  # inherited by everything the code starts: lets cleanup find escaped processes


NAMESPACES = ("--pid", "--fork", "--mount", "--ipc", "--mount-proc", "--kill-child=SIGKILL")


@cache
def _works(flags: tuple[str, ...]) -> bool:
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@cache
def isolation(network: bool) -> tuple[tuple[str, ...], bool, bool]:
    """(command prefix, own pid+mount+ipc namespaces?, own network namespace?) that work here, best first:
    as root plain ``unshare``, otherwise with a user namespace (``-r``); nothing if neither works."""
    if not shutil.which("unshare"):
        return (), False, False
    net = () if network else ("--net",)
    for user in ((), ("--map-root-user",)):
        for flags, pidns in ((*user, *net, *NAMESPACES), True), ((*user, *net), False):
            if flags and _works(flags):
                return ("unshare", *flags, "--"), pidns, bool(net)
    return (), False, False


def _kill_marked(mark: str) -> None:
    """SIGKILLs every process whose environment carries this box's mark (escaped daemons included)."""
    needle = f"{MARK}={mark}".encode()
    for _ in range(20):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if needle in env.split(b"\0"):
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)
        if not found:
            return


class ProcessSandbox(Sandbox):
    backend = "process"

    def describe(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "backend": self.backend,
            "isolation": "child process with rlimits, own process group and temp dir"
            + (", own pid/mount/ipc namespaces" if isolation(lim.network)[1] else ""),
            "network_namespace": isolation(lim.network)[2],
            "pid_namespace": isolation(lim.network)[1],
            "memory_mb (RLIMIT_AS)": lim.memory_mb,
            "nofile": lim.nofile,
            "fsize_mb": lim.fsize_mb,
            "output_bytes": lim.output_bytes,
            "timeout_s": lim.timeout_s,
            "pool_size": lim.size,
            "not covered": "fork bombs, the host file system, privileges of the host user, CPU quota",
        }

    def _new_box(self) -> Box:
        lim = self.limits
        mark = uuid.uuid4().hex
        workdir = tempfile.mkdtemp(prefix="toolgym-sbx-")
        os.chmod(workdir, 0o700)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8:backslashreplace",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            MARK: mark,
        }
        mem = lim.memory_mb << 20

        def limit_child() -> None:  # runs in the child between fork and exec
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_NOFILE, (lim.nofile, lim.nofile))
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim.fsize_mb << 20, lim.fsize_mb << 20))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(
                resource.RLIMIT_STACK, (8 << 20, 8 << 20)
            )  # deep recursion ends in a crash, fast

        cmd = [
            sys.executable,
            *launch_args(SANDBOXES_DIR, "serve"),
            f"--scratch={workdir}",
            f"--max-output={lim.output_bytes}",
        ]
        cmd += [f"--preload={m}" for m in lim.preload]
        prefix, pidns, _ = isolation(lim.network)
        if pidns:  # the supervisor is PID 1 of its own namespaces: killing everything there is safe
            cmd.append("--contained")
        proc = subprocess.Popen(
            [*prefix, *cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=limit_child,
            close_fds=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        channel = PipeChannel(os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno()))
        proc.stdin.close()
        proc.stdout.close()

        def destroy() -> None:
            channel.close()
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _kill_marked(mark)
            shutil.rmtree(workdir, ignore_errors=True)

        box = Box(
            channel,
            name=f"proc-{proc.pid}",
            grace_s=lim.grace_s,
            is_running=lambda: proc.poll() is None,
            destroy=destroy,
        )
        if not box.ping():
            box.destroy()
            from toolgym.errors import InfrastructureError

            raise InfrastructureError(f"the process sandbox did not start ({' '.join(cmd[:3])})")
        return box


def process_sandbox(limits: Limits | None = None, **overrides: Any) -> ProcessSandbox:
    return ProcessSandbox((limits or Limits()).updated(**overrides))
