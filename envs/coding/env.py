"""toolgym/Coding-v0: implement a function or a program; run scratch code and the visible tests; submit."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

from toolgym.envs.base import Task
from toolgym.envs.coding.expert import SUBMIT, expert_action
from toolgym.envs.coding.interpreter import (
    Interpreter,
    InterpreterEnv,
    render,
    show_last_expression,
    truncate,
)
from toolgym.envs.coding.tasks import CodingProblem, load_problems
from toolgym.envs.coding.visible import run_function_tests, run_stdio_tests
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.parsing import ParseResult, final_call, parse_hermes, parse_tags
from toolgym.rewards.code import extract_code, grade
from toolgym.sandboxes import Sandbox
from toolgym.tools import Tool

_PROBLEMS: dict[tuple[str, str, str | None], list[CodingProblem]] = {}


class _GradeCache:
    """Scores of (hidden tests, program) pairs already graded in this process: a GRPO group often submits
    the same code, and the grader is deterministic for a fixed program (bounded, least recently used out)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._items: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> float | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: bytes, score: float) -> None:
        with self._lock:
            self._items[key] = score
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_GRADES = _GradeCache()


@dataclass
class CodingEpisode:
    pass_rate: float = (
        0.0  # the fraction of hidden tests the submission passed (``info["hidden_pass_rate"]``)
    )


def submit(code: str) -> str:
    """Submit your final solution: hidden tests grade it and the episode ends.

    Args:
        code: the complete solution (for a function task, the function with any imports and helpers it
            needs; for a program, the whole program).
    """
    return code


