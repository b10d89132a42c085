"""The supervisor that runs *inside* the sandbox: a container (docker backend) or a child process (process
backend). It is a single stdlib-only file, bind-mounted read-only into containers, and it is also imported on
the host for the frame helpers (`encode`, `read_frame`), so nothing runs at import time.

Modes (``python3 runner.py MODE``):

- ``init``: PID 1 of the container. It only reaps orphans. A PID-1 process cannot be killed from inside its
  own pid namespace, so code that runs ``kill(-1, 9)`` or ``kill(1, 9)`` cannot stop the container (docker's
  own ``--init`` would exit as soon as its single child is killed).
- ``serve``: the protocol server, started by the host on a ``docker exec`` stream (or a pipe). It reads
  request frames on stdin and writes reply frames on stdout. It forks *workers*, one persistent Python
  interpreter each, and enforces the per-call wall clock and the output cap itself; the host keeps a
  second, looser wall clock in case this process is stopped or killed.

Frame: 8 bytes ``>II`` (header length, body length), a JSON header, then the raw body. The header's
``blobs`` lists ``[name, size]`` pairs that cut the body, so code, stdin and output travel as bytes.

What is covered: wall-clock kills of a worker's whole process group; processes that escape with
``setsid``/double fork (this process is a child subreaper, so orphans come back to it and are killed);
output capped at the source; invalid UTF-8 (bytes travel raw); OOM told apart from other kills through the
memory cgroup's ``oom_kill`` counter; workers forked copy-on-write for session branches.
What is not covered: anything the kernel and the container settings do not enforce. This file trusts the
host and not the code; the code runs under the same uid, so it can kill or stop this server; the host
notices (stream closed or its own deadline) and replaces the sandbox.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import io
import json
import linecache
import os
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

FRAME = struct.Struct(">II")
MAX_CTRL_REPLY = 1 << 20  # a worker's reply is small; a bigger one is forged by the code
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4  # non-dumpable: same-uid code cannot ptrace the process or read its /proc secrets


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


Blobs = dict[str, bytes]


def encode(header: dict[str, Any], blobs: Blobs | None = None) -> bytes:
    """One frame. >>> decode(*split(encode({"op": "x"}, {"a": b"hi"})))
    ({'op': 'x'}, {'a': b'hi'})
    """
    blobs = blobs or {}
    head = json.dumps({**header, "blobs": [[k, len(v)] for k, v in blobs.items()]}).encode()
    return FRAME.pack(len(head), sum(len(v) for v in blobs.values())) + head + b"".join(blobs.values())


def split(frame: bytes) -> tuple[bytes, bytes]:
    """Cuts a whole frame into (header bytes, body): a helper for tests and doctests."""
    n, m = FRAME.unpack_from(frame)
    return frame[FRAME.size : FRAME.size + n], frame[FRAME.size + n : FRAME.size + n + m]


def decode(head: bytes, body: bytes) -> tuple[dict[str, Any], Blobs]:
    header = json.loads(head)
    blobs: Blobs = {}
    pos = 0
    for name, size in header.pop("blobs", []):
        blobs[name] = body[pos : pos + size]
        pos += size
    return header, blobs


def read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        data = os.read(fd, min(n, 1 << 20))
        if not data:
            raise EOFError("stream closed")
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[dict[str, Any], Blobs]:
    n, m = FRAME.unpack(read_exact(fd, FRAME.size))
    return decode(read_exact(fd, n), read_exact(fd, m))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ----------------------------------------------------------------------------------------------- worker
def _recv_frame(sock: socket.socket) -> tuple[dict[str, Any], Blobs, list[int]]:
    """Reads one frame from the server; file descriptors ride on its first bytes (fork only)."""
    prefix, fds, _flags, _addr = socket.recv_fds(sock, FRAME.size, 4)
    while len(prefix) < FRAME.size:
        more = sock.recv(FRAME.size - len(prefix))
        if not more:
            raise EOFError
        prefix += more
    n, m = FRAME.unpack(prefix)
    header, blobs = decode(read_exact(sock.fileno(), n), read_exact(sock.fileno(), m))
    return header, blobs, list(fds)


def _set_stdin(data: bytes | None) -> None:
    """fd 0 is /dev/null unless the call brings stdin, which then sits in an anonymous memory file."""
    if data is None:
        fd = os.open(os.devnull, os.O_RDONLY)
    else:
        fd = os.memfd_create("stdin")
        write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)), errors="replace")


def _exec_code(code: str, stdin: bytes | None, namespace: dict[str, Any], name: str) -> dict[str, Any]:
    _set_stdin(stdin)
    # Registering the source lets tracebacks show the offending lines, as a file would.
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    exc_name = None
    exit_code = 0
    try:
        exec(compile(code, name, "exec"), namespace)
    except SystemExit as exc:
        code_ = exc.code
        exit_code = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        if not isinstance(code_, int | None):
            print(code_, file=sys.stderr)
    except BaseException as exc:
        exc_name = type(exc).__name__
        exit_code = 1
        # The first frame is this function: show the code's frames only, as a script's traceback would.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return {"exc": exc_name, "exit_code": exit_code}


def _become_worker(ctrl: int, out: int, err: int) -> socket.socket:
    """Puts the three channel ends on fds 1, 2, 3 and closes everything else the worker inherited."""
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.dup2(ctrl, 3)
    os.closerange(4, 65536)
    null = os.open(os.devnull, os.O_RDONLY)  # fd 0 was the host's request stream: never leave it to the code
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "wb", closefd=False)), errors="backslashreplace"
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "wb", closefd=False)), errors="backslashreplace", line_buffering=True
    )
    return socket.socket(fileno=3)


def worker_main(sock: socket.socket) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    calls = 0
    while True:
        try:
            header, blobs, fds = _recv_frame(sock)
        except (EOFError, OSError):
            os._exit(0)  # the server is gone
        if header["op"] == "exec":
            calls += 1
            reply = _exec_code(
                blobs["code"].decode("utf-8", "replace"), blobs.get("stdin"), namespace, f"<cell {calls}>"
            )
            sock.sendall(encode(reply))
        elif header["op"] == "fork":
            first = os.fork()
            if first == 0:
                # Double fork: the grandchild is orphaned at once and adopted by the server (a subreaper),
                # so the server can wait for it like any worker it spawned itself.
                if os.fork() != 0:
                    os._exit(0)
                os.setsid()
                sock.close()
                sock = _become_worker(*fds)
                sock.sendall(encode({"pid": os.getpid()}))
                continue
            for fd in fds:
                os.close(fd)
            os.waitpid(first, 0)
            sock.sendall(encode({"ok": True}))


# ----------------------------------------------------------------------------------------------- server
class Worker:
    def __init__(self, pid: int, ctrl: socket.socket, out: int, err: int) -> None:
        self.pid, self.ctrl, self.out, self.err = pid, ctrl, out, err

    def close(self) -> None:
        self.ctrl.close()
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)


def _channel() -> tuple[tuple[socket.socket, int, int], tuple[int, int, int]]:
    """(server ends, worker ends) of a worker's control socket and its stdout/stderr pipes."""
    a, b = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    return (a, out_r, err_r), (b.detach(), out_w, err_w)


