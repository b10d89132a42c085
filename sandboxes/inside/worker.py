"""What runs in the code's own processes (forked from the supervisor, already under the box uid).

One-shot: `run_once` executes the code and ends the process; its exit status (read by the supervisor with
``waitpid``) is the result. Sessions: `session_loop` reads each call from fd 3, a socket the supervisor
writes and this process can only read; every call brings fresh fds for stdin, stdout, stderr and a
one-use reply pipe. The code holds nothing the supervisor trusts: the reply pipe of a call is closed when
the call ends, and anything odd on it is the code's error (the supervisor then restarts the worker).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import json
import linecache
import os
import resource
import signal
import socket
import sys
import traceback
import types
from typing import Any

from .procs import HARDEN, RLIMITS, UNSET, become_user, harden_env, set_name

INLINE_MAX = (32 << 10) + 64  # the supervisor's INLINE_CODE plus the request's head


def exit_status(code: object) -> int:
    """The process exit status CPython gives ``sys.exit(code)``.

    >>> [exit_status(c) for c in (None, 0, 3, 256, -1, 2**70, True, "msg")]
    [0, 0, 3, 0, 255, 255, 1, 1]
    """
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -(2**63) <= code < 2**63 else -1) & 0xFF
    return 1


def fresh_stdio() -> None:
    """New Python objects over fds 0, 1, 2, whatever the code did to sys.stdin/stdout/stderr."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)), errors="replace")
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "wb", closefd=False)), errors="backslashreplace"
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "wb", closefd=False)), errors="backslashreplace", line_buffering=True
    )


def _main_module() -> dict[str, Any]:
    # The code's globals are a real __main__ module, so pickle (and multiprocessing) find what it defines.
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv[:] = ["-c"]  # as `python -c CODE` would have it
    return main.__dict__


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def exec_code(code: str, namespace: dict[str, Any], name: str) -> tuple[str | None, int]:
    """Runs ``code`` as a script would: (name of an uncaught exception or None, exit status)."""
    # Registering the source lets tracebacks show the offending lines, as a file would.
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        exec(compile(code, name, "exec"), namespace)
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            with contextlib.suppress(Exception):
                print(exc.code, file=sys.stderr)
        return None, exit_status(exc.code)
    except BaseException as exc:
        # The first frame is this function: show the code's frames only, as a script's traceback would.
        with contextlib.suppress(Exception):
            traceback.print_exception(
                type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None
            )
        name = type(exc).__name__
        return (name if isinstance(name, str) and name.isidentifier() and len(name) < 100 else "Exception"), 1
    finally:
        _flush()
    return None, 0