class CodingEnv(InterpreterEnv):
    """Programming tasks graded by hidden unit tests: write, run, test, fix, submit.

    ## Description
    Each episode is one problem: implement a Python function (HumanEval's 164 problems by default, or the
    user's HumanEval/MBPP JSONL) or a stdin/stdout program (the built-in problems, or the user's APPS /
    CodeContests-style JSONL). The model may run scratch code and the visible tests as often as it likes,
    then submits once; hidden tests decide the reward.

    ## Action Space
    Text (or an assistant message with ``tool_calls``). Hermes format by default:
    ``<tool_call>{"name": "run_tests", "arguments": {"code": "def f(x): ..."}}</tool_call>``; in the tags
    format ``<run_python>…</run_python>``, ``<run_tests>…</run_tests>``, ``<submit>…</submit>``. A final
    ``<answer>…</answer>`` (its last fenced code block, or its text) is a submission too. ``action_format``
    only chooses which syntax the prompt teaches: both are read.

    ## Observation Space
    ``Messages``: on reset the system prompt and the problem (signature and docstring, or the statement,
    with the visible tests); then tool results (output cut to ``max_output_chars`` with a marker), or
    feedback after an invalid action.

    ## Tools
    ``run_python(code)``: scratch code in the episode's persistent interpreter (a sandbox session).
    ``run_tests(code)``: the code against the visible tests, each reported passed or failed (with what a
    failing call returned, or the expected and actual output).
    ``submit(code)``: the final solution; ends the episode.

    ## Rewards
    ``correct``: 1.0 when the submission passes every hidden test, else 0.0 (``partial_credit=True``: the
    fraction passed). Grading is the rewards package's code grader (:func:`toolgym.rewards.code.grade`, what
    :func:`toolgym.rewards.code_tests` runs per completion): the candidate in its own sandbox session, the
    tests in a separate clean process, only plain data between them, so ``exit(0)``, patched builtins,
    always-equal objects and printed fake reports score 0. HumanEval's prompt is the grader's trusted
    prelude (its helpers are the test's own, never the candidate's).
    ``format``: ``format_penalty`` (default -0.1) on each invalid action.

    ## Starting State
    A problem drawn with ``np_random`` (``reset(options={"index": i})`` picks problem ``i``); an empty
    interpreter whose session opens at the first call.

    ## Episode End
    Terminated by a submission. Truncated after ``max_turns`` (``turn_limit``), by ``token_budget`` /
    ``time_limit_s``, or by a sandbox fault (``env_error``: the grader or a session failed; exclude the
    episode, it is not the model's failure). ``info["hidden_pass_rate"]`` gives the fraction of hidden tests
    passed at the end.

    ## Arguments
    ``tasks`` ("humaneval", "stdio", or a JSONL/JSON path or Hugging Face id; ``tasks_split`` "test",
    ``tasks_config``), ``partial_credit`` (False), ``max_turns`` (8), ``sandbox`` ("auto", "docker",
    "process" or a ``Sandbox``), ``sandbox_options`` (``Limits`` overrides, e.g. ``{"pool_size": 32}``: give
    the pool one box per concurrent episode plus a few for grading), ``call_timeout_s`` (10),
    ``test_timeout_s`` (10 per hidden test case), ``max_output_chars`` (3000), ``format_penalty`` (-0.1),
    ``action_format``, ``prompt_format``, ``token_budget``, ``time_limit_s``.

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "code"
    expert_success_rate: ClassVar[float] = 1.0
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")

    def __init__(
        self,
        *,
        tasks: str = "humaneval",
        tasks_split: str = "test",
        tasks_config: str | None = None,
        partial_credit: bool = False,
        max_turns: int = 8,
        sandbox: Sandbox | str | None = "auto",
        sandbox_options: dict[str, Any] | None = None,
        call_timeout_s: float = 10.0,
        test_timeout_s: float = 10.0,
        max_output_chars: int = 3000,
        **kwargs: Any,
    ) -> None:
        if call_timeout_s <= 0 or test_timeout_s <= 0 or max_output_chars < 100:
            raise ConfigError("call_timeout_s and test_timeout_s must be > 0 and max_output_chars >= 100")
        key = (str(tasks), tasks_split, tasks_config)
        if key not in _PROBLEMS:
            _PROBLEMS[key] = load_problems(tasks, split=tasks_split, config=tasks_config)
        self.problems = _PROBLEMS[key]
        self.partial_credit = partial_credit
        self.call_timeout_s = call_timeout_s
        self.test_timeout_s = test_timeout_s
        self.max_output_chars = max_output_chars
        self._interpreter: Interpreter = Interpreter(sandbox, sandbox_options, call_timeout_s)
        super().__init__(max_turns=max_turns, **kwargs)

    @property
    def problem(self) -> CodingProblem:
        return self.problems[self.task.data["index"]]

    # ----- tools -------------------------------------------------------------------------------------------
    def run_python(self, code: str) -> str:
        """Run scratch Python code in a persistent interpreter (variables and imports stay between calls)
        and return what it prints (and the value of a bare last expression), or the traceback.

        Args:
            code: Python source to run.
        """
        result = self._interpreter.run(show_last_expression(code))
        return render(result, self.max_output_chars, self.call_timeout_s)

    def run_tests(self, code: str) -> str:
        """Run your solution against the visible tests and report each one (hidden tests decide the
        reward).

        Args:
            code: the complete solution to test.
        """
        problem = self.problem
        if not problem.visible:
            return "This task has no visible tests; test your code with run_python."
        program = problem.program(code)
        if problem.kind == "stdio":
            report, _ = run_stdio_tests(self._interpreter, program, problem.visible)
            return truncate(report, self.max_output_chars)
        result = run_function_tests(self._interpreter, program, [str(t) for t in problem.visible])
        return render(result, self.max_output_chars, self.call_timeout_s)

    def tools(self) -> list[Tool]:
        return [
            Tool(self.run_python, name="run_python"),
            Tool(self.run_tests, name="run_tests"),
            Tool(submit),
        ]

    def instructions(self) -> str:
        return (
            "You solve programming tasks in Python. Tools: run_python runs scratch code in a persistent "
            "interpreter; run_tests runs your solution against the visible tests; submit hands in your final "
            "solution, which hidden tests grade (the episode ends). Submit complete code."
        )

    def example(self) -> str:
        call = json.dumps({"name": "run_tests", "arguments": {"code": "def add(a, b):\n    return a + b"}})
        done = json.dumps({"name": "submit", "arguments": {"code": "def add(a, b):\n    return a + b"}})
        return (
            "user: Implement add(a, b), the sum of two numbers.\n"
            f"assistant: <tool_call>{call}</tool_call>\n"
            "tool: test 1 passed: assert add(1, 2) == 3\n1/1 visible tests passed\n"
            f"assistant: <tool_call>{done}</tool_call>"
        )

    # ----- hooks ---------------------------------------------------------------------------------------
    def new_episode(self) -> CodingEpisode:
        return CodingEpisode()

    def make_task(self) -> Task:
        index = self._index if self._index is not None else int(self.np_random.integers(len(self.problems)))
        if not 0 <= index < len(self.problems):
            raise ConfigError(f"options['index'] must be in [0, {len(self.problems)}), got {index}")
        problem = self.problems[index]
        return Task(problem.task_id, _prompt(problem), None, {"index": index})

    def parse(self, action: Any) -> ParseResult:
        """A ``submit`` call (alone in its turn) is the final answer; ``<answer>`` holds code too. Both
        text formats are read whatever ``action_format`` is (it only picks what the prompt teaches)."""
        parsed = super().parse(action)
        if parsed.error_kind == "no_action" and isinstance(action, str):
            other = parse_hermes if self.action_format == "tags" else parse_tags
            alt = other(action, self._specs, self._call_counter)
            if alt.error_kind != "no_action":
                parsed = alt
        return final_call(parsed, SUBMIT, "code")

    def check_answer(self, answer: str) -> dict[str, float]:
        code = extract_code(answer) if "```" in answer else answer
        self._interpreter.close()  # the episode is over: give its box back before grading takes one
        rate = self.episode.pass_rate = self._grade(code or "")
        score = rate if self.partial_credit else float(rate == 1.0)
        return {"correct": score}

    def _grade(self, code: str) -> float:
        if not code.strip():
            return 0.0
        # the sandbox's Python is 3.11+: what does not compile on a 3.11+ host fails there too
        if sys.version_info >= (3, 11):
            try:
                compile(self.problem.program(code), "solution.py", "exec")
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return 0.0
        key = hashlib.sha256(json.dumps([self.problem.hidden, code, self.test_timeout_s]).encode()).digest()
        cached = _GRADES.get(key)
        if cached is not None:
            return cached
        result = grade(code, self.problem.hidden, self._interpreter.sandbox, self.test_timeout_s)
        score = result.score(partial=True)
        if score is None:  # not cached: the next submission tries the sandbox again
            raise InfrastructureError(f"the code grader could not run the hidden tests: {result.infra_error}")
        _GRADES.put(key, score)
        return score

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """At the episode's end, the pass rate on the hidden tests of the last submission."""
        return {"hidden_pass_rate": self.episode.pass_rate} if ended else {}

    def expert_action(self) -> str:
        """Run the visible tests on the canonical solution, then submit it."""
        return expert_action(self.problem, self._transcript, self.action_format)


def _prompt(problem: CodingProblem) -> str:
    if problem.kind == "stdio":
        parts = [
            problem.prompt,
            "Write a complete Python program that reads standard input and writes standard output.",
        ]
        for i, case in enumerate(problem.visible, 1):
            parts.append(
                f"Example {i} input:\n```\n{case['input']}```\nExample {i} output:\n```\n{case['output']}```"
            )
        return "\n\n".join(parts)
    if problem.prefix:
        head = (
            f"Implement `{problem.entry_point}` below. Its imports and helper functions are already defined when "
            f"your code runs; submit the complete function.\n\n```python\n{problem.prompt.rstrip()}\n```"
        )
    else:
        head = f"{problem.prompt.strip()}\n\nWrite the Python function (with any imports it needs)."
    if problem.visible:
        head += "\n\nVisible tests (run_tests runs them):\n" + "\n".join(str(t) for t in problem.visible)
    return head
