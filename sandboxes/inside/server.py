"""The supervisor's protocol server: requests from the host on fd 0, replies on fd 1.

Ops: ``ping``; ``run`` (one-shot: a fresh worker in a fresh dir, its status from ``waitpid``, then
everything it left is killed and wiped and the box health-checked); ``spawn``, ``exec``, ``fork``, ``kill``
(session workers); ``reset`` (kill all, wipe all, health check). The server enforces each call's wall
clock and the output cap from outside the code's processes. Nothing a worker sends is trusted: a session
reply is checked field by field and anything else is the code's ``error`` (the worker is then restarted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from .accounting import _child_io, _safe_rel, _stdin_fd
from .frames import Blobs, encode, read_frame, write_all
from .procs import become_grader, drop_to, harden_env, oom_kills, open_proc
from .worker import run_once
from .workers import Workers

__all__ = ["Server"]


class Server(Workers):
    """The protocol (``handle``, ``serve``) and one-shot runs; sessions in `Workers` and `Calls`, output
    and statuses in `Accounting`."""

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
