"""A worker: one persistent Python interpreter, forked from the supervisor (or from another worker).

It reads ``exec`` and ``fork`` frames on fd 3 (a socket to the supervisor); the code's stdout and stderr are
fds 1 and 2 (pipes the supervisor reads and caps); fd 0 is /dev/null or the call's stdin. Nothing here
enforces limits: the supervisor does, from outside this process.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import linecache
import os
import socket
import sys
import traceback
import types
from typing import Any

from .frames import FRAME, Blobs, decode, encode, read_exact, write_all


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


_null_stdin: list[Any] = []  # the /dev/null stdin object, reused while calls bring no stdin


def _set_stdin(data: bytes | None) -> None:
    """fd 0 is /dev/null unless the call brings stdin, which then sits in an anonymous memory file."""
    if data is None and _null_stdin and sys.stdin is _null_stdin[0]:
        return  # already /dev/null (a session's hot path)
    if data is None:
        fd = os.open(os.devnull, os.O_RDONLY)
    else:
        fd = os.memfd_create("stdin")
        write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)), errors="replace")
    _null_stdin[:] = [sys.stdin] if data is None else []


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


def become_worker(ctrl: int, out: int, err: int) -> socket.socket:
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
    # The code's globals are a real __main__ module, so pickle (and multiprocessing) find what it defines.
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv[:] = [
        "-c"
    ]  # as `python -c CODE` would have it: the supervisor's own arguments are not the code's
    namespace: dict[str, Any] = main.__dict__
    calls = 0
    me = os.getpid()
    while True:
        try:
            header, blobs, fds = _recv_frame(sock)
        except (EOFError, OSError):
            os._exit(0)  # the server is gone
        if header["op"] == "exec":
            calls += 1
            code = blobs["code"].decode("utf-8", "replace")
            reply = _exec_code(code, blobs.get("stdin"), namespace, f"<cell {calls}>")
            if os.getpid() != me:
                os._exit(0)  # a child the code forked and let fall through: only the worker may answer
            sock.sendall(encode(reply))
        elif header["op"] == "fork":
            try:
                first = os.fork()
            except OSError as exc:  # e.g. the pids cap: the branch fails, this interpreter lives on
                for fd in fds:
                    os.close(fd)
                sock.sendall(encode({"error": f"fork failed: {exc}"}))
                continue
            if first == 0:
                try:
                    # Double fork: the grandchild is orphaned at once and adopted by the server (a subreaper),
                    # so the server can wait for it like any worker it spawned itself.
                    if os.fork() != 0:
                        os._exit(0)
                    os.setsid()
                    sock.close()
                    sock = become_worker(*fds)
                    me = os.getpid()
                    sock.sendall(encode({"pid": me}))
                    continue
                except BaseException:
                    os._exit(1)
            for fd in fds:
                os.close(fd)
            os.waitpid(first, 0)
            sock.sendall(encode({"ok": True}))