def _oom_kills() -> int:
    """The memory cgroup's oom-kill counter (v2 memory.events, v1 memory.oom_control); -1 if unreadable."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return -1


class Server:
    def __init__(self, scratch: list[str], contained: bool, max_output: int) -> None:
        self.scratch = scratch
        self.contained = contained  # inside a container of our own: kill(-1) and wiping all scratch are safe
        self.max_output = max_output
        self.workers: dict[int, Worker] = {}
        self.exited: dict[int, int] = {}
        self.next_wid = 1
        self.runs = 0

    # -- process bookkeeping
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

    # -- workers
    def spawn(self, workdir: str) -> int:
        mine, theirs = _channel()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            _prctl(PR_SET_DUMPABLE, 1)  # the code's own processes behave normally (/proc/self, debuggers)
            mine[0].close()
            os.close(mine[1])
            os.close(mine[2])
            os.chdir(workdir)
            os.umask(0o077)
            worker_main(_become_worker(*theirs))
            os._exit(0)
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
            head, _ = self._read_ctrl(mine[0])
        finally:
            parent.ctrl.settimeout(None)
        mine[0].settimeout(None)
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
        cap = self.max_output
        oom_before = _oom_kills()
        bufs = {w.out: bytearray(), w.err: bytearray()}
        truncated = False
        t0 = time.monotonic()
        deadline = t0 + timeout
        status, detail, exit_code = "", "", None
        reply: dict[str, Any] | None = None
        blobs = {"code": code} if stdin is None else {"code": code, "stdin": stdin}
        try:
            w.ctrl.settimeout(max(timeout, 0.001))
            w.ctrl.sendall(encode({"op": "exec"}, blobs))
            w.ctrl.setblocking(False)
        except OSError:
            status = "timeout" if time.monotonic() >= deadline else "died"
        ctrl_buf = bytearray()
        watch: list[Any] = [w.ctrl, w.out, w.err]
        while not status:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select(watch, [], [], left)
            for r in ready:
                if r is w.ctrl:
                    try:
                        data = w.ctrl.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        status = "died"
                        break
                    ctrl_buf += data
                    if len(ctrl_buf) > MAX_CTRL_REPLY:
                        status, detail = "error", "the code wrote garbage on the supervisor's channel"
                        break
                    if len(ctrl_buf) >= FRAME.size:
                        n, m = FRAME.unpack_from(ctrl_buf)
                        if len(ctrl_buf) >= FRAME.size + n + m:
                            try:
                                reply, _ = decode(*split(bytes(ctrl_buf)))
                                status = "done"
                            except ValueError:
                                status, detail = "error", "the code wrote garbage on the supervisor's channel"
                            break
                else:
                    data = self._read_some(r)
                    if data is None:
                        watch.remove(r)  # the code closed its stdout/stderr
                        continue
                    truncated |= self._keep(bufs[r], data, cap)
            if truncated and oneshot and not status:
                status = "output_limit"
        for fd in (w.out, w.err):  # what was written before the reply is still in the pipes
            while (data := self._read_some(fd)) and len(bufs[fd]) <= cap:
                truncated |= self._keep(bufs[fd], data, cap)
        alive = status == "done"
        if status == "done" and reply is not None:
            exc = reply.get("exc")
            exit_code = int(reply.get("exit_code") or 0)
            status = "oom" if exc == "MemoryError" else ("ok" if exit_code == 0 and exc is None else "error")
        elif status == "died":
            raw = self.wait_status(w.pid, 0.5)
            if raw is None:  # it closed the channel yet lives on: treat as a broken interpreter
                status, detail = "error", "the code closed the supervisor's channel"
            elif os.WIFSIGNALED(raw):
                exit_code = -os.WTERMSIG(raw)
                oom = oom_before >= 0 and _oom_kills() > oom_before
                status = "oom" if oom else "error"
                detail = (
                    "killed by the out-of-memory killer"
                    if oom
                    else f"the interpreter died (signal {-exit_code})"
                )
            else:
                exit_code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 1
                status = "ok" if exit_code == 0 and oneshot else "error"
                detail = f"the interpreter exited with code {exit_code}"
        elif status == "timeout":
            detail = f"wall clock of {timeout:g} s exceeded"
        elif status == "output_limit":
            detail = f"output over {cap} bytes; the run was stopped"
        if not alive:
            self.kill_worker(wid)
            self.kill_strays()
        else:
            w.ctrl.setblocking(True)
        header = {
            "status": status,
            "exit_code": exit_code,
            "duration_s": time.monotonic() - t0,
            "truncated": truncated,
            "detail": detail,
            "alive": alive,
        }
        return header, {"stdout": bytes(bufs[w.out]), "stderr": bytes(bufs[w.err])}

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
                clean &= self.wipe(self.scratch)
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
            return {"wid": self.fork(header["wid"])}, {}
        if op == "kill":
            self.kill_worker(header["wid"])
            return {"clean": self.kill_strays()}, {}
        if op == "reset":
            for wid in list(self.workers):
                self.kill_worker(wid)
            clean = self.kill_strays()
            clean &= self.wipe(self.scratch)
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


def init_main() -> None:
    _prctl(PR_SET_DUMPABLE, 0)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)
        except OSError:
            time.sleep(0.5)


def serve_main(argv: list[str]) -> None:
    scratch = [a.split("=", 1)[1] for a in argv if a.startswith("--scratch=")]
    preload = [a.split("=", 1)[1] for a in argv if a.startswith("--preload=")]
    max_output = int(next((a.split("=", 1)[1] for a in argv if a.startswith("--max-output=")), 1 << 20))
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_DUMPABLE, 0)
    for name in preload:  # imported once here, then shared copy-on-write by every worker
        for mod in name.split(","):
            with contextlib.suppress(Exception):
                __import__(mod)
    # Nothing is written before the first request: a docker exec stream may still be inside the HTTP
    # upgrade when the host takes the socket, and early bytes could be lost there.
    server = Server(scratch or ["/tmp"], "--contained" in argv, max_output)
    server.serve()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "serve"
    if mode == "init":
        init_main()
    else:
        serve_main(sys.argv[2:])
