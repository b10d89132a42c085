"""One task container and the persistent shell in it, for Terminal-v0.

What is covered: each episode gets its own container, started from the sandbox's hardened settings
(``toolgym.sandboxes.docker_backend.container_kwargs``: no network, all capabilities dropped but the three a
root shell needs to own and write files, no-new-privileges, memory = memory+swap, a pids cap, CPU quota,
nofile/fsize/core ulimits, a size-capped tmpfs ``/tmp``, no host mounts) with two changes a terminal task
needs: the root file system is writable (the container's own layer, removed with it at the end of the
episode) and the shell runs as root in it, as Harbor's tasks expect. Commands run in one ``bash`` that lives
for the episode (the working directory, variables and functions persist), each with a time limit: at the
limit every process of the shell's session but the shell is killed, and a shell still busy (a builtin loop)
is replaced by a fresh one. Output is cut to a size limit. Containers are started ahead of time (a warm
pool per image), so a reset only copies the task's files in and runs its setup.

What is not covered: the agent is root in its container, so it can change anything there, the verifier's
tools included (``bash``, ``python3``): the verifier runs in the same container after the episode, as in
Harbor, and a task whose reward matters against an adversarial policy needs a verifier that does not trust
the container. Processes left in the background keep running until the episode ends.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import io
import secrets
import shlex
import socket
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from toolgym.errors import InfrastructureError

ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    # fixed git dates: the same commands give the same commit ids (seeded determinism of transcripts)
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
    "PYTHONDONTWRITEBYTECODE": "1",
}
SHELL_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]


@dataclass(frozen=True)
class CommandResult:
    output: str
    exit_code: int | None  # None: killed at the time limit
    seconds: float
    timed_out: bool = False
    truncated: bool = False
    restarted: bool = False  # the shell was replaced (it exited, or was stuck after a timeout)


@dataclass(frozen=True)
class Resources:
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 256
    tmp_mb: int = 256


def _kwargs(image: str, res: Resources, workdir: str) -> dict[str, Any]:
    from toolgym.sandboxes.docker_backend import container_kwargs
    from toolgym.sandboxes.limits import Limits

    lim = Limits(
        image=image, memory_mb=res.memory_mb, cpus=res.cpus, pids=res.pids, tmp_mb=res.tmp_mb, nofile=1024
    ).updated(fsize_mb=512, tmp_inodes=65536)
    kw = container_kwargs(lim, f"toolgym-term-{uuid.uuid4().hex[:10]}")
    kw.update(
        command=["sleep", "infinity"],
        init=True,  # docker's init reaps what the shell's commands orphan
        read_only=False,
        cap_add=SHELL_CAPS,
        environment={**kw["environment"], **ENV},
        working_dir=workdir,
        hostname="task",
    )
    kw["tmpfs"] = {"/tmp": kw["tmpfs"]["/tmp"]}
    return kw


class _Stream:
    """A hijacked ``docker exec`` socket without a tty: 8-byte headers (stream id, size) before each piece;
    stdout and stderr are read alike (commands redirect stderr to stdout anyway)."""

    def __init__(self, sock: Any) -> None:
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.raw = bytearray()
        self.left = 0

    def send(self, data: bytes) -> None:
        self.sock.settimeout(10)
        self.sock.sendall(data)

    def read(self, timeout: float) -> bytes | None:
        """Some output; b"" at end of stream; None when nothing came within ``timeout``."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return None
        except OSError:
            return b""
        if not data:
            return b""
        self.raw += data
        out = bytearray()
        while self.raw:
            if self.left == 0:
                if len(self.raw) < 8:
                    break
                self.left = int.from_bytes(self.raw[4:8], "big")
                del self.raw[:8]
                continue
            piece = self.raw[: self.left]
            out += piece
            del self.raw[: len(piece)]
            self.left -= len(piece)
        return bytes(out)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class TaskContainer:
    """A started container and its shell. ``run`` executes one command; ``close`` removes the container."""

    def __init__(self, container: Any, workdir: str) -> None:
        self.container = container
        self.workdir = workdir
        self.shell: _Stream | None = None
        self.shell_pid = 0
        self.closed = False
        self.removal: threading.Thread | None = None  # the background removal close() started

    # ----- plumbing -----------------------------------------------------------------------------------
    def exec(self, cmd: list[str], timeout_s: float = 60.0, workdir: str | None = None) -> tuple[int, str]:
        """A one-off process (not the shell): exit code and output. For setup and verification."""
        wrapped = ["timeout", "-s", "KILL", f"{max(timeout_s, 1):g}", *cmd]
        try:
            code, out = self.container.exec_run(
                wrapped, user="0:0", workdir=workdir or self.workdir, environment=ENV, demux=False
            )
        except Exception as exc:
            raise InfrastructureError(f"docker exec in the task container failed: {exc}") from exc
        return int(code if code is not None else -1), (out or b"").decode("utf-8", "replace")

    def put_files(self, files: dict[str, bytes], root: str = "/") -> None:
        """Writes ``files`` (paths relative to ``root``) into the container."""
        if not files:
            return
        try:
            if not self.container.put_archive(root, tar_bytes(files)):
                raise InfrastructureError("docker refused the task files")
        except InfrastructureError:
            raise
        except Exception as exc:
            raise InfrastructureError(f"could not copy files into the task container: {exc}") from exc

    def prepare(self, files: dict[str, bytes], setup: str, timeout_s: float = 120.0) -> None:
        """Writes a task's ``files`` (paths relative to the working folder) and runs its ``setup`` (bash, in
        a subshell: nothing it sets stays in the shell), in one round trip of the warm shell."""
        parts = []
        if files:
            blob = base64.b64encode(tar_bytes(files)).decode()
            parts.append(f"printf %s {blob} | base64 -d | tar -x -C {shlex.quote(self.workdir)}")
        if setup.strip():
            parts.append(f"(cd {shlex.quote(self.workdir)} && set -e\n{setup}\n)")
        if not parts:
            return
        result = self.run(
            " && ".join(parts) + f"; s=$?; cd {shlex.quote(self.workdir)}; (exit $s)", timeout_s
        )
        if result.exit_code != 0:
            raise InfrastructureError(
                f"the task's files or setup failed ({result.exit_code}): {result.output[-500:]}"
            )

    def read_file(self, path: str) -> str | None:
        code, out = self.exec(["cat", path], timeout_s=10)
        return out if code == 0 else None

    # ----- the shell ------------------------------------------------------------------------------------
    def start_shell(self) -> None:
        from toolgym.sandboxes.docker_backend import client

        if self.shell is not None:
            self.shell.close()
        api = client().api
        try:
            exec_id = api.exec_create(
                self.container.id,
                ["setsid", "-w", "bash", "--noprofile", "--norc"],
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user="0:0",
                workdir=self.workdir,
                environment=ENV,
            )["Id"]
            self.shell = _Stream(api.exec_start(exec_id, socket=True))
        except Exception as exc:
            raise InfrastructureError(f"could not start a shell in the task container: {exc}") from exc
        first = self._send_and_wait("echo $$", 20.0)
        if first is None or not first[0].strip().isdigit():
            raise InfrastructureError(f"the task container's shell did not start: {first!r:.200}")
        self.shell_pid = int(first[0].strip())

    def _send_and_wait(
        self, command: str, timeout_s: float, limit: int = 1 << 20
    ) -> tuple[str, int, bool] | None:
        """Sends one command to the shell; (output, exit code, whether output was cut), or None at the time
        limit. Raises EOFError when the shell's stream ends (it exited)."""
        assert self.shell is not None
        nonce = secrets.token_hex(8)
        marker = f"\n__toolgym_done_{nonce} ".encode()
        encoded = base64.b64encode(command.encode()).decode()
        # the command arrives base64-encoded and runs through eval: no quote or heredoc in it can swallow the
        # marker line; stdin is /dev/null so it cannot read the protocol either
        line = f"eval \"$(printf %s {encoded} | base64 -d)\" </dev/null 2>&1; printf '\\n__toolgym_done_{nonce} %d\\n' $?\n"
        self.shell.send(line.encode())
        buf, cut = bytearray(), False
        deadline = time.monotonic() + timeout_s
        while True:
            at = buf.find(marker)
            if at >= 0:
                end = buf.find(b"\n", at + len(marker))
                if end >= 0:
                    code = int(buf[at + len(marker) : end] or b"-1")
                    return buf[:at].decode("utf-8", "replace"), code, cut
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            data = self.shell.read(min(left, 1.0))
            if data == b"":
                raise EOFError
            if data:
                buf += data
                if len(buf) > 2 * limit:  # keep the head and the tail (the marker comes last)
                    buf = buf[:limit] + b"\n[... output cut ...]\n" + buf[-limit:]
                    cut = True

    def _kill_session(self, include_shell: bool) -> None:
        pid = self.shell_pid
        keep = "" if include_shell else f" | grep -vx {pid}"
        with contextlib.suppress(InfrastructureError):
            self.exec(["bash", "-c", f"pgrep -s {pid}{keep} | xargs -r kill -9"], timeout_s=10)

    def run(self, command: str, timeout_s: float) -> CommandResult:
        """One command in the episode's shell, killed at ``timeout_s``."""
        if self.shell is None:
            self.start_shell()
        t0 = time.monotonic()
        try:
            got = self._send_and_wait(command, timeout_s)
        except EOFError:
            self.start_shell()
            return CommandResult("", None, time.monotonic() - t0, restarted=True)
        except OSError as exc:
            raise InfrastructureError(f"the task container's shell failed: {exc}") from exc
        if got is not None:
            return CommandResult(got[0], got[1], time.monotonic() - t0, truncated=got[2])
        self._kill_session(include_shell=False)
        restarted = False
        try:
            late = self._send_and_wait("true", 3.0)
        except EOFError:
            late = None
        if late is None:  # the shell itself is busy (a builtin loop): replace it
            self._kill_session(include_shell=True)
            self.start_shell()
            restarted = True
        return CommandResult("", None, time.monotonic() - t0, timed_out=True, restarted=restarted)

    def close(self, wait: bool = False) -> None:
        """Removes the container: in the background (an episode's end: a few hundred ms off the critical
        path), or now with ``wait``. Whatever is left at interpreter exit is removed then."""
        if self.closed:
            return
        self.closed = True
        if self.shell is not None:
            self.shell.close()
        if wait:
            _remove(self.container)
        else:
            self.removal = threading.Thread(target=_remove, args=(self.container,), daemon=True)
            self.removal.start()


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A tar of ``files`` (relative paths), with their folders; ``*.sh`` executable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


