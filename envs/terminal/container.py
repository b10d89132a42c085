"""One task container, the agent's shell in it and the root warden beside it, for Terminal-v0.

What is covered: each episode gets its own container, started from the sandbox's hardened settings
(``toolgym.sandboxes.docker_backend.container_kwargs``: no network, all capabilities dropped but the few
root needs to own, signal and drop privileges, no-new-privileges, memory = memory+swap, a pids cap, CPU
quota, nofile/fsize/core ulimits, a size-capped tmpfs ``/tmp``, no host mounts) with a writable root file
system (the container's own layer, removed with it at the end of the episode) that the agent cannot write:
every folder it writes is a size-capped tmpfs counted in the container's memory (no disk quota exists for a
container's layer, and the host's disk is every episode's and the trainer's).

Who is who: the agent's shell runs as an unprivileged user (``agent``, a host uid of this container's own,
leased from ``toolgym.sandboxes.uids`` like the code sandbox's boxes, no capabilities, no way to gain any), in its working folder (owned by it) with ``HOME=/home/agent``. System folders, ``/tests``
and ``/logs`` stay root's: ``/tests`` and ``/logs`` are root-owned tmpfs mounts (mode 755), so the agent can
write neither and a full disk cannot stop the verifier from writing its reward. Beside the agent's shell a
root ``bash`` (the warden) is started with the container, before any agent process: it writes the task's
files, runs its setup, and at the end of the episode kills every process of the agent's uid with bash
builtins only (no fork: a fork bomb cannot starve it), until none is left. ``verify`` runs only then: the
container holds no agent process, ``/logs/verifier`` and ``/tests`` are made afresh by root, and the
verifier runs as root with a fixed environment (system ``PATH`` only, ``HOME=/root``) from ``/``.

Commands run in one ``bash`` that lives for the episode (the working directory, variables and functions
persist), each with a time limit: at the limit every process of the shell's session but the shell is
killed, and a shell still busy (a builtin loop) is replaced by a fresh one (after the warden has killed every
agent process, should the container have no process slot left). A shell that exited is replaced; one that
died or had no fd or process left before a command started runs it in its replacement. A command that closes
or redirects its shell's stdout/stderr gets them back after it. Output is cut to a size limit. After the
start, root does everything through the warden (no ``docker exec``: one that failed to start read as a
verifier that wrote no reward). Containers are
started ahead of time (a warm pool per image), so a reset only copies the task's files in and runs its setup.

What is not covered: a verifier that runs the agent's programs as root hands them root (the built-in tasks
run their checks as the agent's uid; see ``tasks.TEST_SH`` and ``TOOLGYM_AGENT_UID``); a check can be
fooled by a program of the agent that fakes what the check looks at (that is the check's strength, not the
container's). Processes left in the background keep running until the episode ends. On cgroup v1 (no count
of the times a cgroup reached its limit) a host-wide OOM kill is told from the agent's own only until the
container's usage first came near its limit: after that every kill reads as the agent's (``host_oom_kills``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import io
import re
import secrets
import shlex
import socket
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError

# The agent's shell and everything it starts run as a uid of the container's own (``TaskContainer.uid``),
# and the built-in checks' real uid is a second one (``checks_uid``), both leased host-wide: per-uid kernel
# limits (inotify instances and watches, pipe buffer pages, message queue bytes, RLIMIT_NPROC) are counted
# by host uid across containers, so with one shared uid an episode could use up another's (128 inotify
# instances in one container left none to every other, and to the host's user of that uid).
AGENT_HOME = "/home/agent"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV = {  # root's processes (setup, verifier): system folders only, none of them the agent's
    "PATH": SYSTEM_PATH,
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
AGENT_ENV = {
    **{k: v for k, v in ENV.items() if k != "PIP_ROOT_USER_ACTION"},
    "HOME": AGENT_HOME,
    "USER": "agent",
    "LOGNAME": "agent",
    "PATH": f"{SYSTEM_PATH}:{AGENT_HOME}/.local/bin",  # pip's user installs put console scripts there
}
# root's, never the agent's (a non-root exec has an empty capability set and no-new-privileges keeps it so):
# own and write the task's files, kill the agent's processes, drop to the agent's uid in a verifier
SHELL_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"]
# top-level folders that must stay root's: a task whose working folder is one of them is refused
SYSTEM_DIRS = frozenset(
    [
        "bin",
        "boot",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "logs",
        "proc",
        "root",
        "run",
        "sbin",
        "sys",
        "tests",
        "usr",
    ]
)

# the warden's functions: bash builtins only (glob, read, kill, printf), so they work with no pid left
WARDEN_PRELUDE = r"""
exec 7< <(exec sleep infinity)
__tg_pids() {
  local p k v s r
  __tg=()
  for p in /proc/[0-9]*; do
    s='' r=''
    while read -r k v _; do
      case $k in State:) s=$v ;; Uid:) r=$v; break ;; esac
    done 2>/dev/null < "$p/status"
    [[ $r == "$1" && $s != Z && $s != X ]] && __tg+=("${p#/proc/}")
  done
}
__tg_reap() {
  local i
  for ((i = 0; i < 200; i++)); do
    __tg_pids "$1"
    ((${#__tg[@]})) || return 0
    kill -9 "${__tg[@]}" 2>/dev/null
    ((i < 3)) || read -r -t 0.02 -u 7
  done
  return 1
}
__tg_mem() {  # the container's memory cgroup: "<times at its own limit> <processes OOM-killed>", or "none"
  # (cgroup v1 has no count of the times: -1 once its usage ever came within 1 MiB of a limit, or failed at one)
  local k v l=0 n=0 m x p c=/sys/fs/cgroup
  if [[ -r $c/memory.events ]]; then
    while read -r k v; do case $k in oom) l=$v ;; oom_kill) n=$v ;; esac; done < $c/memory.events
  elif [[ -r $c/memory/memory.oom_control ]]; then
    while read -r k v; do [[ $k == oom_kill ]] && n=$v; done < $c/memory/memory.oom_control
    for p in memory memory.memsw; do
      m=0 x=0 v=0
      { read -r m < $c/memory/$p.limit_in_bytes; read -r x < $c/memory/$p.max_usage_in_bytes
        read -r v < $c/memory/$p.failcnt; } 2>/dev/null
      ((v > 0 || (m > 0 && x + 1048576 >= m))) && l=-1
    done
  else
    printf 'none\n'; return 0
  fi
  printf '%s %s\n' "$l" "$n"
}
__tg_sess() {  # the processes of uid $1 in session $2, but pid $3 (the shell, or none)
  local i p line f k
  for ((i = 0; i < 100; i++)); do
    __tg_pids "$1"
    k=()
    for p in "${__tg[@]}"; do
      { read -r line < "/proc/$p/stat"; } 2>/dev/null || continue
      line=${line##*) }
      f=($line)
      [[ ${f[3]} == "$2" && $p != "$3" ]] && k+=("$p")
    done
    ((${#k[@]})) || return 0
    kill -9 "${k[@]}" 2>/dev/null
    ((i < 3)) || read -r -t 0.02 -u 7
  done
  return 1
}
"""
# bash as the shells start it: stderr joins stdout (one pipe: the output keeps its order), and fd 63 keeps the
# protocol's stdout so that a command that closes or redirects its shell's stdout or stderr (``exec >&-``)
# gets them back after it (see ``_Shell.send_and_wait``)
SHELL_ARGV = ["bash", "--noprofile", "--norc", "-c"]
SHELL_FDS = "exec 63>&1 2>&1"
BROKEN = 256  # the wrapper's exit code when the shell could not even decode the command (no fork, no fd)
MAX_COMMAND_BYTES = 4 << 20  # bash reads its input one byte at a time: a longer command is refused


@dataclass(frozen=True)
class CommandResult:
    output: str
    exit_code: int | None  # None: killed at the time limit
    seconds: float
    timed_out: bool = False
    truncated: bool = False
    restarted: bool = False  # the shell was replaced (it exited, or was stuck after a timeout)
    broken: bool = False  # the shell could not start the command (no process or fd left): replaced
    rerun: bool = False  # the command never started in its shell: it ran in a fresh one


@dataclass(frozen=True)
class Resources:
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 256
    tmp_mb: int = 256
    disk_mb: int = 512  # the agent's working folder (its home gets half): tmpfs, on top of memory_mb


SMALL_TMPFS_MB = 16  # /var/tmp, /run/lock: the image's world-writable folders
SOLUTION_MB = 64  # /solution (the agent's; root stages the solution there when the expert plays)
SOLUTION_DIR = "/solution"
SHM_MB = 16  # /dev/shm (``container_kwargs``'s shm_size)
# the verifier's stdout and stderr: a root-only tmpfs of its own (a verbose verifier cannot fill /logs, where
# its reward goes, nor the reward's writing fill this)
VERIFIER_DIR = "/run/toolgym"
VERIFIER_OUT = f"{VERIFIER_DIR}/verifier.out"


def _kwargs(image: str, res: Resources, workdir: str, seed_bytes: int = 0) -> dict[str, Any]:
    from toolgym.sandboxes.docker_backend import container_kwargs
    from toolgym.sandboxes.limits import Limits

    # every folder the agent can write is a size-capped tmpfs, never the container's layer on the host's disk
    # (no per-container quota there: the agent could fill the disk the other episodes and the trainer use);
    # the tmpfs pages count in the container's memory, so the limit grows by their caps
    home_mb = max(res.disk_mb // 2, 16)
    work_mb = res.disk_mb + (seed_bytes >> 20)  # the image's own files there come on top of the agent's room
    # every tmpfs the agent can fill is on top of memory_mb: with all of them full, the verifier still has it
    memory = res.memory_mb + work_mb + home_mb + 2 * SMALL_TMPFS_MB + SOLUTION_MB + res.tmp_mb + SHM_MB
    lim = Limits(
        image=image, memory_mb=memory, cpus=res.cpus, pids=res.pids, tmp_mb=res.tmp_mb, nofile=1024
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
    # root's, and apart from the disk: the agent cannot write them, nor fill the disk under the reward
    small = f"rw,nosuid,nodev,size={SMALL_TMPFS_MB}m,nr_inodes=4096"
    kw["tmpfs"] = {
        "/tmp": kw["tmpfs"]["/tmp"],
        "/logs": "rw,nosuid,nodev,size=16m,mode=755",
        VERIFIER_DIR: "rw,nosuid,nodev,noexec,size=16m,mode=700",
        # exec: a task's compiled checker or script in tests/ runs (docker's tmpfs default is noexec)
        "/tests": "rw,exec,nosuid,nodev,size=64m,mode=755",
        # the agent's (chowned at start; the image's working folder is copied in: ``image_workdir``)
        workdir: f"rw,exec,nosuid,nodev,size={work_mb}m,nr_inodes=262144,mode=755",
        AGENT_HOME: f"rw,exec,nosuid,nodev,size={home_mb}m,nr_inodes=131072,mode=755",
        "/solution": f"rw,exec,nosuid,nodev,size={SOLUTION_MB}m,nr_inodes=16384,mode=755",
        "/var/tmp": f"{small},mode=1777",
        "/run/lock": f"{small},mode=1777",
    }
    return kw


def image_workdir(image: str, workdir: str) -> bytes | None:
    """The image's working folder as a tar (docker's ``get_archive`` of a created, never started container:
    the tmpfs mounted there at run time hides it), or None when the image has none."""
    from toolgym.sandboxes.docker_backend import client

    try:
        box = client().containers.create(image, command=["true"], network_mode="none")
    except Exception as exc:
        raise InfrastructureError(f"could not create a container from {image}: {exc}") from exc
    try:
        chunks, _ = box.get_archive(workdir)
        return b"".join(chunks)
    except Exception as exc:
        if type(exc).__name__ == "NotFound":
            return None
        raise InfrastructureError(f"could not read {workdir} of {image}: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            box.remove(force=True)


def check_workdir(workdir: str) -> None:
    """The agent owns its working folder: one that is, or is under, a system folder is refused."""
    parts = [p for p in workdir.split("/") if p]
    odd = any(ord(c) < 32 or c == "\x7f" for c in workdir)  # a newline in a mount spec, a shell line…
    if not workdir.startswith("/") or not parts or parts[0] in SYSTEM_DIRS or ".." in parts or odd:
        raise ConfigError(
            f"the working folder {workdir!r} must be an absolute path outside the system folders "
            f"({', '.join(sorted(SYSTEM_DIRS))}): the agent (an unprivileged user) owns it"
        )


class _Stream:
    """A hijacked ``docker exec`` socket without a tty: 8-byte headers (stream id, size) before each piece;
    stdout and stderr are read alike (the shells send stderr to stdout anyway)."""

    def __init__(self, sock: Any) -> None:
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.raw = bytearray()
        self.left = 0

    def send(self, data: bytes, timeout_s: float = 10.0) -> None:
        """Raises OSError (TimeoutError) when the other end does not take ``data`` within ``timeout_s``."""
        self.sock.settimeout(timeout_s)
        self.sock.sendall(data)

    def read(self, timeout: float) -> bytes | None:
        """Some output; b"" at end of stream; None when no output came within ``timeout``. A piece of a
        header alone (a read can end anywhere in the stream) is not output yet, and not the end either:
        taking it for the end had a live shell replaced and its command's output lost."""
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
        return bytes(out) if out else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _exit_code(buf: bytearray, marker: bytes) -> tuple[int, int] | None:
    """(where the marker starts, the exit code after it) for the first complete marker line in ``buf``. A
    marker line with anything but a number after it (the command printed it: a DEBUG trap can read the
    nonce) is output, not the end."""
    at = buf.find(marker)
    while at >= 0:
        end = buf.find(b"\n", at + len(marker))
        if end < 0:
            return None
        digits = bytes(buf[at + len(marker) : end])
        if digits.isdigit() and len(digits) < 6:
            return at, int(digits)
        at = buf.find(marker, at + 1)
    return None


@dataclass(frozen=True)
class MemoryEvents:
    """The container's memory cgroup counters: how often it reached its own limit (cgroup v2 ``oom``; -1 on
    v1, which counts no such thing, once its peak usage came within 1 MiB of its memory or memory+swap limit
    or a charge failed there) and how many of its processes an OOM killer killed (``oom_kill``)."""

    at_limit: int
    oom_kills: int


def host_oom_kills(before: MemoryEvents | None, after: MemoryEvents | None) -> int:
    """How many processes of the container the kernel killed for memory that the container did not use up:
    kills while it never reached its own limit are a host-wide (or a parent cgroup's) OOM, not the agent's
    doing. Within the container's own limit the agent's processes go first (oom_score_adj 1000, and every
    tmpfs it can fill is on top of the memory the rest needs): a kill then is the agent's hog's. 0 when the
    counters are unknown (no memory cgroup to read)."""
    if before is None or after is None or after.at_limit != before.at_limit or after.at_limit < 0:
        return 0
    return max(after.oom_kills - before.oom_kills, 0)


class ShellExited(EOFError):
    """The shell's stream ended; ``started``: whether the command had started (its start line came)."""

    def __init__(self, started: bool) -> None:
        super().__init__("the shell exited")
        self.started = started


class _Shell:
    """A ``bash`` in the container over a hijacked ``docker exec`` socket, with the marker protocol."""

    def __init__(
        self,
        container_id: str,
        user: str,
        workdir: str,
        env: dict[str, str],
        prefix: str = "",
        launcher: str = "",
    ) -> None:
        from toolgym.sandboxes.docker_backend import client

        api = client().api
        argv = [*SHELL_ARGV, f"{prefix}{SHELL_FDS}; exec {launcher}bash --noprofile --norc"]
        try:
            exec_id = api.exec_create(
                container_id,
                argv,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user=user,
                workdir=workdir,
                environment=env,
            )["Id"]
            self.stream = _Stream(api.exec_start(exec_id, socket=True))
        except Exception as exc:
            raise InfrastructureError(f"could not start a shell in the task container: {exc}") from exc
        try:  # (raw: nothing of the wrapper, which needs base64, is known to work yet)
            first = self.send_and_wait('printf "%s %s\\n" "$$" "$(command -v base64)"', 20.0, raw=True)
        except (EOFError, OSError) as exc:  # docker could not start it (no process slot left, …)
            self.stream.close()
            raise InfrastructureError(f"the task container's shell did not start: {exc!r}") from exc
        words = first[0].split() if first is not None else []
        if len(words) != 2 or not words[0].isdigit() or not words[1].startswith("/"):
            self.stream.close()
            raise InfrastructureError(f"the task container's shell did not start: {first!r:.200}")
        self.pid, self.base64 = int(words[0]), words[1]

    def send_and_wait(
        self, command: str, timeout_s: float, limit: int = 1 << 20, raw: bool = False, earlier: bytes = b""
    ) -> tuple[str, int, bool] | None:
        """Sends one command; (output, exit code, whether output was cut), or None at the time limit.
        Raises EOFError when the shell's stream ends (it exited), OSError when it does not take the command.

        ``raw``: our own line, sent as is (the warden's builtins, which must not fork). Otherwise the command
        arrives base64-encoded, decoded by the system's base64 (by its path: no function or PATH of the
        agent's reaches it) and runs through eval with stdin /dev/null (no quote or heredoc in it can swallow
        the marker line, and it cannot read the protocol); fd 63 (the protocol's stdout) is closed for it
        and stdout and stderr are set back from it afterwards (a command that closed them does not hide the
        marker). Exit code ``BROKEN``: the shell could not decode the command (no process or fd left).
        ``self.started``: whether the command's start line came (it began to run); ``self.saw_earlier``:
        whether ``earlier`` (a previous command's start line, late) came before this command's end."""
        nonce = secrets.token_hex(8)
        self.started = self.saw_earlier = False
        marker = f"\n__toolgym_done_{nonce} ".encode()
        start = b"" if raw else f"\n__toolgym_start_{nonce}\n".encode()
        self.start = start
        if raw:
            line = f"{command}\nprintf '\\n__toolgym_done_{nonce} %d\\n' $?\n"
        else:
            encoded = base64.b64encode(command.encode("utf-8", "surrogatepass")).decode()
            # (the line starts with an assignment: after a syntax error in eval, bash takes a line's first
            # word for a command, so a line that started with ``if`` was a syntax error that ended the shell)
            line = (
                # a shell with no fd left (``ulimit -n 3``) exits at a command substitution: a builtin
                # opens one first, and the command is not run (BROKEN)
                f"__tg_s={BROKEN}; if {{ exec {{__tg_fd}}</dev/null; }} 2>/dev/null && exec {{__tg_fd}}<&- && "
                f"__tg_c=$(printf %s {encoded} | {self.base64} -d && printf .); then "
                f"printf '\\n__toolgym_start_{nonce}\\n'; "
                f'eval "${{__tg_c%.}}" </dev/null 63>&- 2>&1; __tg_s=$?; fi; '
                f"exec 1>&63 2>&1; printf '\\n__toolgym_done_{nonce} %d\\n' \"$__tg_s\"\n"
            )
        payload = line.encode()
        self.stream.send(payload, 10.0 + len(payload) / 200_000)  # bash reads its input a byte at a time
        buf, cut = bytearray(), False
        deadline = time.monotonic() + timeout_s
        while True:
            found = _exit_code(buf, marker)
            if found is not None:
                self.saw_earlier = bool(earlier) and earlier in buf[: found[0]]
                at = buf.find(start, 0, found[0]) if start else -1
                head = at + len(start) if at >= 0 else 0  # (before the start line: the wrapper's own errors)
                return buf[head : found[0]].decode("utf-8", "replace"), found[1], cut
            left = deadline - time.monotonic()
            if left <= 0:
                self.started = bool(start) and start in buf  # (the head, where it is, survives a cut)
                return None
            data = self.stream.read(min(left, 1.0))
            if data == b"":
                raise ShellExited(bool(start) and start in buf)
            if data:
                buf += data
                if len(buf) > 2 * limit:  # keep the head and the tail (the marker comes last)
                    buf = buf[:limit] + b"\n[... output cut ...]\n" + buf[-limit:]
                    cut = True

    def close(self) -> None:
        self.stream.close()


class TaskContainer:
    """A started container, its root warden and the agent's shell. ``run`` executes one agent command;
    ``kill_agent`` kills every agent process; ``verify`` runs a verifier; ``close`` removes the container.

    Everything root does after the start goes through the warden's shell (no ``docker exec``): a fault of
    it raises ``InfrastructureError``, never reads as a missing file or a failed verifier (a ``docker exec``
    that could not start, or whose exit code was not in yet, had been taken for a verifier that wrote no
    reward: a solved episode scored 0)."""

    def __init__(
        self, container: Any, workdir: str, seed: bytes | None = None, uids: tuple[Any, Any] | None = None
    ) -> None:
        """``uids``: the leases (``sandboxes.uids.UidLease``) of the agent's uid and the checks' uid, held
        until the container is removed; None leases them here."""
        from toolgym.sandboxes.uids import lease_uid

        if uids is None:
            try:
                uids = (lease_uid(), lease_uid())
            except OSError as exc:
                raise InfrastructureError(f"no uid for the task container's agent: {exc}") from exc
        self.leases = uids
        self.uid, self.checks_uid = uids[0].uid, uids[1].uid
        # root's environment (warden, setup, verifier): whom a verifier drops to for the agent's programs
        self.root_env = {
            **ENV,
            "TOOLGYM_AGENT_UID": str(self.uid),
            "TOOLGYM_CHECKS_UID": str(self.checks_uid),
        }
        self.container = container
        self.workdir = workdir
        self.seed = seed  # the image's working folder (a tar from ``image_workdir``), copied into its tmpfs
        self.warden: _Shell | None = None
        self.agent: _Shell | None = None
        self.closed = False
        self.removal: threading.Thread | None = None  # the background removal close() started
        self.pids_limit = Resources().pids  # the container's process slots (the pool sets its own)
        self.memory: MemoryEvents | None = None  # the counters when last read (``check_memory``)

    # ----- plumbing -----------------------------------------------------------------------------------
    def _root(self, command: str, timeout_s: float = 120.0, raw: bool = False) -> tuple[int, str]:
        """A command in the warden (root bash, from ``/``): exit code and output."""
        if self.warden is None:
            raise InfrastructureError("the task container has no warden (start it first)")
        try:
            got = self.warden.send_and_wait(command, timeout_s, raw=raw)
        except (EOFError, OSError) as exc:
            raise InfrastructureError(f"the task container's root shell failed: {exc!r}") from exc
        if got is None:
            raise InfrastructureError(f"a root command in the task container ran past {timeout_s:g} s")
        if got[1] == BROKEN:
            raise InfrastructureError(
                f"the task container's root shell could not run a command: {got[0]:.300}"
            )
        return got[1], got[0]

    def _untar(self, files: dict[str, bytes], folder: str) -> str:
        """A warden command that writes ``files`` (bytes, as they are) under ``folder``, tmpfs mounts
        included. The tar goes in through docker's archive API (a root-only file in the container's layer,
        which the command removes), not through the shell's input: bash reads that a byte at a time, and a
        test fixture or a solution may be megabytes."""
        if not files:
            return "true"
        return self._extract(tar_bytes(files), folder, "--no-same-owner ")

    def _extract(self, data: bytes, folder: str, options: str = "") -> str:
        """A warden command that extracts the tar ``data`` under ``folder`` (see ``_untar``)."""
        name = f".toolgym-stage-{secrets.token_hex(8)}.tar"
        outer = io.BytesIO()
        with tarfile.open(fileobj=outer, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o600, 0, 0
            tar.addfile(info, io.BytesIO(data))
        try:
            ok = self.container.put_archive("/", outer.getvalue())
        except Exception as exc:
            raise InfrastructureError(f"could not copy files into the task container: {exc}") from exc
        if not ok:
            raise InfrastructureError("could not copy files into the task container")
        return (
            f"{{ tar {options}-x -C {shlex.quote(folder)} -f /{name}; __tg_x=$?; rm -f /{name}; "
            "(exit $__tg_x); }"
        )

    def stage_solution(self, files: dict[str, bytes]) -> None:
        """The task's ``solution/`` folder in ``SOLUTION_DIR``, root's and readable by the agent (the expert
        plays it: its one command runs ``solve.sh`` there, whatever its size)."""
        d = SOLUTION_DIR
        code, out = self._root(
            f"(set -e; find {d} -mindepth 1 -delete; {self._untar(files, d)}; chown -R 0:0 {d}; "
            f"chmod -R a+rX,go-w {d}) 2>&1",
            120.0,
        )
        if code != 0:
            raise InfrastructureError(f"could not stage the task's solution ({code}): {out[-500:]}")

    def start(self) -> None:
        """The warden, the agent's account and folders, then the agent's shell."""
        self.warden = _Shell(self.container.id, "0:0", "/", self.root_env)
        self._root(WARDEN_PRELUDE, 20.0)
        uid, wd = self.uid, shlex.quote(self.workdir)
        if self.seed:  # (a tar of the folder itself: extracted in its parent)
            parent = shlex.quote(self.workdir.rstrip("/").rsplit("/", 1)[0] or "/")
            code, out = self._root(f"{self._extract(self.seed, parent)} 2>&1", 120.0)
            if code != 0:
                raise InfrastructureError(f"could not copy the image's {self.workdir} ({code}): {out[-500:]}")
        code, out = self._root(
            f"""(set -e
getent passwd {uid} >/dev/null || echo 'agent:x:{uid}:{uid}:agent:{AGENT_HOME}:/bin/bash' >> /etc/passwd
getent group {uid} >/dev/null || echo 'agent:x:{uid}:' >> /etc/group
getent passwd {self.checks_uid} >/dev/null || echo 'checks:x:{self.checks_uid}:{uid}::/nonexistent:/bin/false' >> /etc/passwd
mkdir -p {AGENT_HOME} /solution {wd}
chown -R {uid}:{uid} {AGENT_HOME} /solution {wd}
chown 0:0 /logs /tests && chmod 755 /logs /tests && mkdir -m 755 -p /logs/verifier) 2>&1""",
            60.0,
        )
        if code != 0:
            raise InfrastructureError(f"could not set up the agent's account ({code}): {out[-500:]}")
        self.start_shell()

    def prepare(self, files: dict[str, bytes], setup: str, timeout_s: float = 120.0) -> None:
        """Writes a task's ``files`` (paths relative to the working folder) and runs its ``setup`` (bash, as
        root, in a subshell in the working folder), then gives the working folder to the agent; one round
        trip of the warden."""
        parts = []
        if files:
            parts.append(self._untar(files, self.workdir))
        if setup.strip():
            parts.append(f"(cd {shlex.quote(self.workdir)} && set -e\n{setup}\n)")
        if not parts:
            return
        parts.append(f"chown -R {self.uid}:{self.uid} {shlex.quote(self.workdir)}")
        code, out = self._root(" && ".join(parts) + " 2>&1", timeout_s)
        if code != 0:
            raise InfrastructureError(f"the task's files or setup failed ({code}): {out[-500:]}")

    def read_file(self, path: str, limit: int = 1 << 16) -> str | None:
        """The last ``limit`` bytes of a regular file (read by root), or None when there is none."""
        p = shlex.quote(path)
        code, out = self._root(f"[ -f {p} ] && [ ! -L {p} ] && tail -c {int(limit)} -- {p}", 30.0)
        return out if code == 0 else None

    def memory_events(self) -> MemoryEvents | None:
        """The container's memory counters (the warden's builtins: no fork), None when there are none."""
        _, out = self._root("__tg_mem", 30.0, raw=True)
        words = out.split()
        if len(words) != 2 or not all(w.lstrip("-").isdigit() for w in words):
            return None
        return MemoryEvents(int(words[0]), int(words[1]))

    def check_memory(self) -> None:
        """Raises ``InfrastructureError`` when the kernel OOM-killed a process of the container since the last
        check while the container stayed within its own limit (the host, not the agent, ran out of memory:
        whatever it killed, the agent's or root's, the episode is not the agent's to score)."""
        now = self.memory_events()
        killed = host_oom_kills(self.memory, now)
        self.memory = now
        if killed:
            raise InfrastructureError(
                f"the host ran out of memory: the kernel killed {killed} process(es) of the task container "
                "while it was within its own memory limit"
            )

    # ----- the agent's shell ---------------------------------------------------------------------------
    def start_shell(self) -> None:
        """A fresh agent shell; when the container has no process slot left (a fork bomb), the warden first
        kills every agent process."""
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        # the agent's processes go first when the container runs out of memory, not the warden; setsid: a
        # session of its own, which a timed-out command's processes are killed by
        # docker starts it in / and it moves to the working folder: one the agent made unreadable to itself
        # (chmod 000) would fail docker's start, and every later command with it
        wd = shlex.quote(self.workdir)
        prefix = f"echo 1000 > /proc/self/oom_score_adj 2>/dev/null; cd -- {wd} 2>/dev/null || cd {AGENT_HOME} 2>/dev/null; "
        launcher, user = "setsid -w ", f"{self.uid}:{self.uid}"
        try:
            self.agent = _Shell(self.container.id, user, "/", AGENT_ENV, prefix, launcher)
        except InfrastructureError:
            if self.warden is None or self.kill_agent() != 0:
                raise
            self.agent = _Shell(self.container.id, user, "/", AGENT_ENV, prefix, launcher)

    @property
    def shell_pid(self) -> int:
        return self.agent.pid if self.agent is not None else 0

    def _kill_session(self, include_shell: bool) -> None:
        """Kills the processes of the agent shell's session (but the shell, unless ``include_shell``): the
        warden's builtins, which work with no process slot left."""
        pid = self.shell_pid
        if pid:
            keep = "0" if include_shell else str(pid)
            self._root(f"__tg_sess {self.uid} {pid} {keep}", 30.0, raw=True)

    def run(self, command: str, timeout_s: float, retry: bool = True) -> CommandResult:
        """``command`` (see ``_run``), then the memory check: a process of the container killed by a host-wide
        out-of-memory while the command ran is an ``InfrastructureError`` (``check_memory``)."""
        if self.memory is None:
            self.memory = self.memory_events()
        result = self._run(command, timeout_s, retry)
        self.check_memory()
        return result

    def _run(self, command: str, timeout_s: float, retry: bool = True) -> CommandResult:
        """One command in the agent's shell, killed at ``timeout_s``. Whatever the command did to its shell
        (exit, kill it, stop it, close its output, exhaust its processes or fds), the result is an
        observation and the next command gets a working shell; only a fault of docker or of the warden
        raises ``InfrastructureError``. A command that never started (its shell had died, or had no process
        or fd left to start it: its start line never came) runs once more in a fresh shell."""
        if self.agent is None:
            self.start_shell()
        assert self.agent is not None
        t0 = time.monotonic()
        started, result = True, None
        try:
            got = self.agent.send_and_wait(command, timeout_s)
        except EOFError as exc:
            started = not isinstance(exc, ShellExited) or exc.started
            self.start_shell()
            result = CommandResult("", None, time.monotonic() - t0, restarted=True)
        except OSError:  # it does not read its input (stopped, or a process of its own took its stdin)
            got = None
        if result is None and got is not None and got[1] != BROKEN:
            return CommandResult(got[0], got[1], time.monotonic() - t0, truncated=got[2])
        if result is None and got is not None:  # it could not decode the command (no fd or process left)
            started = False
            self._kill_session(include_shell=True)
            self.start_shell()
            result = CommandResult("", None, time.monotonic() - t0, restarted=True, broken=True)
        if result is None:  # the time limit
            started, result = self._after_timeout(t0)
        if started or not retry:
            return result
        again = self._run(command, timeout_s, retry=False)  # (its full time: it has not run yet)
        return dataclasses.replace(again, seconds=time.monotonic() - t0, restarted=True, rerun=True)

    def _after_timeout(self, t0: float) -> tuple[bool, CommandResult]:
        """Kills what the timed-out command left in the shell's session; replaces the shell when it does
        not answer (a builtin loop, stopped, no process slot), and kills every agent process first when
        they fill the container's process slots (a fork bomb outside the session). Whether the command
        had started (its start line came: by the time limit, or, late, before the shell answered a probe),
        and the result."""
        assert self.agent is not None
        started, start = self.agent.started, self.agent.start
        self._kill_session(include_shell=False)
        if self._agent_processes() >= self.pids_limit * 3 // 4:
            self.kill_agent()
            self.start_shell()
            note = "[the agent's processes filled the container's process slots: every one was killed]"
            return started, CommandResult(note, None, time.monotonic() - t0, timed_out=True, restarted=True)
        late: tuple[str, int, bool] | None
        try:
            late = self.agent.send_and_wait("true", 3.0, earlier=start)
            started = started or self.agent.saw_earlier
        except (EOFError, OSError):
            late = None
        # replaced when it did not answer (its command never started, stuck before its start line, or started
        # long enough before the limit for that line to have come), and when it answered but never started the
        # command: it shares its input with a thief (a process of the agent's reading the shell's stdin takes
        # some lines, the shell others), so the command runs again in a fresh shell, or it may be stolen again
        restarted = late is None or late[1] != 0 or not started
        if restarted:
            self._kill_session(include_shell=True)
            self.start_shell()
        return started, CommandResult("", None, time.monotonic() - t0, timed_out=True, restarted=restarted)

    def _agent_processes(self) -> int:
        _, out = self._root(f"__tg_pids {self.uid}; printf '%s\\n' ${{#__tg[@]}}", 30.0, raw=True)
        return int(out.strip().splitlines()[-1])

    # ----- the end of the episode -----------------------------------------------------------------------
    def kill_agent(self) -> int:
        """SIGKILLs every process of the agent's uid (bash builtins in the warden: no fork needed) until
        none is left; returns how many are left (0, unless some could not be killed)."""
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        _, out = self._root(
            f"__tg_reap {self.uid}; __tg_pids {self.uid}; printf '%s\\n' ${{#__tg[@]}}", 30.0, raw=True
        )
        return int(out.strip().splitlines()[-1])

    def verify(self, tests: dict[str, bytes], timeout_s: float) -> tuple[int, str]:
        """Runs ``bash /tests/test.sh`` as root after the episode: every agent process killed first (none
        left, or the verifier does not run: exit code -2), ``/tests`` (``tests``) and ``/logs/verifier`` made
        afresh by root, the fixed root environment, started from ``/`` and moving to the working folder.
        It runs under the warden, its output to a file of root's (a process it leaves holding its output
        cannot hold the episode), killed with its process group at ``timeout_s``; then every process but
        root's is killed (what the checks left, as the agent's uid or the next). Its exit code and output."""
        left = self.kill_agent()
        if left:
            return -2, f"[{left} agent processes could not be killed: the verifier did not run]"
        code, out = self._root(
            "(set -e; umask 022; [ ! -L /tests ] && [ ! -L /logs ]\n"
            f"find /tests -mindepth 1 -delete; rm -rf /logs/verifier {VERIFIER_OUT}; mkdir -m 755 /logs/verifier\n"
            f"{self._untar(tests, '/tests')}\nchown -R 0:0 /tests /logs; chmod -R go-w /tests) 2>&1",
            60.0,
        )
        if code != 0:
            raise InfrastructureError(f"could not write the verifier's files ({code}): {out[-500:]}")
        wd = shlex.quote(self.workdir)
        self.check_memory()  # (the episode's last commands: a host kill then is no verifier's)
        limit = max(timeout_s, 1)
        t0 = time.monotonic()
        # the verifier's output goes to its file: what the warden prints here is bash's own note on the job
        code, note = self._root(
            f"(cd -- {wd} 2>/dev/null || cd /; exec timeout -s KILL {limit:g} /bin/bash "
            f"/tests/test.sh) </dev/null >{VERIFIER_OUT} 2>&1 7<&-",
            timeout_s + 60.0,
        )
        elapsed = time.monotonic() - t0
        self._root(f"__tg_reap {self.uid}; __tg_reap {self.checks_uid}", 30.0, raw=True)
        self.check_memory()
        # ``timeout`` dies of SIGKILL (bash notes "Killed") when it timed out, or when the verifier's shell
        # was killed by a signal; an exit code of 137 alone is the verifier's own (its last command's). The
        # verifier's shell is root's and no agent process is left: killed before its limit, something
        # outside the episode killed it (the kernel's OOM killer, docker, an operator)
        if code == 137 and re.search(r"\bKilled\b", note) and elapsed < limit - 1.0:
            raise InfrastructureError(
                f"the verifier was killed after {elapsed:.1f} s, before its {limit:g} s limit, by something "
                "outside the episode (out of memory, docker)"
            )
        return code, self.read_file(VERIFIER_OUT, 4000) or ""

    def close(self, wait: bool = False) -> None:
        """Removes the container: in the background (an episode's end: a few hundred ms off the critical
        path), or now with ``wait``. Whatever is left at interpreter exit is removed then."""
        if self.closed:
            return
        self.closed = True
        for shell in (self.agent, self.warden):
            if shell is not None:
                shell.close()
        # the uids are leased again only once the container (and every process of them in it) is gone
        if wait:
            _remove(self.container, self.leases)
        else:
            self.removal = threading.Thread(target=_remove, args=(self.container, self.leases), daemon=True)
            self.removal.start()


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A tar of ``files`` (relative paths), with their folders; executable: ``*.sh``, scripts (``#!``) and ELF
    programs (a task folder's modes are not kept: a compiled checker in ``tests/`` must still run)."""
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
            data = files[name]
            program = name.endswith(".sh") or data.startswith((b"#!", b"\x7fELF"))
            info.mode = 0o755 if program else 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


_LIVE: dict[str, Any] = {}  # containers this process started and has not removed yet, by id
_LIVE_LOCK = threading.Lock()


def _remove(container: Any, leases: tuple[Any, ...] = ()) -> None:
    removed = False
    with contextlib.suppress(Exception):
        container.remove(force=True)
        removed = True
    with _LIVE_LOCK:
        _LIVE.pop(container.id, None)
    if removed:  # (one that could not be removed keeps its uids: no other container gets them)
        for lease in leases:
            lease.release()


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
        check_workdir(workdir)
        self.image, self.resources, self.workdir, self.spares = image, resources, workdir, spares
        self._ready: list[TaskContainer] = []  # started, each with its shell running
        self._lock = threading.Lock()
        self._filling = 0
        self._fillers: list[threading.Thread] = []
        self.closed = False
        self._seed: bytes | None = None
        self._seeded = False

    def seed(self) -> bytes | None:
        """The image's working folder, read once per pool (``image_workdir``)."""
        with self._lock:
            if not self._seeded:
                self._seed, self._seeded = image_workdir(self.image, self.workdir), True
            return self._seed

    def _start(self) -> Any:
        from toolgym.sandboxes.docker_backend import client

        kwargs = _kwargs(self.image, self.resources, self.workdir, len(self.seed() or b""))
        try:
            container = client().containers.run(**kwargs)
        except Exception as exc:
            raise InfrastructureError(f"could not start a task container from {self.image}: {exc}") from exc
        with _LIVE_LOCK:
            _LIVE[container.id] = container
        return container

    def _started(self) -> TaskContainer:
        seed = self.seed()
        container = self._start()
        try:
            box = TaskContainer(container, self.workdir, seed)
        except InfrastructureError:  # (no uid to lease)
            _remove(container)
            raise
        box.pids_limit = self.resources.pids
        try:
            box.start()
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
