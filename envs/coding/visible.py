"""The ``run_tests`` tool: a candidate against the visible tests, in the episode's interpreter session.

Visible tests are feedback, not reward (the hidden tests go through :func:`toolgym.rewards.code_tests` in a
fresh sandbox run), so they run in the session for speed: the candidate in a namespace of its own (the
model's scratch variables are untouched), each assert on a copy of it. A failed ``assert CALL == EXPECTED``
shows what ``CALL`` returned. Stdin/stdout tests run the program once per case with the case's stdin.
"""

from __future__ import annotations

import ast
from typing import Any

from toolgym.envs.coding.interpreter import Interpreter, truncate
from toolgym.sandboxes import ExecResult

_FUNCTION_RUNNER = """
def __tg_visible(program, tests):
    ns = {"__name__": "solution"}
    try:
        exec(compile(program, "solution.py", "exec"), ns)
    except BaseException as exc:
        print(f"Your code failed before any test ran: {type(exc).__name__}: {exc}")
        return
    passed = 0
    for i, (source, left) in enumerate(tests, 1):
        try:
            exec(compile(source, f"test_{i}", "exec"), dict(ns))
            print(f"test {i} passed: {source}")
            passed += 1
        except AssertionError:
            got = ""
            if left is not None:
                try:
                    got = f"\\n  got: {eval(left, dict(ns))!r}"
                except BaseException as exc:
                    got = f"\\n  got: {type(exc).__name__}: {exc}"
            print(f"test {i} FAILED: {source}{got}")
        except BaseException as exc:
            print(f"test {i} FAILED: {source}\\n  {type(exc).__name__}: {exc}")
    print(f"{passed}/{len(tests)} visible tests passed")


__tg_visible(%r, %r)
del __tg_visible
"""


def _left_of(source: str) -> str | None:
    """The left side of ``assert LEFT == RIGHT`` (to show what it returned), else None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    last = tree.body[-1] if tree.body else None
    if (
        isinstance(last, ast.Assert)
        and isinstance(last.test, ast.Compare)
        and len(last.test.ops) == 1
        and isinstance(last.test.ops[0], ast.Eq)
    ):
        return ast.unparse(last.test.left)
    return None


def same_output(got: str, expected: str) -> bool:
    """Line by line, trailing spaces and blank lines at the ends ignored (as the grader compares).

    >>> same_output("3 \\n4\\n\\n", "3\\n4"), same_output("3\\n", "4\\n")
    (True, False)
    """
    return [ln.rstrip() for ln in got.strip().splitlines()] == [
        ln.rstrip() for ln in expected.strip().splitlines()
    ]


def _show(text: str, limit: int = 300) -> str:
    return truncate(text, limit).rstrip("\n") or "(empty)"


def run_function_tests(interp: Interpreter, program: str, tests: list[str]) -> ExecResult:
    """Every visible assert against ``program``, in one session call (its stdout is the report)."""
    return interp.run(_FUNCTION_RUNNER % (program, [(t, _left_of(t)) for t in tests]))


def run_stdio_tests(
    interp: Interpreter, program: str, cases: list[dict[str, Any]]
) -> tuple[str, list[ExecResult]]:
    """The program once per visible case (its stdin the case's input); returns the report."""
    runner = f"exec(compile({program!r}, 'solution.py', 'exec'), {{'__name__': '__main__'}})"
    lines: list[str] = []
    results: list[ExecResult] = []
    passed = 0
    for i, case in enumerate(cases, 1):
        result = interp.run(runner, stdin=str(case["input"]))
        results.append(result)
        head = f"test {i} (input: {_show(str(case['input']), 120)!r})"
        if result.status == "ok" and same_output(result.stdout, str(case["output"])):
            lines.append(f"{head} passed")
            passed += 1
            continue
        why = result.status if result.status != "ok" else "wrong output"
        detail = f"\n  stderr: {_show(result.stderr)}" if result.stderr.strip() else ""
        lines.append(
            f"{head} FAILED ({why})\n  expected: {_show(str(case['output']))!r}\n  got: {_show(result.stdout)!r}{detail}"
        )
    lines.append(f"{passed}/{len(cases)} visible tests passed")
    return "\n".join(lines), results
