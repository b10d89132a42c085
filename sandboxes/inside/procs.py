"""Process bookkeeping for the supervisor: dropping privileges, reaping, finding strays, killing them,
wiping scratch dirs, and the health check a box passes before it is used again.

The supervisor is a child subreaper, so every process the code starts stays below it even after a
double fork; a /proc scan of that tree finds whatever outlived its call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import time
from typing import Any

PR_SET_DUMPABLE = 4  # non-dumpable: other processes cannot ptrace it or read its /proc secrets
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CAP_KILL, CAP_SETGID, CAP_SETUID = 5, 6, 7
GRADER_CAPS = (1 << CAP_KILL) | (1 << CAP_SETGID) | (1 << CAP_SETUID)
# Variables every child interpreter gets, whatever the code did to its environment: no user site dir
# (.pth hooks), no startup file, no search path or home from outside.
HARDEN = {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
UNSET = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONBREAKPOINT")
RLIMITS = ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_STACK")

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> int:
    """prctl(2) with one argument: 0 when it worked, -1 when not."""
    try:
        return 0 if _libc.prctl(option, value, 0, 0, 0) == 0 else -1
    except (OSError, AttributeError):
        return -1


def set_name(name: bytes) -> None:
    """This process's name (``comm``, what ``ps -o comm`` shows)."""
    with contextlib.suppress(OSError, AttributeError):
        _libc.prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME


def set_oom_adj(value: int) -> None:
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(value))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def keep_only_caps(mask: int) -> None:
    """Reduces this (root) process's capabilities to ``mask`` (the low 32 capability bits)."""
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = mask
    if _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def harden_env(env: Any) -> None:
    """Re-asserts the interpreter hardening variables in ``env`` (os.environ)."""
    for key in UNSET:
        env.pop(key, None)
    env.update(HARDEN)


# seccomp: the code may not make namespaces (user namespaces would give it a root of its own to mount and
# unshare with), mount, use kernel keyrings (kept per uid: state that outlives its processes), eBPF, perf
# or userfaultfd, nor make POSIX timers (one would signal a session's interpreter after its call returned;
# the worker cancels its interval timers at the end of every call). x86_64 syscall numbers; on other architectures the filter allows everything (documented).
AUDIT_ARCH_X86_64 = 0xC000003E
DENY_EPERM = {272: "unshare", 308: "setns", 165: "mount", 166: "umount2", 248: "add_key", 249: "request_key",
              250: "keyctl", 321: "bpf", 298: "perf_event_open", 323: "userfaultfd", 155: "pivot_root",
              161: "chroot", 222: "timer_create"}  # fmt: skip
NR_CLONE, NR_CLONE3 = 56, 435
CLONE_NS_FLAGS = 0x7E020080  # NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET NEWTIME


NR_MQ_OPEN = 240


def _seccomp_program(deny: tuple[int, ...] = ()) -> bytes:
    import struct

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [op(ld, 4), op(jeq, AUDIT_ARCH_X86_64, 1, 0), op(ret, allow), op(ld, 0)]
    for nr in (*DENY_EPERM, *deny):
        prog += [op(jeq, nr, 0, 1), op(ret, eperm)]
    prog += [op(jeq, NR_CLONE3, 0, 1), op(ret, enosys)]  # libc falls back to clone, checked below
    prog += [op(jeq, NR_CLONE, 0, 3), op(ld, 16), op(jset, CLONE_NS_FLAGS, 0, 1), op(ret, eperm)]
    prog += [op(ret, allow)]
    return b"".join(prog)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_seccomp: list[Any] = []  # (buffer, fprog), built once in the supervisor and inherited by every fork


def prepare_seccomp(no_mqueues: bool = False) -> None:
    """Builds the filter program (in the supervisor, once). ``no_mqueues``: POSIX message queues are
    refused too (where no mqueue file system is mounted, e.g. gVisor, the supervisor could not wipe them)."""
    if not _seccomp:
        import platform

        if platform.machine() != "x86_64":
            _seccomp.append(None)
        else:
            prog = _seccomp_program((NR_MQ_OPEN,) if no_mqueues else ())
            buf = ctypes.create_string_buffer(prog, len(prog))
            _seccomp.append((buf, _Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))))


def seccomp_deny() -> bool:
    """Installs the filter above on this process (inherited by everything it starts); False if not."""
    prepare_seccomp()
    if _seccomp[0] is None:
        return False
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    return bool(_libc.prctl(22, 2, ctypes.byref(_seccomp[0][1]), 0, 0) == 0)  # PR_SET_SECCOMP, FILTER


def prepare_worker(limits: dict[str, int]) -> None:
    """In a freshly forked child of the (root) supervisor, all of `drop_to` but the change of uid: the box's
    rlimits, the OOM killer's first choice, the default priority (the supervisor's is higher), the
    seccomp filter. A box's spare worker stops here: it stays root (and not dumpable) until it takes a
    session, so code under the box uid can neither ptrace, signal, renice nor prlimit it."""
    set_oom_adj(1000)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    for name, value in limits.items():
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(getattr(resource, name), (value, value))
    seccomp_deny()


