"""Code reward: run the completion's program against the row's tests (``toolgym.sandboxes`` for the candidate).

Tests (the ``tests`` column, one value per completion) come in four shapes:
- a list of assert statements: ``["assert add(1, 2) == 3", ...]``, one test case each;
- a test module (a string) with ``def test_*():`` functions, one test case each (plain ``assert``, no pytest);
- HumanEval's row: ``{"test": "def check(candidate): ...", "entry_point": "add", "prelude": prompt}`` (or a
  ``check`` source with the ``entry_point`` column beside it; ``prelude`` optional), one test case;
- a list of program cases ``[{"input": "1 2\\n", "output": "3\\n"}, ...]``: the solution runs as ``__main__``
  on that stdin and its stdout is compared on the host, line by line (trailing spaces ignored).

The candidate runs in its own sandbox session and the tests in a separate clean process
(:mod:`toolgym.rewards.code_grader`): values cross as plain data, the candidate's objects as proxies whose
equality is decided on the tests' side (:mod:`toolgym.rewards.code_proxy`), so no object, frame, memory or
file descriptor of the candidate's reaches the verdict, while tests that build its classes, pass it
callbacks or ``import solution`` work as they would in one process. The score is 1.0 when every test passes, else 0.0; ``partial=True``
gives the fraction passed. A completion without a code block scores 0. None only for what the candidate
cannot cause (the sandbox failing before its code ran, a broken test), counted as ``code/infra_errors``.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolgym.errors import ConfigError
from toolgym.rewards.code_grader import Grade, grade_function, grade_program
from toolgym.rewards.counters import count
from toolgym.rewards.extract import assistant_turns, strip_reasoning

_PYTHON_LABELS = ("", "python", "py", "python3")
_SANDBOX: Any = None
_SANDBOX_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def extract_code(completion: Any) -> str | None:
    """The last fenced code block of the last assistant turn that has one (reasoning ignored), or None.

    >>> extract_code("<think>```python\\nx = 0\\n```</think>Here:\\n```python\\ndef f():\\n    return 1\\n```")
    'def f():\\n    return 1\\n'
    >>> extract_code("no code") is None
    True
    """
    for turn in reversed(assistant_turns(completion)):
        blocks = _fenced_blocks(strip_reasoning(turn))
        if blocks:
            return blocks[-1]
    return None


def _fenced_blocks(text: str) -> list[str]:
    """The contents of every fenced block labelled python/py/python3 or unlabelled, in order. Fences pair up
    left to right (a ``js`` block's closing fence never opens a Python block); one pass, linear time."""
    out: list[str] = []
    pos = 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            return out
        eol = text.find("\n", i + 3)
        if eol < 0:
            return out
        python = text[i + 3 : eol].strip().lower() in _PYTHON_LABELS
        j = text.find("```", eol + 1)
        if j < 0:
            return out
        if python:
            out.append(text[eol + 1 : j])
        pos = j + 3


def default_sandbox() -> Any:
    """The sandbox used when none is given: ``get_sandbox("auto")``, created on first use."""
    global _SANDBOX
    with _SANDBOX_LOCK:
        if _SANDBOX is None:
            from toolgym.sandboxes import get_sandbox

            _SANDBOX = get_sandbox("auto")
        return _SANDBOX


def grade(
    code: str,
    tests: Any,
    sandbox: Any,
    timeout: float = 5.0,
    entry_point: str | None = None,
    prelude: str = "",
) -> Grade:
    """Grades one solution against one row's tests, any shape (see the module docstring)."""
    if isinstance(tests, dict):
        if "test" not in tests:
            raise ConfigError('a HumanEval-style test row needs "test" (and "entry_point").')
        entry_point = tests.get("entry_point", entry_point)
        prelude = str(tests.get("prelude", tests.get("prompt", prelude)) or "")
        tests = tests["test"]
    if hasattr(tests, "tolist"):  # numpy arrays, as verl's batches hold them
        tests = tests.tolist()
    if isinstance(tests, (list, tuple)) and tests and all(isinstance(t, dict) for t in tests):
        return grade_program(code, list(tests), sandbox=sandbox, timeout=timeout)
    return grade_function(
        code, tests, entry_point=entry_point, prelude=prelude, sandbox=sandbox, timeout=timeout
    )


def run_tests(
    code: str, tests: Any, sandbox: Any, timeout: float = 5.0, strict: bool = True
) -> tuple[int, int] | None:
    """``(passed, total)`` for one solution, or None on an infrastructure failure (kept for callers of the
    earlier API; :func:`grade` gives the reasons too)."""
    result = grade(code, tests, sandbox, timeout)
    return None if result.infra_error else (result.passed, result.total)


def _column(kwargs: dict[str, Any], key: str, n: int) -> list[Any]:
    values = kwargs.get(key)
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise ConfigError(f"got {n} completions but {len(values)} values of '{key}'.")
    return values


def _present(tests: Any) -> bool:
    if tests is None:
        return False
    if hasattr(tests, "tolist"):
        tests = tests.tolist()
    return bool(tests)


def code_tests(
    completions: list[Any],
    *,
    tests: list[Any] | None = None,
    partial: bool = False,
    sandbox: Any = None,
    timeout: float = 5.0,
    strict: bool = True,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the completion's last code block passes every test of its row (``partial``: the fraction
    passed), 0.0 otherwise; None when the row has no tests or the infrastructure failed. The candidate runs
    in ``sandbox`` (a ``toolgym.sandboxes`` Sandbox; default ``get_sandbox("auto")``), ``timeout`` seconds
    of its time per test case. Optional columns ``entry_point`` and ``prelude`` serve HumanEval-style rows.
    ``strict`` is accepted for compatibility: values always cross as plain data or proxies now.

    >>> code_tests(["no code here"], tests=[["assert True"]])
    [0.0]
    >>> code_tests(["```python\\nx = 1\\n```"], tests=[None])
    [None]
    """
    if tests is None:
        raise ConfigError("code_tests needs a 'tests' column: asserts, a test module, or input/output cases.")
    tests = list(tests)
    n = len(completions)
    if len(tests) != n:
        raise ConfigError(f"got {n} completions but {len(tests)} rows of tests.")
    entry_points, preludes = _column(kwargs, "entry_point", n), _column(kwargs, "prelude", n)
    codes = [extract_code(c) for c in completions]
    present = [_present(t) for t in tests]
    todo = [i for i in range(n) if codes[i] is not None and present[i]]
    out: list[float | None] = [0.0 if ok else None for ok in present]
    if not todo:
        return out
    box = sandbox if sandbox is not None else default_sandbox()
    workers = max(1, min(len(todo), int(getattr(getattr(box, "limits", None), "size", 2))))

    def one(i: int) -> Grade | None:
        try:
            return grade(str(codes[i]), tests[i], box, timeout, entry_points[i], str(preludes[i] or ""))
        except ConfigError:
            raise
        except Exception as exc:  # a fault of ours: never the candidate's score, never the batch's crash
            log.warning("code_tests: grading failed: %s: %s", type(exc).__name__, exc)
            return None

    with ThreadPoolExecutor(workers) as pool:
        grades = list(pool.map(one, todo))
    infra = 0
    for i, result in zip(todo, grades, strict=True):
        out[i] = None if result is None else result.score(partial)
        infra += out[i] is None
    count("code/infra_errors", infra, kwargs.get("log_metric"))
    return out
