"""Honest solution shapes of real code datasets score 1.0 and their wrong versions 0.0 on both backends
(tests/rewards/honest_shapes.py); cheats aimed at the proxies (rigged operators on the tests' own objects,
forged dataclass equality, shadowed methods of the tests' classes, rigged arguments to the tests' callbacks)
score 0."""

from __future__ import annotations

import pytest

from tests.rewards.honest_shapes import SHAPES
from toolgym.rewards import code_tests
from toolgym.rewards.code import grade


def block(src: str) -> str:
    return f"```python\n{src}\n```"


def test_at_least_thirty_shapes():
    assert len(SHAPES) >= 30 and sum(w is not None for _, _, w in SHAPES.values()) >= 20


def test_honest_shapes_score_one(sandbox):
    names = list(SHAPES)
    out = code_tests(
        [block(SHAPES[n][0]) for n in names], tests=[SHAPES[n][1] for n in names], sandbox=sandbox
    )
    failed = {
        n: grade(SHAPES[n][0], SHAPES[n][1], sandbox).why for n, s in zip(names, out, strict=True) if s != 1.0
    }
    assert not failed


def test_wrong_shapes_score_zero(sandbox):
    names = [n for n in SHAPES if SHAPES[n][2] is not None]
    out = code_tests(
        [block(str(SHAPES[n][2])) for n in names], tests=[SHAPES[n][1] for n in names], sandbox=sandbox
    )
    assert {n: s for n, s in zip(names, out, strict=True) if s != 0.0} == {}


RIGGED = (
    "    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
    "    def __sub__(self, o): return 0\n    def __rsub__(self, o): return 0\n    def __abs__(self): return 0\n"
    "    def __lt__(self, o): return True\n    def __bool__(self): return True\n    def __len__(self): return 0\n"
    "    def __float__(self): return 2.5\n    def __index__(self): return 5\n    def __hash__(self): return 0\n"
)
PROXY_CHEATS = {
    "a Solution method returns self, rigged": (
        "class Solution:\n    def f(self, x):\n        return self\n" + RIGGED,
        [
            "assert abs(Solution().f(2) - 2.5) < 1e-6",
            "assert Solution().f(1) == 5",
            "assert Solution().f(1)",
            "s = Solution()\nassert s.f(1) == s.f(2) and s.f(1) < 0",
            "assert [1, 2, 3, 4, 5, 6][Solution().f(1)] == 6",
        ],
    ),
    "a rigged object where a number is expected": (
        "class R:\n" + RIGGED + "def mean(xs):\n    return R()\n",
        [
            "assert abs(mean([1.0, 4.0]) - 2.5) < 1e-6",
            "assert mean([1]) == 1",
            "assert mean([]) is not None and mean([])",
            "import math\nassert math.isclose(mean([2, 3]), 2.5)",
            "assert len(mean([1])) == 0",
            "assert float(mean([])) == 2.5",
        ],
    ),
    "dataclass with a rigged or blind __eq__": (
        "from dataclasses import dataclass, field\n@dataclass(eq=False)\nclass Point:\n    x: int\n    y: int\n"
        "    def __eq__(self, o): return True\n    __hash__ = object.__hash__\n"
        "@dataclass\nclass P2:\n    x: int = field(compare=False)\n"
        "def midpoint(a, b):\n    return Point(9, 9)\ndef mid2(a, b):\n    return P2(9)\n",
        [
            "assert midpoint(Point(0, 0), Point(2, 4)) == Point(1, 2)",
            "assert mid2(P2(0), P2(2)) == P2(1)",
            "assert midpoint(Point(0, 0), Point(2, 4)) == (1, 2)",
        ],
    ),
    "shadow a method of the tests' class": (
        "def make(v):\n    b = Box(0)\n    b.ok = lambda: True\n    b.__class__ = Box\n    return b\n",
        {
            "test": "def check(candidate):\n    assert candidate(42).ok()\n",
            "entry_point": "make",
            "prelude": "class Box:\n    def __init__(self, v):\n        self.v = v\n    def ok(self):\n        return self.v == 42\n",
        },
    ),
    "rigged arguments to the tests' callbacks": (
        "class R:\n" + RIGGED + "def apply_n(f, n, x):\n    return f(R())\n",
        [
            "assert apply_n(lambda v: v * 2, 3, 1) == 8",
            "assert apply_n(lambda v: abs(v - 8) < 1e-9, 1, 1) is True",
        ],
    ),
    "callbacks answered twice": (
        "import sys\ndef apply_n(f, n, x):\n    try:\n        return f(x) + f(x) * 0 + 7\n    except BaseException:\n"
        "        return 8\n",
        ["assert apply_n(lambda v: v * 2, 3, 1) == 8"],
    ),
    "a star import of names that shadow builtins and modules": (
        "def abs(x):\n    return 0\nclass math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
        "def mean(xs):\n    return 99.0\n",
        [
            "from solution import *\nassert abs(mean([1.0, 4.0]) - 2.5) < 1e-6",
            "from solution import *\nassert math.isclose(mean([1.0]), 1.0)",
        ],
    ),
    "a class the tests never named, returned as the answer": (
        "class Weird(list):\n    def extra(self):\n        return 1\n    def __eq__(self, o):\n        return True\n"
        "def f():\n    return Weird([1])\n",
        ["assert f() == [1, 2]", "assert f() != [1]"],
    ),
}


@pytest.mark.parametrize("name", list(PROXY_CHEATS))
def test_proxy_cheats_score_zero(sandbox, name):
    code, tests = PROXY_CHEATS[name]
    assert code_tests([block(code)], tests=[tests], sandbox=sandbox, partial=True, timeout=3.0) == [0.0]


def test_the_tests_own_objects_come_back_changed_and_identical(process_box):
    """By-value objects of the tests' classes keep their identity: the candidate's in-place changes are
    copied back into the very objects the tests hold."""
    code, tests, _ = SHAPES["in-place on the tests' objects"]
    assert grade(code, tests, process_box).passed == 1