def become_user(uid: int, gid: int) -> None:
    """The code's uid and gid with no capabilities left (after `prepare_worker`)."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 1)  # the code's own processes behave normally (/proc/self, debuggers)


def drop_to(uid: int, gid: int, limits: dict[str, int]) -> None:
    """In a freshly forked child of the (root) supervisor: `prepare_worker`, then the code's uid and gid."""
    prepare_worker(limits)
    become_user(uid, gid)


def become_grader(limits: dict[str, int]) -> None:
    """A trusted grading harness: stays root (so code under the box uid can neither signal nor read it)
    with only the capabilities to start processes as the box uid and to kill them."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    for name, value in limits.items():
        if name != "RLIMIT_NPROC":  # counted per uid: root's would cap nothing useful
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(getattr(resource, name), (value, value))
    if os.geteuid() == 0:
        keep_only_caps(GRADER_CAPS)
    seccomp_deny()


class Worker:
    """A session's interpreter: its pid, the request socket the supervisor writes (the worker can only
    read it), a pidfd (or -1) that becomes readable when it exits, its stdout and stderr pipes, and its
    /proc files, opened once and re-read with one ``pread`` each per call.

    The stdout/stderr pipes live as long as the worker: each call sends the write ends again (the worker
    puts them on fds 1 and 2 afresh, whatever the code did to those fds), and the supervisor keeps the
    read ends non-blocking. A call is over when its one-use reply pipe holds the reply; the worker
    flushed its output before writing it, so everything it printed is in the pipes by then."""

    def __init__(self, pid: int, door: Any) -> None:
        self.pid, self.door = pid, door
        try:
            self.pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.pidfd = -1
        self.calls = 0
        self.mark: tuple[str, ...] | None = None  # how its loop looks while it waits (`Server.idle`)
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        os.set_blocking(self.out_r, False)
        os.set_blocking(self.err_r, False)
        self.proc = {name: open_proc(f"/proc/{pid}/{name}") for name in ("stat", "syscall")}
        self.vitals: bytes | None = None  # `state()`'s second half before its first call
        self.proc["children"] = open_proc(f"/proc/{pid}/task/{pid}/children")

    def threads(self) -> int:
        """How many threads it has (0 when it is gone)."""
        stat = pread_proc(self.proc["stat"])
        try:
            return int(stat[stat.rindex(b")") + 2 :].split()[17])
        except (ValueError, IndexError):
            return 0

    def state(self) -> tuple[int, bytes]:
        """(threads, what a call must not change for the next: nice, real-time priority, scheduling
        policy), from one read; (0, b"") when it is gone. (Its rlimits the worker checks itself.)"""
        stat = pread_proc(self.proc["stat"])
        try:
            f = stat[stat.rindex(b")") + 2 :].split()
            return int(f[17]), b" ".join((f[16], f[37], f[38]))
        except (ValueError, IndexError):
            return 0, b""

    def close(self) -> None:
        self.door.close()
        fds = [self.out_r, self.out_w, self.err_r, self.err_w, *self.proc.values()]
        if self.pidfd >= 0:
            fds.append(self.pidfd)
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = -1
        self.proc = {}
        self.out_r = self.out_w = self.err_r = self.err_w = -1


def open_proc(path: str) -> int:
    """An fd on a /proc (or cgroup) file that `pread_proc` re-reads, fresh, with one system call; -1
    when it cannot be opened."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def pread_proc(fd: int) -> bytes:
    """The current text of a file opened by `open_proc` (b"" when it cannot be read: process gone)."""
    if fd < 0:
        return b""
    try:
        return os.pread(fd, 65536, 0)
    except OSError:
        return b""


OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_oom_fd: list[int] = []  # the first of OOM_FILES that was readable, kept open (read once per call)


def oom_kills() -> int:
    """The memory cgroup's oom-kill counter (v2 memory.events, v1 memory.oom_control); -1 if unreadable."""
    if not _oom_fd:
        for path in OOM_FILES:
            fd = open_proc(path)
            if fd >= 0 and b"oom_kill " in pread_proc(fd):
                _oom_fd.append(fd)
                break
            if fd >= 0:
                os.close(fd)
        else:
            _oom_fd.append(-1)
    text = pread_proc(_oom_fd[0])
    at = text.find(b"oom_kill ")
    return int(text[at + 9 :].split(None, 1)[0]) if at >= 0 else -1


