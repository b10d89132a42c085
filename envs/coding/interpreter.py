"""One episode's Python interpreter on a sandbox session, shared by the code envs (PythonMath, Coding).

- ``shared_sandbox(backend, **options)``: one ``toolgym.sandboxes`` sandbox per process and settings, so every
  env of a process draws its sessions from one warm pool.
- ``Interpreter``: opens a session lazily (the first call takes a box from the pool), runs code REPL style
  (a bare last expression is shown, as in Jupyter), forks for ``get_state`` and closes on ``reset``/``close``.
  A ``sandbox_error`` result raises ``InfrastructureError``, which the env loop turns into
  ``info["truncation"] = "env_error"``; everything the code itself does (exceptions, timeouts, crashes, OOM)
  is an observation for the model.
- ``render``: an ``ExecResult`` as observation text, cut to a size with a marker.
- ``InterpreterEnv``: the base of the envs with a python tool (Coding, PythonMath, ReasoningGym): starts the
  interpreter with each episode, snapshots it for forks and closes it.

What is covered: state across calls, recovery after the code kills its interpreter (the next call says so),
branching by session fork. What is not covered: branches of one episode share one container and run one
call at a time (see ``toolgym.sandboxes.session``).
"""

from __future__ import annotations

import ast
import contextlib
import threading
from typing import Any

from toolgym.envs.base import ToolEnv
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.sandboxes import ExecResult, Sandbox, Session, get_sandbox

_SANDBOXES: dict[tuple[str, tuple[tuple[str, Any], ...]], Sandbox] = {}
_LOCK = threading.Lock()
_SHOW = "(lambda __tg_v: None if __tg_v is None else print(repr(__tg_v)))("


def shared_sandbox(backend: str = "auto", **options: Any) -> Sandbox:
    """The process's sandbox for these settings (created on first use; ``options`` are ``Limits`` fields)."""
    key = (backend, tuple(sorted((k, repr(v)) for k, v in options.items())))
    with _LOCK:
        box = _SANDBOXES.get(key)
        if box is None:
            box = _SANDBOXES[key] = get_sandbox(backend, **options)
        return box


def resolve_sandbox(sandbox: Sandbox | str | None, options: dict[str, Any] | None) -> Sandbox:
    """An env's ``sandbox`` argument: a ``Sandbox``, or a backend name ("auto", "docker", "process")."""
    if isinstance(sandbox, Sandbox):
        if options:
            raise ConfigError("pass sandbox_options only with a backend name, not with a Sandbox object")
        return sandbox
    if sandbox is None:
        sandbox = "auto"
    if not isinstance(sandbox, str):
        raise ConfigError(f"sandbox must be a Sandbox or a backend name, got {type(sandbox).__name__}")
    return shared_sandbox(sandbox, **(options or {}))


def show_last_expression(code: str) -> str:
    """``code`` with a bare final expression wrapped so its repr is printed (None is not), as a notebook
    cell shows it; line numbers stay the same. Code that does not parse here is returned unchanged.

    >>> show_last_expression("x = 2\\nx ** 10")
    'x = 2\\n(lambda __tg_v: None if __tg_v is None else print(repr(__tg_v)))(x ** 10)'
    >>> show_last_expression("y = 1")
    'y = 1'
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    node = tree.body[-1].value
    if node.end_lineno is None or node.end_col_offset is None:
        return code
    lines = code.splitlines(keepends=True)
    # ast offsets are UTF-8 byte offsets within a line
    first, last = node.lineno - 1, node.end_lineno - 1
    end = lines[last].encode()
    lines[last] = (end[: node.end_col_offset] + b")" + end[node.end_col_offset :]).decode()
    start = lines[first].encode()
    lines[first] = (start[: node.col_offset] + _SHOW.encode() + start[node.col_offset :]).decode()
    return "".join(lines)


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars``: the head and the tail kept (a traceback's last line matters),
    a marker saying how much was dropped in between.

    >>> truncate("a" * 10 + "b" * 10, 12)
    'aaaaaaaa\\n[... 8 characters truncated ...]\\nbbbb'
    """
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{text[len(text) - tail :]}"


def render(result: ExecResult, max_chars: int, timeout: float) -> str:
    """What the model reads after a call: stdout, then stderr (tracebacks), then what stopped the code."""
    notes: list[str] = []
    if result.restarted:
        notes.append("[the interpreter was restarted: variables from earlier calls are gone]")
    body = result.stdout
    if result.stderr:
        body += ("" if not body or body.endswith("\n") else "\n") + result.stderr
    if result.truncated:
        body += "\n[output cut at the sandbox's limit]"
    if result.status == "timeout":
        notes.append(f"[stopped: the code ran past the {timeout:g} s time limit; the interpreter restarts]")
    elif result.status == "oom":
        notes.append("[stopped: out of memory; the interpreter restarts if it died]")
    elif result.status == "error" and not result.stderr and result.exit_code not in (0, None):
        notes.append(f"[the code exited with status {result.exit_code}]")
    elif result.status == "error" and result.exit_code is None:
        notes.append(f"[the code could not run: {result.detail}]")
    text = truncate(body, max_chars)
    if not text.strip() and not notes:
        return "(no output)"
    lead = [n for n in notes if n.startswith("[the interpreter was restarted")]
    tail = [n for n in notes if n not in lead]
    return "\n".join([*lead, *([text.rstrip("\n")] if text.strip() else []), *tail])


