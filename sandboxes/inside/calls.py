"""One session call on a worker: the checks before it (the worker's own loop waits, nothing of an earlier
call runs), the request, the strict reading of the reply, and the checks after it (threads, priority,
scheduling policy and rlimits unchanged; nothing it started left running)."""

from __future__ import annotations

import array
import contextlib
import os
import signal
import socket
import time
from typing import Any

from .accounting import INLINE_CODE, MISBEHAVED, REPLY, Accounting, _stdin_fd
from .frames import Blobs, write_all
from .procs import Worker, oom_kills, pread_proc


class Calls(Accounting):
    zygote: int | None
    null: int  # /dev/null, the stdin of session calls that bring none

    def drop_zygote(self) -> None:  # `Workers.drop_zygote`
        raise NotImplementedError

    def idle(self, w: Worker, patience: float = 1.0) -> bool:
        """Whether the worker's own loop, and not code it ran, is what waits on its request socket: one
        thread, blocked reading fd 3, with the stack pointer and return address it had the first time (code
        still running from an earlier call sits deeper in the stack). Unchecked where /proc/PID/syscall
        cannot be read."""
        end = 0.0
        spins = 0
        fd = w.proc.get("syscall", -1)
        while True:
            if w.threads() != 1:
                return False
            try:
                fields = os.pread(fd, 512, 0).split()
            except ProcessLookupError:
                return False
            except OSError:  # no /proc/PID/syscall here (gVisor; documented): the other checks still hold
                return self._asleep(w, patience)
            if len(fields) >= 9 and fields[0] not in (b"running", b"-1") and fields[1] == b"0x3":
                mark = (fields[0].decode(), fields[7].decode(), fields[8].decode())
                if w.mark is None:
                    w.mark = mark
                return mark == w.mark
            if not end:
                end = time.monotonic() + patience
            elif time.monotonic() > end:
                return False
            spins += 1
            if spins < 20:
                os.sched_yield()  # it is usually a few instructions away from blocking: let it run
            else:
                time.sleep(0.0002)

    @staticmethod
    def _asleep(w: Worker, patience: float) -> bool:
        """Waits (up to ``patience``) until the worker sleeps, so a new worker's set-up (rlimits, priority,
        uid) is over before its first call is measured against; True unless it is gone."""
        end = time.monotonic() + patience
        while True:
            stat = pread_proc(w.proc["stat"])
            at = stat.rfind(b")")
            if at < 0:
                return False
            if stat[at + 2 : at + 3] == b"S" or time.monotonic() > end:
                return True
            time.sleep(0.0002)

    def _gone(self, wid: int, why: str) -> tuple[dict[str, Any], Blobs]:
        self.kill_worker(wid)
        self.kill_strays()
        return {"status": "gone", "alive": False, "why": why}, {}

    def execute(
        self, wid: int, code: bytes, stdin: bytes | None, timeout: float
    ) -> tuple[dict[str, Any], Blobs]:
        """Runs one session call; ``alive`` in the reply says whether the worker still serves.

        Before the call: the worker's own loop must be what waits for it (`idle`) and nothing else may run
        in the box; what code of the last call may have printed after its reply is thrown away. After it:
        no thread and no process it started may be left."""
        w = self.workers[wid]
        # A new worker may still be starting up (a new process waits for a CPU on a busy machine).
        if not self.idle(
            w, 1.0 if w.calls else 10.0
        ):  # code of an earlier call is in control: it never sees this call
            return self._gone(
                wid, "the interpreter was restarted: code of an earlier call was still running in it"
            )
        if (
            not self._quiet(w) and self._strays()
        ):  # started after its call answered: only code that forged a reply can
            return self._gone(
                wid, "the interpreter was restarted: a process of an earlier call was still running"
            )
        if w.vitals is None:  # its set-up is over (it waits in its loop): what its calls must leave as is
            w.vitals = w.state()[1]
        out_r, err_r = w.out_r, w.err_r
        bufs = {out_r: bytearray(), err_r: bytearray()}
        self._read_now(bufs, 0)  # discards it
        w.calls += 1
        n = w.calls
        oom_before = oom_kills()
        t0 = time.monotonic()
        deadline = t0 + timeout
        rep_r, rep_w = os.pipe()
        stdin_fd = _stdin_fd(stdin) if stdin is not None else self.null
        theirs = [stdin_fd, w.out_w, w.err_w, rep_w]
        head = b"exec %d i" % n if stdin is not None else b"exec %d" % n
        message = head + b"\n" + code  # small code rides in the message itself
        if len(code) > INLINE_CODE:
            message = head
            code_fd = os.memfd_create("code")
            write_all(code_fd, code)
            os.lseek(code_fd, 0, os.SEEK_SET)
            theirs.append(code_fd)
        try:  # never blocks: the worker's loop is waiting on the socket (checked above)
            w.door.sendmsg(
                [message],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))],
                socket.MSG_DONTWAIT,
            )
            sent = True
        except OSError:
            sent = False
        os.close(rep_w)
        if stdin_fd != self.null:
            os.close(stdin_fd)
        if len(theirs) > 4:
            os.close(theirs[4])
        reply = bytearray()
        how, truncated = "exited", False
        if sent:
            how, truncated = self._pump(bufs, w.pid, w.pidfd, (rep_r, reply), deadline, False)
        os.close(rep_r)
        detail, exit_code, status = "", None, "error"
        alive = how == "replied"
        if alive:
            parsed = self._parse_reply(bytes(reply), n)
            if parsed is None:
                alive, detail = (
                    False,
                    MISBEHAVED if reply else "the code closed the supervisor's reply channel",
                )
                if not reply and self.wait_status(w.pid, 0.1) is not None:  # it did not misbehave: it died
                    how = "exited"
            else:
                exc, exit_code, retire = parsed
                status = "ok" if exc is None and exit_code == 0 else "error"
                if status == "error" and (exc == "MemoryError" or 0 <= oom_before < oom_kills()):
                    status = "oom"  # its own MemoryError, or the OOM killer took one of its processes
                threads, vitals = w.state()
                if threads > 1:
                    alive = False
                    detail = "a thread the code started outlived its call (a session keeps no threads between calls)"
                elif retire or vitals != w.vitals:
                    alive = False
                    detail = (
                        "the code changed its interpreter's priority, scheduling policy or resource limits, "
                        "which would carry into later calls"
                    )
        elif how == "misbehaved":
            detail = MISBEHAVED
        if how == "exited":
            raw = self.wait_status(w.pid, 0.5)
            status, detail, exit_code = self._status("exited", raw, bufs[err_r], oom_before, timeout)
            if status == "ok":
                status = "error"  # a session's interpreter must not exit
            detail = detail or "the interpreter exited"
        elif how == "timeout":
            status = "oom" if oom_before >= 0 and oom_kills() > oom_before else "timeout"
            detail = f"wall clock of {timeout:g} s exceeded"
        elif how == "misbehaved":
            status = "error"
        if alive and self._quiet(w):
            pass  # nothing started by this call is left: no /proc scan needed
        elif not alive:
            if self.contained and len(self.workers) - (self.zygote is not None) == 1:
                self.drop_zygote()
                with contextlib.suppress(OSError):  # everything at once, before a fork bomb takes more CPU
                    os.kill(-1, signal.SIGKILL)
            self.kill_worker(wid, keep_pipes=True)
            self.kill_strays()
        else:
            self.kill_strays()  # a call leaves nothing running behind it
        # Every writer but the (idle) worker is gone now: what was written is in the pipes.
        truncated |= self._read_now(bufs, self.max_output)
        if not alive:
            w.close()
        header = {
            "status": status,
            "exit_code": exit_code,
            "duration_s": time.monotonic() - t0,
            "truncated": truncated,
            "detail": detail,
            "alive": alive,
        }
        return header, {"stdout": bytes(bufs[out_r]), "stderr": bytes(bufs[err_r])}

    @staticmethod
    def _parse_reply(raw: bytes, n: int) -> tuple[str | None, int, bool] | None:
        """(exception name or None, exit status, whether the worker must retire) from a worker's reply, or
        None when it is not exactly what a worker sends."""
        m = REPLY.fullmatch(raw)
        if m is None or int(m[1]) != n or int(m[3]) > 255:
            return None
        if m[2] == b"null":
            return None, int(m[3]), m[4] is not None
        try:
            exc = m[2][1:-1].decode()
        except UnicodeDecodeError:
            return None
        return (exc, int(m[3]), m[4] is not None) if exc.isidentifier() and len(exc) <= 200 else None
