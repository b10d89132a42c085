"""reasoning-gym's verifiers run on the model's answer: screened, and under a hard time limit.

Several verifiers ``eval`` the answer as Python: ``sympy.parse_expr`` (puzzle24, countdown, the integration
and polynomial tasks) or plain ``eval`` in the verifier's module (binary_matrix, n_queens, spiral_matrix,
string_insertion). An answer such as ``__import__('os').system(...)`` ran in the trainer's process, and
arithmetic such as ``9**9**9**9`` or ``Fraction("1e999999999")`` (coin_flip, any task that parses numbers)
held the step for hours. So:

- ``guarded(dataset)``: while a verifier runs, the ``eval`` of its module is ``ast.literal_eval`` and
  ``parse_expr`` (its module's, sympy's, the one ``sympify`` uses) refuses text that could run code: only
  arithmetic on numbers, symbols and named math functions passes (no attribute, string, dunder, or builtin or
  sympy name beyond ``MATH_NAMES``). A refused text is a ``ValueError`` in the verifier, which scores it as
  a wrong answer; its other checks (an exact match first, in most) run as they are.
- ``score_in_child(score, timeout_s)``: the verifier runs in a forked child that is killed at the deadline
  (a verifier stuck in C code cannot be interrupted in-process); a timeout or a crash scores 0 (the text was
  the model's), a fork that fails is an ``InfrastructureError``. Without ``os.fork`` it runs in-process.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import select
import signal
import struct
import sys
import tokenize
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from toolgym.errors import InfrastructureError

VERIFY_TIMEOUT_S = 5.0
# sympy's and Python's names an answer may use (any other name that is not theirs becomes a Symbol)
MATH_NAMES = frozenset((
    "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "atan2", "sinh", "cosh", "tanh",
    "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "cbrt", "root", "Abs", "abs", "pi", "E", "I", "oo",
    "factorial", "Rational", "Integer", "Float", "gamma", "erf", "sign", "floor", "ceiling", "Min", "Max",
    "min", "max", "True", "False", "None",
))  # fmt: skip


@cache
def _reserved_names() -> frozenset[str]:
    """Names that mean something to ``parse_expr``'s eval: Python's builtins and ``from sympy import *``."""
    import sympy

    return frozenset(sympy.__all__) | frozenset(dir(builtins))


def sympy_safe(answer: str) -> bool:
    """Whether ``parse_expr(answer)`` can only compute: see the module docstring."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(answer).readline))
    except (tokenize.TokenError, SyntaxError, ValueError):
        return False
    reserved = _reserved_names()
    previous = ""
    for tok in tokens:
        if tok.type == tokenize.STRING:
            return False  # sympify("...") and friends parse strings: a string could hide any code
        if tok.type == tokenize.NAME:
            name = tok.string
            if previous == "." or "_" in name or (name in reserved and name not in MATH_NAMES):
                return False
        if tok.type == tokenize.OP or tok.type == tokenize.NAME:
            previous = tok.string
    return True


def _safe_parse_expr(real: Callable[..., Any]) -> Callable[..., Any]:
    def parse_expr(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str) and not sympy_safe(text):
            raise ValueError("not evaluated: the text is more than arithmetic on numbers and symbols")
        return real(text, *args, **kwargs)

    return parse_expr


def _literal_eval(source: Any, *args: Any) -> Any:
    if not isinstance(source, str):
        raise ValueError("not evaluated: only a literal in a string is")
    return ast.literal_eval(source.strip())


@contextlib.contextmanager
def guarded(dataset: Any) -> Iterator[None]:
    """While it is open, the verifier of ``dataset`` (a reasoning-gym dataset) cannot run the answer as
    code (see the module docstring). Restores every name it replaced."""
    import sympy
    import sympy.parsing.sympy_parser as parser

    module = sys.modules[type(dataset).__module__]
    real = parser.parse_expr
    safe = _safe_parse_expr(real)
    patches: list[tuple[Any, str, Any]] = [(module, "eval", _literal_eval), (sympy, "parse_expr", safe)]
    patches.append((parser, "parse_expr", safe))
    if getattr(module, "parse_expr", None) is real:
        patches.append((module, "parse_expr", safe))
    missing = object()
    saved = [(obj, name, getattr(obj, name, missing)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            if value is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


def _limit_memory(extra_bytes: int = 1 << 30) -> None:
    """Caps the child's address space at what it has plus ``extra_bytes`` (a bomb fails, not the host)."""
    import resource

    with contextlib.suppress(OSError, ValueError), open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + extra_bytes, size + extra_bytes))


def score_in_child(score: Callable[[], float], timeout_s: float | None = None) -> float:
    """``score()`` in a forked child killed after ``timeout_s`` (``VERIFY_TIMEOUT_S``); 0.0 when it ran out
    of time or died."""
    timeout_s = VERIFY_TIMEOUT_S if timeout_s is None else timeout_s
    if not hasattr(os, "fork"):
        return score()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        raise InfrastructureError(f"could not start reasoning-gym's verifier: {exc}") from exc
    if pid == 0:  # the child: score, report, and leave without running the parent's exit hooks
        status = 1
        try:
            os.close(read_fd)
            _limit_memory()
            os.write(write_fd, struct.pack("d", score()))
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        data = os.read(read_fd, 8) if ready else b""
    finally:
        os.close(read_fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return struct.unpack("d", data)[0] if len(data) == 8 else 0.0
