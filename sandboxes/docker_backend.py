"""The docker backend: one hardened container per box, the supervisor on a ``docker exec`` stream.

Container settings (each from `Limits`): ``network_mode=none``; read-only root file system; a tmpfs
``/tmp`` (``tmp_mb``, ``tmp_inodes``, nosuid, nodev) as the only place the code can write besides a 16 MiB
``/dev/shm``; memory = memory+swap = ``memory_mb``; ``pids``; CPU quota ``cpus``; ``cap_drop=ALL`` plus
the few capabilities the root supervisor needs to drop the code to its uid (``user``: by default a uid of
its own per box, leased host-wide by `toolgym.sandboxes.uids`, so boxes share no per-uid kernel limit) and to kill and
clean up after it; ``no-new-privileges``; ulimits ``nofile`` and ``fsize``; **no host mounts at all**: the
supervisor package is sent over the exec stream into a root-owned tmpfs (`toolgym.sandboxes.inside.BOOT`);
an environment of a few fixed variables. PID 1 is our own init (`toolgym.sandboxes.inside.INIT`).

What is covered and what is not: see docs/sandboxes.md ("Threat model"); each row has a test in
tests/sandboxes/.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from toolgym.errors import InfrastructureError
from toolgym.optional import available, not_installed, require
from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.box import Box
from toolgym.sandboxes.channel import DockerExecChannel
from toolgym.sandboxes.inside import INIT, boot_args, package_blobs
from toolgym.sandboxes.inside.frames import encode
from toolgym.sandboxes.limits import BOX_ENV, Limits
from toolgym.sandboxes.uids import lease_uid

INSIDE_ROOT = "/opt/toolgym"  # a root-owned tmpfs the supervisor package is written into at start
# What the root supervisor keeps (everything else is dropped; the code itself runs with none): change
# uid/gid to the code's, kill its processes, wipe what it wrote whatever the modes, protect itself and
# init from the OOM killer, read /proc/PID/syscall of a session's worker (`Server.idle`).
SUPERVISOR_CAPS = ["SETUID", "SETGID", "KILL", "DAC_OVERRIDE", "FOWNER", "SYS_PTRACE"]
OPTIONAL_CAPS = {"SYS_NICE": 23, "SYS_RESOURCE": 24}  # supervisor priority -10; OOM score -1000


def host_caps() -> int:
    """This machine's capability bounding set (bits)."""
    try:
        with open("/proc/self/status") as f:
            return int(f.read().split("CapBnd:")[1].split()[0], 16)
    except (OSError, IndexError, ValueError):
        return 0


def supervisor_caps() -> list[str]:
    """`SUPERVISOR_CAPS`, plus `OPTIONAL_CAPS` where this machine has them at all: runc refuses to start a
    container asking for a capability the host lacks."""
    have = host_caps()
    return SUPERVISOR_CAPS + [name for name, bit in OPTIONAL_CAPS.items() if have >> bit & 1]


GVISOR_HEADROOM_MB = 256  # container memory above memory_mb under gVisor (its sandbox kernel)
LABEL = "toolgym.sandbox"
OWNER = "toolgym.sandbox.owner"  # host:pid of the process whose pool made the container
_client_lock = threading.Lock()


@cache
def client(timeout: int = 60) -> Any:
    return require("docker", why="the docker sandbox backend talks to the daemon through it").from_env(
        timeout=timeout
    )


def docker_problem(image: str) -> str | None:
    """None when the daemon answers and ``image`` exists; otherwise what is wrong and what to do."""
    if not available("docker"):
        return str(not_installed("docker"))
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


def runtime_problem(runtime: str | None) -> str | None:
    """None when ``runtime`` (a docker runtime such as gVisor's ``runsc``; None: the default) is registered
    with the daemon; otherwise what is wrong and how to register it."""
    if not runtime:
        return None
    try:
        known = sorted(client().info().get("Runtimes") or {})
    except Exception as exc:
        return f"could not ask the docker daemon for its runtimes ({type(exc).__name__}: {exc})"
    if runtime in known:
        return None
    how = (
        "install gVisor (apt-get install runsc), add it to /etc/docker/daemon.json as "
        '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}} and reload '
        "the daemon (kill -HUP the dockerd process; running containers are not touched)"
        if runtime == "runsc"
        else 'register it in /etc/docker/daemon.json under "runtimes" and reload the daemon'
    )
    return f"the docker runtime {runtime!r} is not registered with this docker daemon (it has {known}): {how}"


