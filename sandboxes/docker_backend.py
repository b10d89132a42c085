"""The docker backend: one hardened container per box, the supervisor on a ``docker exec`` stream.

Container settings (each from `Limits`): ``network_mode=none``; read-only root file system; a tmpfs
``/tmp`` (``tmp_mb``, ``tmp_inodes``, nosuid, nodev) as the only writable place besides a 16 MiB
``/dev/shm``; memory = memory+swap = ``memory_mb``; ``pids``; CPU quota ``cpus``; user ``65534:65534``;
``cap_drop=ALL``; ``no-new-privileges``; ulimits ``nofile`` and ``fsize``; no host mounts except the supervisor
package (`toolgym.sandboxes.inside`), read-only; an environment of a few fixed variables. PID 1 is the supervisor in ``init`` mode rather
than docker's ``--init`` (see `toolgym.sandboxes.inside`).

What is covered: everything in the hostile-input suite (tests/sandboxes): fork/thread/memory bombs, CPU
spin, sleeps, floods, disk/inode/fd exhaustion, network egress and DNS, host sockets, writes outside the
work dir, host secrets, privilege escalation, killing the supervisor, setsid escapes, cross-session
isolation, a container killed mid-call; the host's wall clock (``timeout + grace_s``) as the last resort.
What is not covered: kernel exploits (containers share the host kernel; use gVisor or a VM for adversarial
code); seccomp is docker's default profile only if the daemon has one; a remote daemon (the supervisor package
is bind-mounted from this machine's file system); disk I/O bandwidth.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from toolgym.errors import InfrastructureError
from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.box import Box
from toolgym.sandboxes.channel import DockerExecChannel
from toolgym.sandboxes.inside import launch_args
from toolgym.sandboxes.limits import Limits

INSIDE = Path(__file__).with_name("inside")  # the supervisor package, mounted read-only
INSIDE_ROOT = "/opt/toolgym"
LABEL = "toolgym.sandbox"
OWNER = "toolgym.sandbox.owner"  # host:pid of the process whose pool made the container
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8:backslashreplace",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
_client_lock = threading.Lock()


@cache
def client(timeout: int = 60) -> Any:
    import docker

    return docker.from_env(timeout=timeout)


def docker_problem(image: str) -> str | None:
    """None when the daemon answers and ``image`` exists; otherwise what is wrong and what to do."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker Python package is missing: pip install 'toolgym[docker]'"
    try:
        cli = client()
        cli.ping()
    except Exception as exc:
        return (
            f"no docker daemon answers ({type(exc).__name__}); start dockerd or run scripts/setup_system.sh"
        )
    try:
        cli.images.get(image)
    except Exception:
        return f"the sandbox image {image} is missing; build it with `toolgym sandbox build`"
    return None


def container_kwargs(lim: Limits, name: str) -> dict[str, Any]:
    """The hardened settings of `containers.create` (also printed by `toolgym sandbox doctor`)."""
    from docker.types import Ulimit

    mem = f"{lim.memory_mb}m"
    extra = {"runtime": lim.runtime} if lim.runtime else {}
    return {
        **extra,
        "image": lim.image,
        "command": ["python3", *launch_args(INSIDE_ROOT, "init")],
        "name": name,
        "hostname": "sandbox",
        "detach": True,
        "network_mode": "bridge" if lim.network else "none",
        "read_only": True,
        "tmpfs": {
            "/tmp": f"rw,nosuid,nodev,size={lim.tmp_mb}m,nr_inodes={lim.tmp_inodes},mode=1777",
        },
        "shm_size": 16 << 20,
        "mem_limit": mem,
        "memswap_limit": mem,
        "pids_limit": lim.pids,
        "nano_cpus": int(lim.cpus * 1e9),
        "user": lim.user,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "ulimits": [
            Ulimit(name="nofile", soft=lim.nofile, hard=lim.nofile),
            Ulimit(name="fsize", soft=lim.fsize_mb << 20, hard=lim.fsize_mb << 20),
            Ulimit(name="core", soft=0, hard=0),
        ],
        "volumes": {str(INSIDE): {"bind": f"{INSIDE_ROOT}/inside", "mode": "ro"}},
        "environment": ENV,
        "working_dir": "/tmp",
        "labels": {LABEL: "1", OWNER: f"{socket.gethostname()}:{os.getpid()}"},
        "stop_signal": "SIGKILL",
    }


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self._prefix = f"toolgym-{uuid.uuid4().hex[:8]}"
        self._n = 0

    def describe(self) -> dict[str, Any]:
        kw = container_kwargs(self.limits, "x")
        keep = (
            "image",
            "network_mode",
            "read_only",
            "tmpfs",
            "shm_size",
            "mem_limit",
            "memswap_limit",
            "pids_limit",
            "nano_cpus",
            "user",
            "cap_drop",
            "security_opt",
        )
        info = {"backend": self.backend, **{k: kw[k] for k in keep}}
        info["runtime"] = self.limits.runtime or "default"
        info["ulimits"] = {u["Name"]: u["Hard"] for u in kw["ulimits"]}
        info["output_bytes"] = self.limits.output_bytes
        info["timeout_s"] = self.limits.timeout_s
        info["pool_size"] = self.limits.size
        return info

    def _new_box(self) -> Box:
        lim = self.limits
        cli = client()
        with _client_lock:
            self._n += 1
            name = f"{self._prefix}-{self._n}"
        try:
            container = cli.containers.run(**container_kwargs(lim, name))
        except Exception as exc:
            raise InfrastructureError(f"could not start a sandbox container from {lim.image}: {exc}") from exc

        def destroy() -> None:
            with contextlib.suppress(Exception):
                container.remove(force=True)

        try:
            cmd = [
                "python3",
                *launch_args(INSIDE_ROOT, "serve"),
                "--contained",
                "--scratch=/tmp",
                "--scratch=/dev/shm",
                "--scratch=/dev/mqueue",
                f"--max-output={lim.output_bytes}",
            ]
            cmd += [f"--preload={m}" for m in lim.preload]
            exec_id = cli.api.exec_create(
                container.id,
                cmd,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user=lim.user,
                workdir="/tmp",
                environment=ENV,
            )["Id"]
            sock = cli.api.exec_start(exec_id, socket=True)
            raw = getattr(sock, "_sock", sock)
        except Exception as exc:
            destroy()
            raise InfrastructureError(f"could not start the sandbox supervisor in {name}: {exc}") from exc

        def is_running() -> bool:
            container.reload()
            return bool(container.status == "running")

        box = Box(
            DockerExecChannel(raw), name=name, grace_s=lim.grace_s, is_running=is_running, destroy=destroy
        )
        deadline = time.monotonic() + 30
        while not box.ping():  # the first ping also proves the exec stream is wired up
            if time.monotonic() > deadline or box.broken:
                box.destroy()
                raise InfrastructureError(f"the sandbox supervisor in {name} did not answer")
        return box


def remove_leftovers() -> int:
    """Removes sandbox containers whose owning process (on this host) is gone; returns how many."""
    n = 0
    host = socket.gethostname()
    for c in client().containers.list(all=True, filters={"label": LABEL}):
        owner_host, _, pid = str(c.labels.get(OWNER, ":")).partition(":")
        if owner_host == host and pid.isdigit() and os.path.exists(f"/proc/{pid}"):
            continue  # a live pool's container
        try:
            c.remove(force=True)
            n += 1
        except Exception:
            pass
    return n