_LIVE: dict[str, Any] = {}  # containers this process started and has not removed yet, by id
_LIVE_LOCK = threading.Lock()


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)
    with _LIVE_LOCK:
        _LIVE.pop(container.id, None)


@atexit.register
def _remove_all() -> None:
    """At exit, the containers still here (background removals are daemon threads and die with us)."""
    with _LIVE_LOCK:
        left = list(_LIVE.values())
    threads = [threading.Thread(target=_remove, args=(c,), daemon=True) for c in left]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)


class ContainerPool:
    """Started containers of one image, kept ``spares`` ahead so that a reset does not wait for docker."""

    def __init__(self, image: str, resources: Resources, workdir: str, spares: int = 1) -> None:
        self.image, self.resources, self.workdir, self.spares = image, resources, workdir, spares
        self._ready: list[TaskContainer] = []  # started, each with its shell running
        self._lock = threading.Lock()
        self._filling = 0
        self._fillers: list[threading.Thread] = []
        self.closed = False

    def _start(self) -> Any:
        from toolgym.sandboxes.docker_backend import client

        try:
            container = client().containers.run(**_kwargs(self.image, self.resources, self.workdir))
        except Exception as exc:
            raise InfrastructureError(f"could not start a task container from {self.image}: {exc}") from exc
        with _LIVE_LOCK:
            _LIVE[container.id] = container
        return container

    def _started(self) -> TaskContainer:
        box = TaskContainer(self._start(), self.workdir)
        try:
            box.start_shell()
        except InfrastructureError:
            box.close()
            raise
        return box

    def _fill_one(self) -> None:
        box: TaskContainer | None
        try:
            box = self._started()
        except InfrastructureError:
            box = None
        with self._lock:
            self._filling -= 1
            if box is not None and not self.closed:
                self._ready.append(box)
                box = None
        if box is not None:
            box.close(wait=True)

    def _refill(self) -> None:
        with self._lock:
            need = self.spares - len(self._ready) - self._filling
            self._filling += max(need, 0)
        for _ in range(max(need, 0)):
            thread = threading.Thread(target=self._fill_one, daemon=True)
            self._fillers = [t for t in self._fillers if t.is_alive()] + [thread]
            thread.start()

    def take(self) -> TaskContainer:
        """A started container with a fresh shell (a warm one when there is one)."""
        with self._lock:
            box = self._ready.pop() if self._ready else None
        if box is None:
            box = self._started()
        self._refill()
        return box

    def close(self) -> None:
        """Removes the spare containers now (a container being started is removed when it is up)."""
        with self._lock:
            self.closed = True
            ready, self._ready = self._ready, []
        for box in ready:
            box.close(wait=True)
        for thread in self._fillers:
            thread.join(60)
