"""Process bookkeeping for the supervisor: reaping, finding strays, killing them, wiping scratch dirs.

The supervisor is a child subreaper, so every process the code starts stays below it even after a
double fork; a /proc scan of that tree finds whatever outlived its worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import time
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4  # non-dumpable: same-uid code cannot ptrace the process or read its /proc secrets


def prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


class Worker:
    def __init__(self, pid: int, ctrl: socket.socket, out: int, err: int) -> None:
        self.pid, self.ctrl, self.out, self.err = pid, ctrl, out, err

    def close(self) -> None:
        self.ctrl.close()
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)


OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_oom_file: list[str] = []  # the first of OOM_FILES that was readable: read once per call, so remembered


def oom_kills() -> int:
    """The memory cgroup's oom-kill counter (v2 memory.events, v1 memory.oom_control); -1 if unreadable."""
    for path in _oom_file or OOM_FILES:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            continue
        at = text.find(b"oom_kill ")
        if at >= 0:
            if not _oom_file:
                _oom_file.append(path)
            return int(text[at + 9 :].split(None, 1)[0])
    return -1


class Reaper:
    """The part of the supervisor that tracks, kills and cleans up after processes."""

    def __init__(self, scratch: list[str], contained: bool) -> None:
        self.scratch = scratch
        self.contained = contained  # inside a container of our own: kill(-1) and wiping all scratch are safe
        self.workers: dict[int, Worker] = {}
        self.exited: dict[int, int] = {}

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
            time.sleep(0.001)

    def descendants(self) -> dict[int, int]:
        """pid -> parent pid for every process below this server (orphans included: we are a subreaper)."""
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
        """Kills every process below us outside the live workers' trees; True once none is left."""
        for _ in range(300):
            self.reap()
            live = {w.pid for w in self.workers.values()}
            below = self.descendants()
            strays = []
            for pid in below:
                p = pid
                while p in below and p not in live:
                    p = below[p]
                if p not in live:
                    strays.append(pid)
            if not strays:
                return True
            if self.contained and not live:
                strays.append(-1)  # the whole uid except us and PID 1: catches anything the scan raced with
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)
        return False

    def kill_worker(self, wid: int) -> None:
        w = self.workers.pop(wid, None)
        if w is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, signal.SIGKILL)
        self.wait_status(w.pid, 1.0)
        self.exited.pop(w.pid, None)
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
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, onerror=force)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
        return all(not os.path.isdir(r) or not os.listdir(r) for r in paths)

    @staticmethod
    def wipe_ipc() -> bool:
        """Removes System V shared memory, semaphores and message queues (they outlive processes and
        would carry data and memory from one run to the next); True when none is left."""
        libc = ctypes.CDLL(None, use_errno=True)
        ipc_rmid = 0
        removers = {"shm": libc.shmctl, "sem": libc.semctl, "msg": libc.msgctl}
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
