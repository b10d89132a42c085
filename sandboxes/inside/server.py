"""The supervisor's protocol server: requests from the host on fd 0, replies on fd 1.

Ops: ``ping``; ``run`` (one-shot: a fresh worker in a fresh dir, its status from ``waitpid``, then
everything it left is killed and wiped and the box health-checked); ``spawn``, ``exec``, ``fork``, ``kill``
(session workers); ``reset`` (kill all, wipe all, health check). The server enforces each call's wall
clock and the output cap from outside the code's processes. Nothing a worker sends is trusted: a session
reply is checked field by field and anything else is the code's ``error`` (the worker is then restarted).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import re
import select
import signal
import socket
import time
from typing import Any

from .frames import Blobs, encode, read_frame, write_all
from .procs import (
    Reaper,
    Worker,
    become_grader,
    drop_to,
    harden_env,
    oom_kills,
    open_proc,
    pread_proc,
    prepare_worker,
    set_name,
)
from .worker import run_once, session_loop

MAX_REPLY = 512  # a genuine worker reply is a few dozen bytes
INLINE_CODE = 32 << 10  # session code up to this size travels in the request message, bigger in a memfd
MISBEHAVED = "the code wrote on the supervisor's reply channel"
ZYGOTE_NAME = b"tg-spare"  # the comm of a box's zygote worker, which never runs code (tests tell it apart)
# Exactly what a worker's loop writes (`worker.session_loop`), nothing else: one regex match per call.
REPLY = re.compile(
    rb'\{"n": ([1-9][0-9]{0,17}), "exc": (null|"[^"\\\x00-\x1f]{1,800}"), "exit": ([0-9]{1,3})\}'
)


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


class Server(Reaper):
    def __init__(
        self,
        scratch: list[str],
        contained: bool,
        max_output: int,
        uid: int,
        gid: int,
        limits: dict[str, int],
        subreaper: bool = True,
    ) -> None:
        super().__init__(scratch, contained)
        self.subreaper = subreaper
        self.max_output = max_output
        self.uid, self.gid, self.limits = uid, gid, limits
        self.env = dict(os.environ)
        harden_env(self.env)
        self.next_wid = 1
        self.runs = 0
        self.zygote: int | None = None  # wid of a worker that never ran code (`spawn`)
        self.null = os.open(os.devnull, os.O_RDONLY)  # the stdin of session calls that bring none
        me = os.getpid()
        self.my_children = open_proc(f"/proc/{me}/task/{me}/children")

    # -- one-shot runs
    def run_once(self, header: dict[str, Any], blobs: Blobs) -> tuple[dict[str, Any], Blobs]:
        self.runs += 1
        self.drop_zygote()  # a one-shot run has the box to itself (and its cleanup kills everything at once)
        files = {k[len("file:") :]: v for k, v in blobs.items() if k.startswith("file:")}
        bad = [rel for rel in files if not _safe_rel(rel)]
        if bad:
            msg = f"file path {bad[0]!r} must be relative and stay inside the work dir"
            return {"status": "error", "exit_code": None, "duration_s": 0.0, "truncated": False,
                    "detail": f"could not write files: {msg}", "clean": True}, {"stdout": b"", "stderr": msg.encode()}  # fmt: skip
        workdir = os.path.join(self.scratch[0], f"run-{self.runs}")
        grader = bool(header.get("grader"))
        env = dict(self.env)
        if grader:
            env.update(TOOLGYM_CANDIDATE_UID=str(self.uid), TOOLGYM_CANDIDATE_GID=str(self.gid))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = _stdin_fd(blobs.get("stdin"))
        oom_before = oom_kills()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                _child_io(stdin, out_w, err_w)
                if grader:
                    become_grader(self.limits)
                else:
                    drop_to(self.uid, self.gid, self.limits)
                os.environ.clear()
                os.environ.update(env)
                os.umask(0o077)
                run_once(blobs["code"], workdir, files)
            finally:
                os._exit(1)
        for fd in (out_w, err_w, stdin):
            os.close(fd)
        pidfd = self._pidfd(pid)
        bufs = {out_r: bytearray(), err_r: bytearray()}
        how, truncated = self._pump(bufs, pid, pidfd, None, t0 + float(header["timeout"]), True)
        raw = self.wait_status(pid, 0) if how == "exited" else None
        if raw is None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        clean = self.kill_strays()
        truncated |= self._drain(bufs)
        for fd in (out_r, err_r, pidfd):
            if fd >= 0:
                os.close(fd)
        self.wait_status(pid, 0.5 if raw is None else 0)
        status, detail, exit_code = self._status(how, raw, bufs[err_r], oom_before, float(header["timeout"]))
        clean &= self.wipe(self.scratch) and self.wipe_ipc()
        problems = self.health()
        reply = {
            "status": status,
            "exit_code": exit_code,
            "duration_s": time.monotonic() - t0,
            "truncated": truncated,
            "detail": detail,
            "clean": clean and not problems,
            "problems": problems,
        }
        return reply, {"stdout": bytes(bufs[out_r]), "stderr": bytes(bufs[err_r])}

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
            except OSError:
                return True  # no ptrace access here (documented): the other checks still hold
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
                exc, exit_code = parsed
                status = "ok" if exc is None and exit_code == 0 else "error"
                if status == "error" and (exc == "MemoryError" or 0 <= oom_before < oom_kills()):
                    status = "oom"  # its own MemoryError, or the OOM killer took one of its processes
                threads, vitals = w.state()
                if threads > 1:
                    alive = False
                    detail = "a thread the code started outlived its call (a session keeps no threads between calls)"
                elif vitals != w.vitals:
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

    def _strays(self) -> bool:
        """Whether any process but the workers lives below us (a /proc scan; zombies do not count)."""
        self.reap()
        keep = {w.pid for w in self.workers.values()}
        return any(p not in keep for p in self.descendants())

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

    @staticmethod
    def _parse_reply(raw: bytes, n: int) -> tuple[str | None, int] | None:
        """(exception name or None, exit status) from a worker's reply, or None when it is not exactly
        what a worker sends."""
        m = REPLY.fullmatch(raw)
        if m is None or int(m[1]) != n or int(m[3]) > 255:
            return None
        if m[2] == b"null":
            return None, int(m[3])
        try:
            exc = m[2][1:-1].decode()
        except UnicodeDecodeError:
            return None
        return (exc, int(m[3])) if exc.isidentifier() and len(exc) <= 200 else None

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

    def handle(self, header: dict[str, Any], blobs: Blobs) -> tuple[dict[str, Any], Blobs]:
        op = header["op"]
        if op == "ping":
            return {"ok": True, "workers": len(self.workers) - (self.zygote is not None)}, {}
        if op == "run":
            return self.run_once(header, blobs)
        if op == "spawn":
            try:
                return {"wid": self.spawn()}, {}
            except OSError as exc:  # e.g. the branches of a session used up the pids cap
                return {"spawn_error": f"{type(exc).__name__}: {exc}"}, {}
        if op == "exec":  # with "spawn": on a new worker (one round trip for a session's first call)
            wid, extra = header.get("wid"), {}
            if header.get("spawn"):
                try:
                    wid = self.spawn()
                except OSError as exc:
                    return {"spawn_error": f"{type(exc).__name__}: {exc}"}, {}
                extra = {"wid": wid}
            if wid not in self.workers:
                return {"status": "gone", "alive": False}, {}
            reply, out = self.execute(wid, blobs["code"], blobs.get("stdin"), float(header["timeout"]))
            return {**reply, **extra}, out
        if op == "fork":
            try:
                return {"wid": self.fork(header["wid"])}, {}
            except (RuntimeError, OSError) as exc:
                return {"fork_error": f"{type(exc).__name__}: {exc}"}, {}
        if op == "kill":
            self.kill_worker(header["wid"])
            return {"clean": self.kill_strays()}, {}
        if op == "reset":
            return self.reset(), {}
        raise ValueError(f"unknown op {op!r}")

    def serve(self) -> None:
        while True:
            try:
                header, blobs = read_frame(0)
            except EOFError:
                return
            header = {k: (int(v) if k == "wid" else v) for k, v in header.items()}
            try:
                reply, out = self.handle(header, blobs)
            except Exception as exc:  # a fault of ours: reported (sandbox_error), the server keeps serving
                reply, out = {"error": f"{type(exc).__name__}: {exc}"}, {}
            self.reap()
            live = {w.pid for w in self.workers.values()}
            self.exited = {p: st for p, st in self.exited.items() if p in live}
            write_all(1, encode(reply, out))