def container_kwargs(lim: Limits, name: str) -> dict[str, Any]:
    """The hardened settings of `containers.create` (also printed by `toolgym sandbox doctor`)."""
    Ulimit = require("docker.types").Ulimit

    # gVisor has no OOM killer of its own: at the cgroup's limit the host kills the sandbox kernel, the
    # whole box (sandbox_error). There the code's processes get RLIMIT_AS = memory_mb (MemoryError: `oom`)
    # and the container room for the sandbox kernel on top.
    mem = f"{lim.memory_mb + (GVISOR_HEADROOM_MB if lim.runtime == 'runsc' else 0)}m"
    extra = {"runtime": lim.runtime} if lim.runtime else {}
    return {
        **extra,
        "image": lim.image,
        "command": ["python3", "-c", INIT],
        "name": name,
        "hostname": "sandbox",
        "detach": True,
        "network_mode": "bridge" if lim.network else "none",
        "read_only": True,
        "tmpfs": {
            "/tmp": f"rw,nosuid,nodev,size={lim.tmp_mb}m,nr_inodes={lim.tmp_inodes},mode=1777",
            INSIDE_ROOT: "rw,nosuid,nodev,noexec,size=4m,mode=755",
        },
        "shm_size": 16 << 20,
        "mem_limit": mem,
        "memswap_limit": mem,
        "pids_limit": lim.pids,
        "nano_cpus": int(lim.cpus * 1e9),
        "user": "0:0",  # init and the supervisor; the code runs as lim.user
        "cap_drop": ["ALL"],
        "cap_add": supervisor_caps(),
        "security_opt": ["no-new-privileges"],
        "ulimits": [
            Ulimit(name="nofile", soft=lim.nofile, hard=lim.nofile),
            Ulimit(name="fsize", soft=lim.fsize_mb << 20, hard=lim.fsize_mb << 20),
            Ulimit(name="core", soft=0, hard=0),
        ],
        "environment": BOX_ENV,
        "working_dir": "/tmp",
        "labels": {LABEL: "1", OWNER: f"{socket.gethostname()}:{os.getpid()}"},
        "stop_signal": "SIGKILL",
    }


_reaped = threading.Event()


@dataclass
class Removed:
    """What ``remove_orphans`` did: containers removed and other hosts' containers left, each by owner host
    ("?": a container with no owner label)."""

    by_host: dict[str, int] = field(default_factory=dict)
    left_by_host: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_host.values())


def remove_orphans(all_hosts: bool = False) -> Removed:
    """Removes the sandbox containers whose owning process is gone: this host's whose owner pid runs no more
    (one killed with its pool: SIGKILL, ``os._exit``, a Ray env worker that died; a clean exit removes its
    own). Other hosts' containers on a shared daemon, and those with no owner label, are left (and counted):
    their pids mean nothing here, so nothing here can tell their owners are dead. ``all_hosts`` removes them
    too, for a person who knows those hosts' runs are over. A live owner's container on this host always
    stays."""
    out = Removed()
    host = socket.gethostname()
    for c in client().containers.list(all=True, filters={"label": LABEL}):
        owner_host, _, pid = str(c.labels.get(OWNER, ":")).partition(":")
        here = owner_host == host and pid.isdigit()
        if here and os.path.exists(f"/proc/{pid}"):
            continue  # a live pool's container
        key = owner_host or "?"
        if not here and not all_hosts:
            out.left_by_host[key] = out.left_by_host.get(key, 0) + 1
            continue
        with contextlib.suppress(Exception):  # (gone meanwhile: another sweep removed it)
            c.remove(force=True)
            out.by_host[key] = out.by_host.get(key, 0) + 1
    return out


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        if not _reaped.is_set():  # once a process: what crashed runs before it left on this host
            _reaped.set()
            # (a daemon that does not answer fails the first box, clearly)
            with contextlib.suppress(Exception):
                remove_orphans()
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
            "cap_drop",
            "cap_add",
            "security_opt",
        )
        info = {"backend": self.backend, **{k: kw[k] for k in keep}}
        info["code_user"] = (
            "a uid of its own per box (200000-299999)" if self.limits.user == "box" else self.limits.user
        )
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

        lease = lease_uid() if lim.user == "box" else None

        def destroy() -> None:
            with contextlib.suppress(Exception):
                container.remove(force=True)
            if lease is not None:  # only once nothing runs under it any more
                lease.release()

        if lease is not None:
            uid = gid = str(lease.uid)
        else:
            uid, _, gid = lim.user.partition(":")
        try:
            cmd = [
                "python3",
                *boot_args(INSIDE_ROOT),
                "serve",
                "--contained",
                f"--uid={uid}",
                f"--gid={gid or uid}",
                "--scratch=/tmp",
                "--scratch=/dev/shm",
                "--scratch=/dev/mqueue",
                f"--max-output={lim.output_bytes}",
            ]
            cmd += [f"--preload={m}" for m in lim.preload]
            if lim.runtime == "runsc":
                cmd.append(f"--limit=RLIMIT_AS={lim.memory_mb << 20}")
            exec_id = cli.api.exec_create(
                container.id,
                cmd,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user="0:0",
                workdir="/tmp",
                environment=BOX_ENV,
            )["Id"]
            sock = cli.api.exec_start(exec_id, socket=True)
            raw = getattr(sock, "_sock", sock)
            channel = DockerExecChannel(raw)
            channel._send(encode({}, package_blobs()))
        except Exception as exc:
            destroy()
            raise InfrastructureError(f"could not start the sandbox supervisor in {name}: {exc}") from exc

        def is_running() -> bool:
            container.reload()
            return bool(container.status == "running")

        box = Box(channel, name=name, grace_s=lim.grace_s, is_running=is_running, destroy=destroy)
        deadline = time.monotonic() + 30
        while not box.ping():  # the first ping also proves the exec stream is wired up
            if time.monotonic() > deadline or box.broken:
                box.destroy()
                raise InfrastructureError(f"the sandbox supervisor in {name} did not answer")
        return box