def read_proc(path: str) -> bytes:
    """A small /proc file, with plain fd calls (the supervisor reads a few per session call)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


class Reaper:
    """The part of the supervisor that tracks, kills and cleans up after processes."""

    def __init__(self, scratch: list[str], contained: bool) -> None:
        self.scratch = scratch
        self.contained = (
            contained  # inside a pid namespace of our own: kill(-1) and wiping all scratch are safe
        )
        self.keep: set[str] = set()  # entries of the scratch dirs that are not scratch (a bound Python)
        self.workers: dict[int, Worker] = {}
        self.exited: dict[int, int] = {}
        self.baseline = self.vitals()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exited[pid] = status

    def wait_status(self, pid: int, patience: float) -> int | None:
        end = time.monotonic() + patience
        while True:
            self.reap()
            if pid in self.exited:
                return self.exited[pid]
            if time.monotonic() > end:
                return None
            time.sleep(0.0005)

    def descendants(self) -> dict[int, int]:
        """pid -> parent pid for every live process below this server (orphans included: we are a subreaper).
        Alone in a pid namespace (``contained``), every process but init and this server counts: that holds
        even where orphans go to init (gVisor has no subreaper)."""
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        stat = f.read()
                    fields = stat[stat.rindex(b")") + 2 :].split()
                    if fields[0] != b"Z":  # zombies are reaped, not killed
                        parents[int(entry)] = int(fields[1])
                except (OSError, ValueError, IndexError):
                    continue
        me = os.getpid()
        if self.contained:
            return {pid: ppid for pid, ppid in parents.items() if pid not in (1, me)}
        below: dict[int, int] = {}
        for pid in parents:
            chain: list[int] = []
            p = pid
            while p in parents and p != me and p not in below and len(chain) < 4096:
                chain.append(p)
                p = parents[p]
            if p == me or p in below:
                for q in chain:
                    below[q] = parents[q]
        return below

    def kill_strays(self) -> bool:
        """Kills every process below us except the live workers themselves (their children included: a
        call leaves nothing running); True once none is left."""
        keep = {w.pid for w in self.workers.values()}
        for _ in range(300):
            if self.contained and not keep:
                # Everything in the namespace but init and us, in one call and before any scan: a fork bomb
                # is gone before it can take more of the CPU the scan needs.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(-1, signal.SIGKILL)
            self.reap()
            strays = [p for p in self.descendants() if p not in keep]
            if not strays:
                return True
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)
        return False

    def kill_worker(self, wid: int, keep_pipes: bool = False) -> None:
        """Kills a worker and forgets it; ``keep_pipes``: the caller still reads its output, then closes it."""
        w = self.workers.pop(wid, None)
        if w is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.pid, signal.SIGKILL)
        self.wait_status(w.pid, 1.0)
        if not keep_pipes:
            w.close()

    def wipe(self, paths: list[str]) -> bool:
        def force(func: Any, path: str, _exc: Any) -> None:
            try:  # code may have chmod-ed its own directories to 000
                os.chmod(os.path.dirname(path), 0o700)
                os.chmod(path, 0o700)
                func(path)
            except OSError:
                pass

        for root in paths:
            try:
                entries = list(os.scandir(root))
            except OSError:
                continue
            for e in entries:
                if e.path in self.keep:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, onerror=force)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
        return all(
            not os.path.isdir(r) or all(os.path.join(r, e) in self.keep for e in os.listdir(r)) for r in paths
        )

    @staticmethod
    def wipe_ipc() -> bool:
        """Removes System V shared memory, semaphores and message queues (they outlive processes and
        would carry data and memory from one run to the next); True when none is left."""
        ipc_rmid = 0
        removers = {"shm": _libc.shmctl, "sem": _libc.semctl, "msg": _libc.msgctl}
        left = 0
        for kind, remove in removers.items():
            try:
                with open(f"/proc/sysvipc/{kind}") as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                ipc_id = int(row.split()[1])
                args = (ipc_id, 0, ipc_rmid, None) if kind == "sem" else (ipc_id, ipc_rmid, None)
                if remove(*args) != 0:
                    left += 1
        return left == 0

    def vitals(self) -> dict[str, Any]:
        """What code must not be able to change for later calls: the priority, scheduling policy, rlimits
        and OOM score of this server and of PID 1."""
        out: dict[str, Any] = {}
        for who in (0, 1) if self.contained else (0,):
            try:
                out[f"nice[{who}]"] = os.getpriority(os.PRIO_PROCESS, who)
                out[f"sched[{who}]"] = os.sched_getscheduler(who)
                with open(f"/proc/{who or 'self'}/oom_score_adj") as f:
                    out[f"oom_adj[{who}]"] = f.read().strip()
            except OSError as exc:
                out[f"read[{who}]"] = exc.errno
        for name in RLIMITS:
            out[name] = resource.getrlimit(getattr(resource, name))
        return out

    def health(self) -> list[str]:
        """What changed since start that would carry into later calls (empty when the box is fit)."""
        now = self.vitals()
        return [
            f"{k}: {self.baseline.get(k)!r} -> {v!r}" for k, v in now.items() if self.baseline.get(k) != v
        ]
