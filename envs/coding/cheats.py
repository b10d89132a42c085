"""Known ways to score without solving a function task, for checking that grading resists them (the tests and
``benchmarks/code_env.py --humaneval`` submit each one to every HumanEval problem; each must score 0).

- ``pass``: submit nothing (the prompt's stub returns None);
- ``exit``, ``os_exit``: leave before any test runs, with status 0;
- ``print``: print what a naive harness might read as a pass report;
- ``always_equal``: return an object whose ``==`` is always True;
- ``print_expected``: print the first visible test's expected value instead of returning it.
"""

from __future__ import annotations

from toolgym.envs.coding.tasks import CodingProblem

CHEATS = {
    "pass": "pass",
    "exit": "exit(0)",
    "os_exit": "import os\nos._exit(0)",
    "print": "print('PASS')\nprint('TOOLGYM-REPORT 0 {\"results\": []}')\nprint('1/1 tests passed')",
    "always_equal": (
        "class _Any:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    def __bool__(self):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def {name}(*args, **kwargs):\n    return _Any()\n"
    ),
    "print_expected": "def {name}(*args, **kwargs):\n    print({expected})\n",
}


def cheat_code(name: str, problem: CodingProblem) -> str:
    """The cheat ``name`` written for ``problem``'s entry point.

    >>> from toolgym.envs.coding.tasks import mbpp_problem
    >>> p = mbpp_problem({"task_id": 1, "text": "add", "test_list": ["assert add(1, 2) == 3"], "code": ""})
    >>> print(cheat_code("print_expected", p))
    def add(*args, **kwargs):
        print(3)
    <BLANKLINE>
    """
    expected = "True"
    if problem.visible and " == " in str(problem.visible[0]):
        expected = str(problem.visible[0]).rsplit(" == ", 1)[1]
    entry = problem.entry_point or _entry_of(problem)
    return CHEATS[name].replace("{name}", entry).replace("{expected}", expected)


def _entry_of(problem: CodingProblem) -> str:
    """MBPP rows name no entry point: the function its first visible test calls."""
    first = str(problem.visible[0]) if problem.visible else ""
    name = first.removeprefix("assert ").split("(", 1)[0].strip()
    return name if name.isidentifier() else "solution"