def _cell_runner() -> Any:
    """`exec_code` for the session loop, built over C builtins captured now: code that later rebinds
    names in this module or in builtins does not change how the next call's code is compiled and run."""
    exec_, compile_, isinstance_, type_, print_exc = (
        exec,
        compile,
        isinstance,
        type,
        traceback.print_exception,
    )
    setcache, status_of = linecache.cache.__setitem__, exit_status

    def run_cell(code: str, namespace: dict[str, Any], name: str) -> tuple[str | None, int]:
        setcache(name, (len(code), None, code.splitlines(True), name))
        try:
            exec_(compile_(code, name, "exec"), namespace)
        except SystemExit as exc:
            if exc.code is not None and not isinstance_(exc.code, int):
                with contextlib.suppress(Exception):
                    print(exc.code, file=sys.stderr)
            return None, status_of(exc.code)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                print_exc(type_(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
            cls = type_(exc).__name__
            return (
                cls if isinstance_(cls, str) and cls.isidentifier() and len(cls) < 100 else "Exception"
            ), 1
        finally:
            _flush()
        return None, 0

    return run_cell


def run_once(code: bytes, workdir: str, files: dict[str, bytes]) -> None:
    """A one-shot run, in its own fresh process: write the files, run, then interpreter-style shutdown
    (atexit handlers, then the globals are dropped so ``__del__`` runs; a full garbage collection is
    skipped, it would cost milliseconds per run), all inside the wall clock."""
    status = 1
    try:
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        for rel, data in files.items():
            path = os.path.join(workdir, rel)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        os.chdir(workdir)
        fresh_stdio()
        namespace = _main_module()
        exc, status = exec_code(code.decode("utf-8", "replace"), namespace, "<string>")
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            namespace.clear()  # drops the globals: __del__ runs (objects in reference cycles excepted)
        _flush()
    except BaseException as exc:  # files could not be written (disk full, fsize): the code's run failed
        with contextlib.suppress(Exception):
            os.write(2, f"could not prepare the run: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(status)


def _read_fd(fd: int) -> bytes:
    chunks = []
    while data := os.read(fd, 1 << 20):
        chunks.append(data)
    return b"".join(chunks)


def session_loop(door: socket.socket, become: tuple[int, int, str] | None = None) -> None:
    """A session's interpreter: one call per request message on ``door`` (fd 3); never returns.

    ``become``: this worker is a box's spare (still root, see `procs.prepare_worker`): it takes the code's
    uid and gid, and its work dir, only when it starts serving a session, after it branched the next spare.

    Nothing a call leaves can act after the call returned: the loop runs inside a profile callback, where
    CPython calls no trace, profile or ``sys.monitoring`` hook at all (``tstate->tracing``), so a hook the
    code installs never runs in this thread (the code's own calls included: debuggers and ``settrace`` do
    nothing in a session); an audit hook guards against new audit hooks; interval timers are cancelled and
    output still buffered is dropped at the end of each call.

    What the loop itself calls between two calls is bound here, as locals, to C functions the code cannot
    rewrite (a module attribute or a Python function's ``__code__`` it could), so code from an earlier
    call cannot slip into the path that receives the next call; the supervisor checks that this loop,
    and not the code, is the one waiting on fd 3 (`toolgym.sandboxes.inside.server`).

    A request is ``exec N[ i]`` (``i``: the call brings stdin) with fds stdin, stdout, stderr, reply (and
    the code in a memfd when it is too big for the message); ``fork N`` with a request socket and a reply
    pipe for the new branch."""
    _guard_audit_hooks()
    _untraced(lambda: _serve(door, become))


def _serve(door: socket.socket, become: tuple[int, int, str] | None) -> None:
    namespace = _main_module()
    me = os.getpid()
    workdir = become[2] if become is not None else os.getcwd()
    recvmsg, cmsg_space = door.recvmsg, socket.CMSG_SPACE(8 * 4)
    from_bytes, dup2, close, write, getpid, exit_ = (
        int.from_bytes,
        os.dup2,
        os.close,
        os.write,
        os.getpid,
        os._exit,
    )
    read, settrace, setprofile, sys_, byteorder = os.read, sys.settrace, sys.setprofile, sys, sys.byteorder
    closerange, open_, devnull, o_rdwr = os.closerange, os.open, os.devnull, os.O_RDWR
    setitimer, timers = signal.setitimer, (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
    # Its rlimits as set up (the supervisor reads nice and policy from /proc, but /proc/PID/limits is not
    # everywhere, e.g. gVisor): a call that changed one retires this interpreter after it answered.
    getrlimit, rlimits = resource.getrlimit, [getattr(resource, name) for name in RLIMITS]
    limits0 = [getrlimit(r) for r in rlimits]
    putenv, unsetenv, environ = os.putenv, os.unsetenv, os.environ
    hard = [(k.encode(), v.encode()) for k, v in HARDEN.items()]
    unset = [k.encode() for k in UNSET]
    sol_socket, scm_rights = socket.SOL_SOCKET, socket.SCM_RIGHTS
    run_cell = _cell_runner()
    made: list[Any] = [None, None, None]  # the stdout, stderr and stdin objects fresh_stdio made last
    had_input = False
    TextIOWrapper, BufferedReader, FileIO = io.TextIOWrapper, io.BufferedReader, io.FileIO
    while True:
        try:
            data, anc, _flags, _addr = recvmsg(INLINE_MAX, cmsg_space)
        except OSError:
            exit_(0)
        if not data:
            exit_(0)  # the supervisor closed the request socket
        fds = []
        for level, kind, raw in anc:
            if level == sol_socket and kind == scm_rights:
                fds += [from_bytes(raw[i : i + 4], byteorder, signed=True) for i in range(0, len(raw) - 3, 4)]
        head, inline, body = data.partition(b"\n")
        op, _, num = head.partition(b" ")
        num, _, flags = num.partition(b" ")
        n = int(num)
        if op == b"exec" and len(fds) == (4 if inline else 5):
            stdin_fd, out_fd, err_fd, reply_fd = fds[:4]
            chunks = [body]
            if not inline:
                while chunk := read(fds[4], 1 << 20):
                    chunks.append(chunk)
                close(fds[4])
            # Received fds take the lowest free numbers in order, so one the code freed among 0-2 may
            # already be its own target (never another's: each is >= its target).
            if stdin_fd > 3 and out_fd == stdin_fd + 1 and err_fd == stdin_fd + 2:  # the usual case
                dup2(stdin_fd, 0)
                dup2(out_fd, 1)
                dup2(err_fd, 2)
                closerange(stdin_fd, err_fd + 1)  # one close_range(2)
            else:
                for fd, target in ((stdin_fd, 0), (out_fd, 1), (err_fd, 2)):
                    if fd != target:
                        dup2(fd, target)
                        close(fd)
            settrace(None)  # trace and profile hooks of earlier calls do not watch this one
            setprofile(None)
            # fds 0-2 are this call's (above); the Python objects over them are rebuilt unless the last call
            # left them exactly as made (stdin too when the last call had input: its buffer may hold some)
            if (
                sys_.stdout is not made[0]
                or sys_.stderr is not made[1]
                or sys_.stdin is not made[2]
                or made[0].closed
                or made[1].closed
                or made[2].closed
            ):
                fresh_stdio()
                made[:] = [sys_.stdout, sys_.stderr, sys_.stdin]
            elif had_input:
                sys_.stdin = made[2] = TextIOWrapper(
                    BufferedReader(FileIO(0, "rb", closefd=False)), errors="replace"
                )
            had_input = flags == b"i"
            # Child interpreters see the hardened variables whatever the code did: the C environment (what
            # they inherit) is set every call, os.environ is rebuilt when it differs.
            for k, v in hard:
                putenv(k, v)
            for k in unset:
                unsetenv(k)
            with contextlib.suppress(Exception):
                if os.environ is not environ or any(environ.get(k) != v for k, v in HARDEN.items()):
                    environ = os.environ
                    harden_env(environ)
            exc, status = run_cell(b"".join(chunks).decode("utf-8", "replace"), namespace, f"<cell {n}>")
            if getpid() != me:
                exit_(0)  # a child the code forked and let fall through: only the worker may answer
            # Nothing of this call may act in the next one: its interval timers (a signal handler would run
            # in the loop) are cancelled, and output it left in buffers (e.g. printed after closing fd 1)
            # goes to /dev/null, as do objects over fds 0-2 that it replaced or closed (their finalizers
            # flush now, not into the next call's pipes).
            for timer in timers:
                with contextlib.suppress(OSError):
                    setitimer(timer, 0)
            with contextlib.suppress(OSError):
                nul = open_(devnull, o_rdwr)  # takes fd 0, 1 or 2 itself when the code closed one
                for target in (0, 1, 2):
                    if nul != target:
                        dup2(nul, target)
                if nul > 2:
                    close(nul)
            stuck = False
            for obj in made:
                try:
                    obj.flush()
                except Exception:
                    stuck = True  # its buffer may still hold text: the object is replaced below
            if (
                stuck
                or sys_.stdout is not made[0]
                or sys_.stderr is not made[1]
                or sys_.stdin is not made[2]
                or made[0].closed
                or made[1].closed
                or made[2].closed
                or had_input
            ):
                with contextlib.suppress(Exception):
                    fresh_stdio()
                made[:] = [sys_.stdout, sys_.stderr, sys_.stdin]
                had_input = False
            settrace(None)
            setprofile(None)
            # The reply comes after run_cell flushed stdout and stderr: what the code printed is in the pipes.
            reply = b'{"n": %d, "exc": %s, "exit": %d%s}' % (
                n,
                b"null" if exc is None else b'"%s"' % exc.encode(),
                status,
                b"" if [getrlimit(r) for r in rlimits] == limits0 else b', "retire": 1',
            )
            with contextlib.suppress(OSError):
                write(reply_fd, reply)
            close(reply_fd)
        elif op == b"fork" and len(fds) == 2:
            _fork(n, *fds)
            if getpid() != me:  # the new branch: serve its own request socket from now on
                me = getpid()
                door.detach()  # fd 3 now holds the branch's own request socket
                door = socket.socket(fileno=3)
                recvmsg = door.recvmsg
            elif flags == b"s":  # a zygote that branched: it now serves a session, its branch is the zygote
                if become is not None:
                    become_user(become[0], become[1])
                    become = None
                set_name(b"python3")
                with contextlib.suppress(OSError):  # its work dir may have been wiped by a reset
                    os.makedirs(workdir, mode=0o700, exist_ok=True)
                    os.chdir(workdir)
        else:
            for fd in fds:
                close(fd)


def _untraced(body: Any) -> None:
    """Runs ``body`` (which never returns) inside a profile callback: CPython calls no trace, profile or
    monitoring hook while one runs, so nothing the code installs can run in this thread."""

    def enter(_frame: Any, _event: str, _arg: Any) -> None:
        sys.setprofile(None)
        body()

    sys.setprofile(enter)
    len(())  # any call of a builtin enters the callback
    os._exit(1)  # not reached: body never returns


def _audit_guard(event: str, args: tuple[Any, ...], me: Any = None) -> None:
    # No globals, no closure: nothing the code can rebind changes what this does. A raised exception keeps
    # a new audit hook out (sys.addaudithook); ``me`` is this function (`_guard_audit_hooks`), whose code
    # and defaults may not be replaced (numpy and others replace other functions' code: that stays allowed).
    if event == "sys.addaudithook" or (event == "object.__setattr__" and args[0] is me):
        raise RuntimeError("not allowed in a sandbox session")


def _guard_audit_hooks() -> None:
    """An audit hook runs whatever the tracing state: the code of a session may not add one (it would run
    in the worker's loop, e.g. on the next call's ``compile``)."""
    _audit_guard.__defaults__ = (_audit_guard,)
    sys.addaudithook(_audit_guard)


def _answer(fd: int, reply: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, json.dumps(reply).encode())
    os.close(fd)


# clone(2) with CLONE_PARENT: the new process is a child of our parent (the supervisor), so a branch needs
# one fork, not a double fork and a wait for the orphan's adoption; and the fork returns as soon as this
# (already running) process made it, with no new process to schedule first. x86_64 and aarch64 numbers and
# argument orders; elsewhere the double fork below.
CLONE_PARENT, SIGCHLD = 0x00008000, 17
_CLONE_NR = {"x86_64": 56, "aarch64": 220}
_clone: list[Any] = []


def _clone_parent() -> int | None:
    """Like ``os.fork()`` (pid in the parent, 0 in the child) but the child is our parent's child; None
    where that is not available. Safe only in a single-threaded process (the supervisor checks that the
    worker has one thread before asking it to branch): no lock can be held by another thread then, and
    the GIL stays held across the call (``PyDLL``), so the child's interpreter state is consistent."""
    if not _clone:
        import ctypes
        import platform

        nr = _CLONE_NR.get(platform.machine())
        if nr is None:
            _clone.append(None)
        else:
            fn = ctypes.PyDLL(None, use_errno=True).syscall
            fn.restype = ctypes.c_long
            fn.argtypes = [ctypes.c_long] * 6
            _clone.append((fn, nr))
    if _clone[0] is None:
        return None
    fn, nr = _clone[0]
    pid = int(fn(nr, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0))
    if pid < 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


def _become_branch(door_fd: int, reply_fd: int) -> None:
    """In a new branch: its own session, no stdio of its parent's (it gets its own per call), its own
    request socket on fd 3; and a new seed for ``random``, as ``os.fork`` gives a child."""
    os.close(reply_fd)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    os.dup2(door_fd, 3)
    if door_fd != 3:
        os.close(door_fd)
    rnd = sys.modules.get("random")
    if rnd is not None:
        with contextlib.suppress(Exception):
            rnd.seed()


def _fork(n: int, door_fd: int, reply_fd: int) -> None:
    """Branches this interpreter: the new process (a child of the supervisor: CLONE_PARENT, or, where that
    is missing, a grandchild orphaned at once and so adopted by the supervisor, a subreaper) becomes a new
    worker on ``door_fd``; this process (or the middle child) tells the supervisor its pid."""
    supervisor = os.getppid()
    try:
        pid = _clone_parent()
    except OSError as exc:  # e.g. the pids cap: the branch fails, this interpreter lives on
        os.close(door_fd)
        _answer(reply_fd, {"n": n, "error": f"fork failed: {exc}"})
        return
    if pid == 0:
        if os.getppid() != supervisor:
            os._exit(0)  # CLONE_PARENT was ignored (gVisor does): our parent falls back to the double fork
        try:
            _become_branch(door_fd, reply_fd)
            return  # back in session_loop as the new branch
        except BaseException:
            os._exit(1)
    if pid is not None:
        try:  # a child of ours means CLONE_PARENT was ignored
            os.waitpid(pid, 0)
            _clone[:] = [None]
        except ChildProcessError:
            os.close(door_fd)
            _answer(reply_fd, {"n": n, "pid": pid})
            return
    try:
        first = os.fork()
    except OSError as exc:
        os.close(door_fd)
        _answer(reply_fd, {"n": n, "error": f"fork failed: {exc}"})
        return
    if first == 0:
        try:
            second = os.fork()
            if second != 0:
                _answer(reply_fd, {"n": n, "pid": second})
                os._exit(0)
            _become_branch(door_fd, reply_fd)
            return  # back in session_loop as the new branch
        except BaseException:
            os._exit(1)
    os.close(door_fd)
    os.close(reply_fd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(first, 0)