class Snapshot:
    """A frozen branch of an interpreter, kept in ``get_state()``; deep copies share it (it cannot be
    copied), and it closes when the last state holding it is gone."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def __deepcopy__(self, memo: dict[int, Any]) -> Snapshot:
        return self

    def close(self) -> None:
        self.session.close()

    def __del__(self) -> None:
        session = getattr(self, "session", None)
        if session is not None and not session.closed:
            with contextlib.suppress(Exception):  # at interpreter exit the pool may be gone already
                session.close()


class Interpreter:
    """An episode's session; ``run`` raises ``InfrastructureError`` on a sandbox fault. The sandbox is
    resolved on first use (``toolgym list`` builds envs without docker). ``start()`` opens a new session
    for an episode; its first call starts the interpreter in the same round trip."""

    def __init__(self, sandbox: Sandbox | str | None, options: dict[str, Any] | None, timeout: float) -> None:
        if isinstance(sandbox, Sandbox) and options:
            raise ConfigError("pass sandbox_options only with a backend name, not with a Sandbox object")
        if not isinstance(sandbox, (Sandbox, str)) and sandbox is not None:
            raise ConfigError(f"sandbox must be a Sandbox or a backend name, got {type(sandbox).__name__}")
        self._spec, self._options = sandbox, options
        self._sandbox: Sandbox | None = None
        self.timeout = timeout
        self._session: Session | None = None
        self._used = False  # whether the model's code ran in this session (else there is nothing to fork)

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox (resolved now if needed: InfrastructureError when docker was asked for and is missing)."""
        if self._sandbox is None:
            self._sandbox = resolve_sandbox(self._spec, self._options)
        return self._sandbox

    @property
    def can_fork(self) -> bool:
        """Whether its sessions can branch (not under gVisor), known without starting a sandbox."""
        sb = self._sandbox or (self._spec if isinstance(self._spec, Sandbox) else None)
        if sb is not None:
            return sb.supports_fork
        return (self._options or {}).get("runtime") != "runsc"

    def start(self) -> None:
        """A new session for a new episode. A session in which no code of the model's ran is kept as it
        is (episodes ended without code cost nothing). The session takes a box from the pool at its first
        call, which also starts its interpreter (one supervisor round trip); the last episode's box is
        reset by the pool in the background."""
        if self._session is not None and not self._used and not self._session.closed:
            return
        self.close()
        self._session = self.sandbox.session()

    def run(self, code: str, *, stdin: str | None = None, timeout: float | None = None) -> ExecResult:
        if self._session is None:
            self._session = self.sandbox.session()
        self._used = True
        result = self._session.run(code, timeout=timeout or self.timeout, stdin=stdin)
        if result.infra_failure:
            raise InfrastructureError(f"the sandbox failed: {result.detail or 'sandbox_error'}")
        return result

    def snapshot(self) -> Snapshot | None:
        """A branch holding this interpreter's current state (None before any code ran)."""
        if self._session is None or not self._used:
            return None
        return Snapshot(self._session.fork())

    def restore(self, snapshot: Snapshot | None) -> None:
        """Continue from ``snapshot`` (a new branch of it, so one snapshot can be restored many times)."""
        self.close()
        if snapshot is not None:
            self._session = snapshot.session.fork()
            self._used = True

    def close(self) -> None:
        self._used = False
        if self._session is not None:
            session, self._session = self._session, None
            session.close()


class InterpreterEnv(ToolEnv):
    """An env whose tools run code in one ``Interpreter`` (``self._interpreter``; None where the family's
    python tool is off). The interpreter's session is the episode's one resource beyond plain data: each
    episode starts it, a fork snapshots it (``extra_state``), ``close`` gives it back. Everything else that
    changes in an episode lives in the family's ``new_episode()`` object."""

    _interpreter: Interpreter | None = None
    _index: int | None = None  # ``reset(options={"index": i})``: the task ``make_task`` picks

    @property  # type: ignore[misc]
    def supports_fork(self) -> bool:  # type: ignore[override]
        """False where the sandbox cannot branch a session (gVisor): rollouts replay prefixes instead."""
        return self._interpreter is None or self._interpreter.can_fork

    def begin_episode(self, options: dict[str, Any] | None) -> None:
        if self._interpreter is not None:
            self._interpreter.start()  # a missing docker fails here, not in a step
        self._index = None if options is None else options.get("index")

    def extra_state(self) -> Snapshot | None:
        return None if self._interpreter is None else self._interpreter.snapshot()

    def load_extra_state(self, state: Snapshot | None) -> None:
        if self._interpreter is not None:
            self._interpreter.restore(state)

    def close(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
        super().close()
