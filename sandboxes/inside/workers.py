"""Session workers: the box's spare (zygote), new workers, branches (``fork``) and the reset that ends a
box's sessions."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Any

from .accounting import ZYGOTE_NAME, _child_io
from .calls import Calls
from .procs import Worker, drop_to, prepare_worker, set_name
from .worker import session_loop


class Workers(Calls):
    next_wid: int

    def spawn(self) -> int:
        """A new session worker. The box keeps a *zygote*: a worker that never ran code, waiting in its
        loop. A new session takes the zygote itself (a process that is already running, so its first call
        does not wait for a new process to be scheduled, which on a busy machine costs tens of ms) after
        the zygote branched once (`fork`): that branch, as pristine as its parent, is the next zygote and
        has until the next session to start up. Without a zygote (the box's first session, after a one-shot
        run, under gVisor), a fresh fork of the supervisor."""
        if self.subreaper and self.zygote is None:
            with contextlib.suppress(OSError):
                self.zygote = self._fork_worker(zygote=True)
        if self.zygote is not None:
            wid, self.zygote = self.zygote, None
            try:
                self.zygote = self.fork(wid, spawn=True)
                self.workers[wid].calls = 0  # the session's calls count from 1, as on a fresh worker
                return wid
            except (RuntimeError, OSError):
                self.kill_worker(wid)
                self.kill_strays()
        return self._fork_worker()

    def drop_zygote(self) -> None:
        if self.zygote is not None:
            self.kill_worker(self.zygote)
            self.zygote = None

    def _fork_worker(self, zygote: bool = False) -> int:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.shutdown(socket.SHUT_RD)  # the worker can never write to us on it
        workdir = os.path.join(self.scratch[0], "work")
        env = self.env
        pid = os.fork()
        if pid == 0:
            try:
                null = os.open(os.devnull, os.O_RDWR)
                _child_io(null, null, null, door=theirs.fileno())
                os.environ.clear()
                os.environ.update(env)
                os.umask(0o077)
                if zygote:  # root until it takes a session: out of reach of the code (`prepare_worker`)
                    set_name(ZYGOTE_NAME)
                    prepare_worker(self.limits)
                    os.chdir("/")
                    session_loop(socket.socket(fileno=3), (self.uid, self.gid, workdir))
                drop_to(self.uid, self.gid, self.limits)
                os.makedirs(workdir, mode=0o700, exist_ok=True)
                os.chdir(workdir)
                session_loop(socket.socket(fileno=3))
            finally:
                os._exit(0)
        theirs.close()
        return self._register(pid, mine)

    def _register(self, pid: int, door: socket.socket, mark: tuple[str, ...] | None = None) -> int:
        door.setblocking(True)  # sends use MSG_DONTWAIT: never blocked, and no poll() before each send
        wid = self.next_wid
        self.next_wid += 1
        self.workers[wid] = Worker(pid, door)
        self.workers[wid].mark = mark
        return wid

    def fork(self, wid: int, spawn: bool = False) -> int:
        """A branch of worker ``wid``; ``spawn``: ``wid`` is the zygote, which goes on to serve a new
        session while the branch becomes the next zygote (`spawn`)."""
        if not self.subreaper:
            raise RuntimeError(
                "branching a session needs a child subreaper, which this kernel lacks (gVisor/runsc): use the "
                "default docker runtime for sessions that fork"
            )
        parent = self.workers[wid]
        if not self.idle(parent, 1.0 if parent.calls else 10.0):  # a new zygote may still be starting
            self.kill_worker(wid)
            self.kill_strays()
            raise RuntimeError(
                "code of an earlier call was still running in the interpreter; it was restarted"
            )
        parent.calls += 1
        n = parent.calls
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.shutdown(socket.SHUT_RD)
        rep_r, rep_w = os.pipe()
        try:
            message = b"fork %d s" % n if spawn else b"fork %d" % n
            socket.send_fds(parent.door, [message], [theirs.fileno(), rep_w], socket.MSG_DONTWAIT)
        finally:
            theirs.close()
            os.close(rep_w)
        buf = bytearray()
        try:
            how, _ = self._pump({}, parent.pid, parent.pidfd, (rep_r, buf), time.monotonic() + 10, False)
        finally:
            os.close(rep_r)
        try:
            r = json.loads(bytes(buf)) if how == "replied" else None
        except ValueError:
            r = None
        if isinstance(r, dict) and set(r) == {"n", "error"} and r["n"] == n and isinstance(r["error"], str):
            mine.close()
            raise RuntimeError(r["error"][:500])
        pid = r.get("pid") if isinstance(r, dict) and set(r) == {"n", "pid"} and r["n"] == n else None
        if type(pid) is not int or not self._adopted(pid):
            mine.close()
            self.kill_worker(wid)
            self.kill_strays()
            raise RuntimeError(
                "the interpreter did not branch as asked (it misbehaved or died); it was restarted"
            )
        # A branch is a copy of its parent, waiting in the same loop at the same stack address.
        branch = self._register(pid, mine, parent.mark)
        self.workers[branch].vitals = parent.vitals
        return branch

    def _adopted(self, pid: int) -> bool:
        """Whether ``pid`` is a new branch: a live orphan of ours, not already a worker."""
        if pid <= 1 or any(w.pid == pid for w in self.workers.values()):
            return False
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # its parent exits just after answering: wait for the reparenting
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                return False
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == os.getpid():
                return True
            time.sleep(0.0005)
        return False

    def reset(self) -> dict[str, Any]:
        for wid in list(self.workers):
            if wid != self.zygote:  # it never ran code: it stays for the next session
                self.kill_worker(wid)
        clean = self.kill_strays()
        clean &= self.wipe(self.scratch) and self.wipe_ipc()
        problems = self.health()
        return {"clean": clean and not problems, "problems": problems}
