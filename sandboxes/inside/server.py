"""The supervisor's protocol server: requests from the host on stdin, replies on stdout.

Ops: ``ping``; ``run`` (one-shot: a fresh worker in a fresh dir, then everything it left is killed and
wiped); ``spawn``, ``exec``, ``fork``, ``kill`` (session workers); ``reset`` (kill all, wipe all). ``exec``
enforces the call's wall clock and the output cap here, from outside the worker.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import time
from typing import Any

from .frames import FRAME, MAX_CTRL_REPLY, Blobs, decode, encode, read_frame, split, write_all
from .procs import PR_SET_DUMPABLE, Reaper, Worker, oom_kills, prctl
from .worker import become_worker, worker_main


def _channel() -> tuple[tuple[socket.socket, int, int], tuple[int, int, int]]:
    """(server ends, worker ends) of a worker's control socket and its stdout/stderr pipes."""
    a, b = socket.socketpair()
    a.setblocking(False)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    return (a, out_r, err_r), (b.detach(), out_w, err_w)


class Server(Reaper):
    def __init__(self, scratch: list[str], contained: bool, max_output: int) -> None:
        super().__init__(scratch, contained)
        self.max_output = max_output
        self.next_wid = 1
        self.runs = 0

    # -- workers
    def spawn(self, workdir: str) -> int:
        mine, theirs = _channel()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            prctl(PR_SET_DUMPABLE, 1)  # the code's own processes behave normally (/proc/self, debuggers)
            mine[0].close()
            os.close(mine[1])
            os.close(mine[2])
            os.chdir(workdir)
            os.umask(0o077)
            try:
                worker_main(become_worker(*theirs))
            finally:
                os._exit(0)  # never fall back into the server's code in this process
        for fd in theirs:
            os.close(fd)
        wid = self.next_wid
        self.next_wid += 1
        self.workers[wid] = Worker(pid, *mine)
        return wid

    def fork(self, wid: int) -> int:
        parent = self.workers[wid]
        mine, theirs = _channel()
        socket.send_fds(parent.ctrl, [encode({"op": "fork"})], list(theirs))
        for fd in theirs:
            os.close(fd)
        mine[0].settimeout(10)
        parent.ctrl.settimeout(10)
        try:
            head, _ = self._read_ctrl(parent.ctrl)
            if "error" in head:
                mine[0].close()
                os.close(mine[1])
                os.close(mine[2])
                raise RuntimeError(head["error"])
            head, _ = self._read_ctrl(mine[0])
        finally:
            parent.ctrl.setblocking(False)  # worker sockets stay non-blocking: every wait is a select
        mine[0].setblocking(False)
        new = self.next_wid
        self.next_wid += 1
        self.workers[new] = Worker(int(head["pid"]), *mine)
        return new

    @staticmethod
    def _read_ctrl(sock: socket.socket) -> tuple[dict[str, Any], Blobs]:
        buf = b""
        while len(buf) < FRAME.size:
            more = sock.recv(FRAME.size - len(buf))
            if not more:
                raise EOFError("worker closed its channel")
            buf += more
        n, m = FRAME.unpack(buf)
        if n + m > MAX_CTRL_REPLY:
            raise ValueError("oversized reply")
        rest = b""
        while len(rest) < n + m:
            more = sock.recv(n + m - len(rest))
            if not more:
                raise EOFError("worker closed its channel")
            rest += more
        return decode(rest[:n], rest[n:])

    def execute(
        self, wid: int, code: bytes, stdin: bytes | None, timeout: float, oneshot: bool
    ) -> tuple[dict[str, Any], Blobs]:
        """Runs code in a worker; returns the reply header and {stdout, stderr}. Kills the worker when it
        times out, dies, floods output (one-shot) or misbehaves; ``alive`` says whether it still serves."""
        w = self.workers[wid]
        oom_before = oom_kills()
        t0 = time.monotonic()
        deadline = t0 + timeout
        bufs = {w.out: bytearray(), w.err: bytearray()}
        blobs = {"code": code} if stdin is None else {"code": code, "stdin": stdin}
        status = self._send(w.ctrl, encode({"op": "exec"}, blobs), deadline)
        detail, reply, truncated = "", None, False
        if not status:
            status, detail, reply, truncated = self._collect(w, bufs, deadline, oneshot)
        for fd in (w.out, w.err):  # what was written before the reply is still in the pipes
            while (data := self._read_some(fd)) and len(bufs[fd]) <= self.max_output:
                truncated |= self._keep(bufs[fd], data, self.max_output)
        alive = status == "done"
        exit_code: int | None = None
        if status == "done" and reply is not None:
            exc = reply.get("exc")
            exit_code = int(reply.get("exit_code") or 0)
            status = "oom" if exc == "MemoryError" else ("ok" if exit_code == 0 and exc is None else "error")
        elif status == "died":
            status, detail, exit_code = self._death(w.pid, oom_before, oneshot)
        elif status == "timeout":
            detail = f"wall clock of {timeout:g} s exceeded"
        elif status == "output_limit":
            detail = f"output over {self.max_output} bytes; the run was stopped"
        if not alive:
            self.kill_worker(wid)
            self.kill_strays()
        header = {
            "status": status,
            "exit_code": exit_code,
            "duration_s": time.monotonic() - t0,
            "truncated": truncated,
            "detail": detail,
            "alive": alive,
        }
        return header, {"stdout": bytes(bufs[w.out]), "stderr": bytes(bufs[w.err])}

    def _collect(
        self, w: Worker, bufs: dict[int, bytearray], deadline: float, oneshot: bool
    ) -> tuple[str, str, dict[str, Any] | None, bool]:
        """Reads output and the worker's reply until it answers, dies or the deadline passes:
        (status: done | died | timeout | output_limit | error, detail, reply, truncated)."""
        ctrl_buf = bytearray()
        watch: list[Any] = [w.ctrl, w.out, w.err]
        truncated = False
        garbage = "the code wrote garbage on the supervisor's channel"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", "", None, truncated
            ready, _, _ = select.select(watch, [], [], left)
            for r in ready:
                if r is not w.ctrl:
                    data = self._read_some(r)
                    if data is None:
                        watch.remove(r)  # the code closed its stdout/stderr
                    else:
                        truncated |= self._keep(bufs[r], data, self.max_output)
                    continue
                try:
                    data = w.ctrl.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    return "died", "", None, truncated
                ctrl_buf += data
                if len(ctrl_buf) > MAX_CTRL_REPLY:
                    return "error", garbage, None, truncated
                if len(ctrl_buf) >= FRAME.size:
                    n, m = FRAME.unpack_from(ctrl_buf)
                    if n + m > MAX_CTRL_REPLY:
                        return "error", garbage, None, truncated
                    if len(ctrl_buf) >= FRAME.size + n + m:
                        try:
                            return "done", "", decode(*split(bytes(ctrl_buf)))[0], truncated
                        except ValueError:
                            return "error", garbage, None, truncated
            if truncated and oneshot:
                return "output_limit", "", None, truncated

    def _death(self, pid: int, oom_before: int, oneshot: bool) -> tuple[str, str, int | None]:
        """(status, detail, exit code) of a worker whose channel closed."""
        raw = self.wait_status(pid, 0.5)
        if raw is None:  # it closed the channel yet lives on: treat as a broken interpreter
            return "error", "the code closed the supervisor's channel", None
        if os.WIFSIGNALED(raw):
            sig = os.WTERMSIG(raw)
            if oom_before >= 0 and oom_kills() > oom_before:
                return "oom", "killed by the out-of-memory killer", -sig
            return "error", f"the interpreter died (signal {sig})", -sig
        code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 1
        return ("ok" if code == 0 and oneshot else "error"), f"the interpreter exited with code {code}", code

    @staticmethod
    def _send(sock: socket.socket, data: bytes, deadline: float) -> str:
        """Writes a request to a worker's non-blocking socket; "" when sent, else "timeout" or "died"."""
        view = memoryview(data)
        try:
            while view:
                try:
                    view = view[sock.send(view) :]
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [sock], [], left)[1]:
                        return "timeout"
        except OSError:
            return "died"
        return ""

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

    def write_files(self, workdir: str, files: dict[str, bytes]) -> None:
        root = os.path.realpath(workdir)
        for rel, data in files.items():
            path = os.path.realpath(os.path.join(root, rel))
            if os.path.isabs(rel) or not path.startswith(root + os.sep):
                raise ValueError(f"file path {rel!r} must be relative and stay inside the work dir")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)

    def handle(self, header: dict[str, Any], blobs: Blobs) -> tuple[dict[str, Any], Blobs]:
        op = header["op"]
        if op == "ping":
            return {"ok": True, "workers": len(self.workers)}, {}
        if op == "run":  # one-shot: fresh worker and dir, then everything it left is killed and wiped
            self.runs += 1
            workdir = os.path.join(self.scratch[0], f"run-{self.runs}")
            os.makedirs(workdir, mode=0o700)
            files = {k[len("file:") :]: v for k, v in blobs.items() if k.startswith("file:")}
            try:
                self.write_files(workdir, files)
            except (ValueError, OSError) as exc:
                self.wipe([workdir] if not self.contained else self.scratch)
                shutil.rmtree(workdir, ignore_errors=True)
                return {
                    "status": "error",
                    "exit_code": None,
                    "duration_s": 0.0,
                    "truncated": False,
                    "detail": f"could not write files: {exc}",
                    "clean": True,
                }, {"stdout": b"", "stderr": str(exc).encode()}
            wid = self.spawn(workdir)
            reply, out = self.execute(wid, blobs["code"], blobs.get("stdin"), header["timeout"], oneshot=True)
            self.kill_worker(wid)
            clean = self.kill_strays()
            if self.contained:
                clean &= self.wipe(self.scratch) and (not self.contained or self.wipe_ipc())
            else:
                self.wipe([workdir])
                shutil.rmtree(workdir, ignore_errors=True)
            return {**reply, "clean": clean}, out
        if op == "spawn":
            workdir = os.path.join(self.scratch[0], "work")
            os.makedirs(workdir, mode=0o700, exist_ok=True)
            return {"wid": self.spawn(workdir)}, {}
        if op == "exec":
            if header["wid"] not in self.workers:
                return {"status": "gone", "alive": False}, {}
            return self.execute(
                header["wid"], blobs["code"], blobs.get("stdin"), header["timeout"], oneshot=False
            )
        if op == "fork":
            try:
                return {"wid": self.fork(header["wid"])}, {}
            except (RuntimeError, OSError, EOFError) as exc:  # e.g. the code used up the pids cap
                return {"fork_error": f"{type(exc).__name__}: {exc}"}, {}
        if op == "kill":
            self.kill_worker(header["wid"])
            return {"clean": self.kill_strays()}, {}
        if op == "reset":
            for wid in list(self.workers):
                self.kill_worker(wid)
            clean = self.kill_strays()
            clean &= self.wipe(self.scratch) and (not self.contained or self.wipe_ipc())
            return {"clean": clean}, {}
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
            except Exception as exc:  # a protocol or OS fault: reported, the server keeps serving
                reply, out = {"error": f"{type(exc).__name__}: {exc}"}, {}
            self.reap()
            live = {w.pid for w in self.workers.values()}
            self.exited = {p: st for p, st in self.exited.items() if p in live}
            write_all(1, encode(reply, out))
