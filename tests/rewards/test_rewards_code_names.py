"""MBPP-style asserts see the candidate's top-level names first, as MBPP's harness does (candidate code, then
the asserts, in one namespace): a function named like a standard module (``heapq``, ``bisect``) is the one
the asserts call. A name the tests use only as a module (``math.isclose``) stays the standard module."""

from __future__ import annotations

import pytest

from toolgym.rewards import code_tests

HONEST = {
    "a function named heapq": (
        "def heapq(xs):\n    return sorted(xs)\n",
        ["assert heapq([3, 1, 2]) == [1, 2, 3]", "assert heapq([]) == []"],
    ),
    "a function named bisect, and the real math": (
        "import math\ndef bisect(a, b):\n    return (a + b) / 2\n",
        ["assert bisect(1, 2) == 1.5", "assert math.isclose(bisect(0, 1), 0.5)"],
    ),
    "a class named array, by a star import": (
        "class array:\n    def __init__(self, n):\n        self.n = n\n    def size(self):\n        return self.n\n",
        ["from solution import *\nassert array(3).size() == 3"],
    ),
}
CHEATS = {
    "a class math whose isclose says True": (
        "class math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
        "def area(r):\n    return 0\n",
        ["assert math.isclose(area(10), 314.159, rel_tol=0.001)"],
    ),
    "the same by a star import": (
        "class math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
        "def area(r):\n    return 0\n",
        ["from solution import *\nassert math.isclose(area(10), 314.159, rel_tol=0.001)"],
    ),
}


def block(src: str) -> str:
    return f"```python\n{src}\n```"


@pytest.mark.parametrize("name", list(HONEST))
def test_the_candidates_names_win_over_standard_modules(sandbox, name):
    code, tests = HONEST[name]
    assert code_tests([block(code)], tests=[tests], sandbox=sandbox, partial=True) == [1.0]


@pytest.mark.parametrize("name", list(CHEATS))
def test_a_module_the_tests_use_as_one_stays_theirs(sandbox, name):
    code, tests = CHEATS[name]
    assert code_tests([block(code)], tests=[tests], sandbox=sandbox, partial=True) == [0.0]
