"""The supervisor's accounting of a call: reading a process's output up to the cap while it runs, the
wall clock, and the status a finished process gets (from ``waitpid`` and the OOM counter, never from
anything it wrote); plus the checks that nothing a session call started is left."""

from __future__ import annotations

import os
import re
import select
import signal
import time

from .frames import write_all
from .procs import (
    Reaper,
    Worker,
    oom_kills,
    pread_proc,
)

MAX_REPLY = 512  # a genuine worker reply is a few dozen bytes
INLINE_CODE = 32 << 10  # session code up to this size travels in the request message, bigger in a memfd
MISBEHAVED = "the code wrote on the supervisor's reply channel"
ZYGOTE_NAME = b"tg-spare"  # the comm of a box's zygote worker, which never runs code (tests tell it apart)
# Exactly what a worker's loop writes (`worker.session_loop`), nothing else: one regex match per call.
REPLY = re.compile(
    rb'\{"n": ([1-9][0-9]{0,17}), "exc": (null|"[^"\\\x00-\x1f]{1,800}"), "exit": ([0-9]{1,3})(, "retire": 1)?\}'
)  # "retire": the worker found its own rlimits changed by the call (it checks them: no /proc/PID/limits needed)


def _stdin_fd(data: bytes | None) -> int:
    """An fd holding the call's stdin (an anonymous memory file), or /dev/null."""
    if data is None:
        return os.open(os.devnull, os.O_RDONLY)
    fd = os.memfd_create("stdin")
    write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _child_io(stdin: int, out: int, err: int, door: int | None = None) -> None:
    """In a fresh child: its own session, exactly the given stdio (and request socket), nothing else."""
    os.setsid()
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    if door is not None:
        os.dup2(door, 3)
    os.closerange(3 if door is None else 4, 1 << 20)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _safe_rel(rel: str) -> bool:
    parts = rel.replace("\\", "/").split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "\0" not in rel


class Accounting(Reaper):
    """Output, deadlines and statuses; the attributes below are set by `Server.__init__`."""

    max_output: int
    uid: int
    gid: int
    limits: dict[str, int]
    env: dict[str, str]
    subreaper: bool
    my_children: int

    def _status(
        self, how: str, raw: int | None, err: bytearray, oom_before: int, timeout: float
    ) -> tuple[str, str, int | None]:
        ooms = oom_before >= 0 and oom_kills() > oom_before
        if how == "timeout":
            return ("oom" if ooms else "timeout"), f"wall clock of {timeout:g} s exceeded", None
        if how == "output_limit":
            return "output_limit", f"output over {self.max_output} bytes; the run was stopped", None
        if raw is None:
            return "error", "the interpreter could not be waited for", None
        if os.WIFSIGNALED(raw):
            sig = os.WTERMSIG(raw)
            if ooms:
                return "oom", "killed by the out-of-memory killer", -sig
            return "error", f"the interpreter died (signal {sig})", -sig
        code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 1
        if code == 0:
            return "ok", "", 0
        last = bytes(err).rstrip().rsplit(b"\n", 1)[-1]
        if ooms or last.startswith(b"MemoryError"):
            return "oom", "out of memory", code
        return "error", f"the interpreter exited with code {code}", code

    @staticmethod
    def _pidfd(pid: int) -> int:
        try:
            return os.pidfd_open(pid)
        except (OSError, AttributeError):
            return -1

    def _exited(self, pid: int) -> bool:
        self.reap()
        return pid in self.exited

    def _pump(
        self,
        bufs: dict[int, bytearray],
        pid: int,
        pidfd: int,
        reply: tuple[int, bytearray] | None,
        deadline: float,
        oneshot: bool,
    ) -> tuple[str, bool]:
        """Reads output until the process exits (or, for a session call, its reply pipe closes), the
        deadline passes or a one-shot run floods: (exited | replied | timeout | output_limit | misbehaved,
        truncated)."""
        watch: list[int] = [*bufs]
        if reply is not None:
            watch.append(reply[0])
        if pidfd >= 0:
            watch.append(pidfd)
        truncated = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", truncated
            ready, _, _ = select.select(watch, [], [], left if pidfd >= 0 else min(left, 0.002))
            if pidfd < 0 and self._exited(pid):
                return "exited", truncated
            for r in ready:
                if r == pidfd:
                    return "exited", truncated
                data = self._read_some(r)
                if reply is not None and r == reply[0]:
                    if data is None:
                        return "replied", truncated
                    reply[1].extend(data)
                    if len(reply[1]) > MAX_REPLY:
                        return "misbehaved", truncated
                    if reply[1].endswith(b"}"):
                        # A worker writes its whole reply in one write, after flushing its output: the call
                        # is over and what it printed is in the (session) pipes, no need to wait for EOF.
                        return "replied", truncated
                elif data is None:
                    watch.remove(r)  # the code closed its stdout/stderr
                else:
                    truncated |= self._keep(bufs[r], data, self.max_output)
            if truncated and oneshot:
                return "output_limit", truncated

    def _drain(self, bufs: dict[int, bytearray], patience: float = 1.0) -> bool:
        """Reads what is left in the pipes once every writer is gone (or ``patience`` runs out)."""
        truncated = False
        end = time.monotonic() + patience
        open_fds = list(bufs)
        while open_fds and time.monotonic() < end:
            ready, _, _ = select.select(open_fds, [], [], max(0.0, end - time.monotonic()))
            for r in ready:
                data = self._read_some(r)
                if data is None:
                    open_fds.remove(r)
                elif len(bufs[r]) <= self.max_output:
                    truncated |= self._keep(bufs[r], data, self.max_output)
                else:
                    truncated = True
        return truncated

    @staticmethod
    def _read_some(fd: int) -> bytes | None:
        """Bytes available now; b"" when nothing is, None at end of stream."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return b""
        except OSError:
            return None
        return data if data else None

    @staticmethod
    def _keep(buf: bytearray, data: bytes, cap: int) -> bool:
        room = cap - len(buf)
        if room >= len(data):
            buf += data
            return False
        if room > 0:
            buf += data[:room]
        return True

    # -- session workers
    def _read_now(self, bufs: dict[int, bytearray], cap: int) -> bool:
        """Reads what the (non-blocking) session pipes hold now, keeping up to ``cap`` bytes of each;
        whether anything was cut."""
        truncated = False
        try:  # one call tells which pipes hold anything (usually none)
            ready, _, _ = select.select(list(bufs), [], [], 0)
        except (OSError, ValueError):
            ready = list(bufs)
        for fd in ready:
            buf = bufs[fd]
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # empty (EAGAIN) or closed
                    break
                if not data:
                    break
                truncated |= self._keep(buf, data, cap)
        return truncated and cap > 0

    def _strays(self) -> bool:
        """Whether any process but the workers lives below us (a /proc scan; zombies do not count)."""
        self.reap()
        keep = {w.pid for w in self.workers.values()}
        return any(p not in keep for p in self.descendants())

    def _quiet(self, w: Worker) -> bool:
        """Whether the worker has no child and the supervisor no child but its workers (so nothing the call
        started is left), from two small reads; False when unsure (the caller then scans /proc)."""
        if w.proc.get("children", -1) < 0 or pread_proc(w.proc["children"]).strip():
            return False
        if self.my_children < 0:
            return False
        try:
            mine = {int(p) for p in pread_proc(self.my_children).split()}
        except ValueError:
            return False
        workers = {w.pid for w in self.workers.values()}
        if mine <= workers:
            return True
        self.reap()
        return mine <= workers | set(self.exited)
