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
- ``score_answer(task, config, size, entry, answer)``: the verifier runs in a worker process of the
  process's shared :class:`~toolgym.rewards.scoring_pool.ScoringPool` (``shared_pool``, the math rewards'
  too; ``TOOLGYM_SCORING_WORKERS`` sizes it) as the ``"reasoning_gym"`` scorer (``SCORER``): a fresh
  interpreter that rebuilds the dataset from (task, config, seed 0, size) once, applies ``guarded`` and a
  memory cap, and is killed at ``VERIFY_TIMEOUT_S`` (a verifier stuck in C code cannot be interrupted
  in-process). A verifier that runs out of that time on the answer scores 0 (the text was the model's); a
  worker that cannot start or set up the dataset is an ``InfrastructureError`` (the episode is env_error).
  Not a fork of the caller: a trainer has threads (a fork while one holds a lock can deadlock the child, and
  a correct answer then "timed out") and CUDA, and a fork of a multi-GB process costs ~0.1 s per answer.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import sys
import tokenize
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from toolgym.rewards.scoring_pool import ScoringPool, shared_pool
from toolgym.rewards.scoring_worker import Scorer

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


def _config_key(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True, default=str)


def _prepare(
    task: str | None = None, config: dict[str, Any] | None = None, size: int | None = None, *rest: Any
) -> None:
    """In a worker, before any answer: reasoning-gym's import, the guard's own imports, and the dataset
    (when ``task`` is given; building one can take a while: word lists, ARC files)."""
    from toolgym.envs.reasoning_gym.tasks import dataset, reasoning_gym

    reasoning_gym()
    sympy_safe("1 + x")
    if task is not None:
        with guarded(dataset(task, config, size)):
            pass


def _prepare_key(
    task: str | None = None, config: dict[str, Any] | None = None, size: int | None = None, *rest: Any
) -> Any:
    return (task, _config_key(config), size)


def _score(
    task: str, config: dict[str, Any] | None, size: int | None, entry: dict[str, Any], answer: str
) -> float:
    """``score_answer(answer, entry)`` of the dataset (task, config, seed 0, size), guarded. A verifier that
    raises on the answer scores 0 (the text was the model's): the worker's (and the in-process pool's)
    handling of any scorer's exception; a MemoryError replaces the worker."""
    from toolgym.envs.reasoning_gym.tasks import dataset

    verifier = dataset(task, config, size)
    with guarded(verifier):
        return float(verifier.score_answer(answer, entry) or 0.0)


# the "reasoning_gym" scorer of toolgym.rewards.scoring_worker: items are (task, config, size, entry, answer)
SCORER = Scorer(score=_score, prepare=_prepare, prepare_key=_prepare_key)


def pool() -> ScoringPool:
    """The pool the verifiers run in: the process's shared one (made on first use), its new workers
    importing reasoning-gym before they take answers."""
    return shared_pool(preload=[("reasoning_gym", ())])


def warm(task: str, config: dict[str, Any] | None, size: int | None) -> None:
    """Start the verifier workers and build the dataset in them (a reset calls it: the first answer then
    waits for no import)."""
    pool().warm("reasoning_gym", (task, dict(config or {}), size))


def score_answer(
    task: str, config: dict[str, Any] | None, size: int | None, entry: dict[str, Any], answer: str
) -> float:
    """The dataset's score of ``answer`` for ``entry``, in a verifier worker within ``VERIFY_TIMEOUT_S``:
    0.0 when the verifier ran out of that time on it. InfrastructureError when no worker could run it."""
    items = [(task, dict(config or {}), size, entry, answer)]
    result = pool().score("reasoning_gym", items, timeout=VERIFY_TIMEOUT_S)[0]
    return float(result or 0.0)
