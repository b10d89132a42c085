"""Code reward: run the completion's program against unit tests in a sandbox (``toolgym.sandboxes``).

Tests (the ``tests`` column, one value per completion) come in three shapes:
- a list of assert statements: ``["assert add(1, 2) == 3", ...]``, one test case each;
- a test module (a string) with ``def test_*():`` functions, one test case each (plain ``assert``, no pytest);
- a list of program cases ``[{"input": "1 2\\n", "output": "3\\n"}, ...]``: the solution runs as ``__main__``
  on that stdin and its stdout is compared line by line (trailing spaces ignored).

How the result is kept honest (see :mod:`toolgym.rewards.code_harness` and :mod:`toolgym.rewards.code_child`):
tests never touch the disk and are unreadable by the candidate; each case runs in its own process from the
pristine test text; the verdict comes from the harness's report (a nonce-tagged line), never from an exit
code; ``exit(0)``, ``os._exit``, patched builtins/unittest, always-equal ``__eq__`` and ``conftest.py`` all
score 0; every expected test id must pass (a skipped test is a failed one).

The score is 1.0 when every test passes, else 0.0; ``partial=True`` gives the fraction passed. A completion
without a code block scores 0. An infrastructure fault (``sandbox_error``, a harness that did not report)
gives None and counts ``code/infra_errors``, never 0.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.rewards.code_harness import REPORT_TAG
from toolgym.rewards.counters import count
from toolgym.rewards.extract import assistant_turns, strip_reasoning

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.S)
_HERE = Path(__file__).parent
_SANDBOX: Any = None
_SANDBOX_LOCK = threading.Lock()


def extract_code(completion: Any) -> str | None:
    """The last fenced code block of the last assistant turn that has one (reasoning ignored), or None.

    >>> extract_code("<think>```python\\nx = 0\\n```</think>Here:\\n```python\\ndef f():\\n    return 1\\n```")
    'def f():\\n    return 1\\n'
    >>> extract_code("no code") is None
    True
    """
    for turn in reversed(assistant_turns(completion)):
        blocks = _FENCE.findall(strip_reasoning(turn))
        if blocks:
            return str(blocks[-1])
    return None


def _cases(tests: Any) -> list[dict[str, Any]]:
    """Test cases with ids, from any of the three shapes (see the module docstring)."""
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as exc:
            raise ConfigError(f"the test module does not parse: {exc}") from exc
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
        if names:
            return [{"id": n, "run": {"source": tests, "function": n}} for n in names]
        return [{"id": "module", "run": {"source": tests}}]
    if isinstance(tests, (list, tuple)):
        cases: list[dict[str, Any]] = []
        for i, t in enumerate(tests):
            if isinstance(t, dict):
                if "input" not in t or "output" not in t:
                    raise ConfigError('a program test case needs "input" and "output".')
                cases.append(
                    {"id": f"case_{i}", "run": {"stdin": str(t["input"])}, "expected": str(t["output"])}
                )
            else:
                cases.append({"id": f"assert_{i}", "run": {"source": str(t)}})
        return cases
    raise ConfigError(
        "tests must be a test module (str), a list of asserts, or a list of {input, output} cases."
    )


def default_sandbox() -> Any:
    """The sandbox used when none is given: ``get_sandbox("auto")``, created on first use."""
    global _SANDBOX
    with _SANDBOX_LOCK:
        if _SANDBOX is None:
            from toolgym.sandboxes import get_sandbox

            _SANDBOX = get_sandbox("auto")
        return _SANDBOX


def run_tests(
    code: str, tests: Any, sandbox: Any, timeout: float = 5.0, strict: bool = True
) -> tuple[int, int] | None:
    """``(passed, total)`` for one solution, or None on an infrastructure failure."""
    cases = _cases(tests)
    if not cases:
        return None
    nonce = secrets.token_hex(16)
    payload = {
        "nonce": nonce,
        "tests": cases,
        "solution": code,
        "child": (_HERE / "code_child.py").read_text(),
        "timeout": timeout,
        "strict": strict,
    }
    harness = (_HERE / "code_harness.py").read_text() + "\nmain()\n"
    budget = len(cases) * (timeout + 2.0) + 10.0
    try:
        result = sandbox.run(harness, timeout=budget, stdin=json.dumps(payload))
    except InfrastructureError:
        return None
    marker = f"{REPORT_TAG} {nonce} "
    for line in result.stdout.splitlines():
        if line.startswith(marker):
            report = json.loads(line[len(marker) :])
            by_id = {r["id"]: bool(r["passed"]) for r in report["results"]}
            return sum(by_id.get(c["id"], False) for c in cases), len(cases)
    if result.status in ("timeout", "oom", "output_limit"):
        return 0, len(cases)  # the candidate took the whole harness down
    return None


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
    passed), 0.0 otherwise; None when the row has no tests or the sandbox failed. Runs in ``sandbox`` (a
    ``toolgym.sandboxes`` Sandbox; default ``get_sandbox("auto")``), ``timeout`` seconds per test case.

    >>> code_tests(["no code here"], tests=[["assert True"]])
    [0.0]
    >>> code_tests(["```python\\nx = 1\\n```"], tests=[None])
    [None]
    """
    if tests is None:
        raise ConfigError("code_tests needs a 'tests' column: asserts, a test module, or input/output cases.")
    if len(tests) != len(completions):
        raise ConfigError(f"got {len(completions)} completions but {len(tests)} rows of tests.")
    codes = [extract_code(c) for c in completions]
    todo = [i for i, (code, t) in enumerate(zip(codes, tests, strict=True)) if code is not None and t]
    out: list[float | None] = [None if not t else 0.0 for t in tests]
    if not todo:
        return out
    box = sandbox if sandbox is not None else default_sandbox()
    workers = max(1, min(len(todo), int(getattr(getattr(box, "limits", None), "size", 2))))
    with ThreadPoolExecutor(workers) as pool:
        runs = list(pool.map(lambda i: run_tests(str(codes[i]), tests[i], box, timeout, strict), todo))
    infra = 0
    for i, run in zip(todo, runs, strict=True):
        if run is None:
            out[i] = None
            infra += 1
            continue
        passed, total = run
        out[i] = passed / total if partial else float(passed == total)
    count("code/infra_errors", infra, kwargs.get("log_metric"))
    return out
