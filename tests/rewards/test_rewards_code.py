"""The code reward on both sandbox backends: honest solutions of every test shape and plain result type pass;
every cheat class (tests/rewards/code_cheats.py) scores 0 on every test shape, never None; program tests are
compared on the host; the reward never raises on a candidate; None only for infrastructure faults the
candidate cannot cause."""

from __future__ import annotations

import pytest

from tests.rewards.code_cheats import CHEATS, cheat
from toolgym.rewards import code_tests, counters, reset_counters
from toolgym.rewards.code import extract_code, grade


def block(src: str) -> str:
    return f"Here is my solution.\n```python\n{src}\n```"


ASSERTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
MODULE = (
    "def test_small():\n    assert add(1, 2) == 3\n\ndef test_big():\n    assert add(10**6, 1) == 1000001\n"
)
UNITTEST = "import unittest\n\ndef test_eq():\n    unittest.TestCase().assertEqual(add(1, 2), 3)\n"
CHECK = {
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-6\n"
    "    import math\n    assert math.isclose(candidate(2, 2), 4)\n    assert sorted({candidate(1, 1)}) == [2]\n",
    "entry_point": "add",
    "prelude": "def add(a, b):\n    '''Adds.'''\n",
}
PROGRAM = [{"input": "1 2\n", "output": "3\n"}, {"input": "20 22\n", "output": "42"}]
SHAPES = {"asserts": ASSERTS, "module": MODULE, "unittest": UNITTEST, "check": CHECK}
GOOD = block("def add(a, b):\n    return a + b")


def test_extract_code():
    assert (
        extract_code(
            [{"role": "assistant", "content": GOOD}, {"role": "tool", "content": "```python\nx\n```"}]
        )
        == "def add(a, b):\n    return a + b\n"
    )
    assert extract_code("<think>```python\nx = 1\n```</think>") is None
    assert extract_code("```js\nx\n```\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_code([None, 3, {"role": "assistant", "content": None}]) is None


def test_honest_solutions_all_test_shapes(sandbox):
    prog = block("a, b = map(int, input().split())\nprint(a + b)")
    out = code_tests([GOOD] * 4 + [prog], tests=[*SHAPES.values(), PROGRAM], sandbox=sandbox)
    assert out == [1.0] * 5


PLAIN_TYPES = {  # a result type -> (solution, a test that compares it to plain values)
    "namedtuple": (
        "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)",
        "assert f() == (1, 2) and f()[1] == 2",
    ),
    "numpy scalars": (
        "import numpy as np\ndef f():\n    return [np.int64(3), np.float64(0.5), np.bool_(True)]",
        "assert f() == [3, 0.5, True]",
    ),
    "numpy array": ("import numpy as np\ndef f():\n    return np.arange(3)", "assert list(f()) == [0, 1, 2]"),
    "Decimal": (
        "from decimal import Decimal\ndef f():\n    return Decimal('1.10')",
        "from decimal import Decimal\nassert f() == Decimal('1.1')",
    ),
    "Fraction": (
        "from fractions import Fraction\ndef f():\n    return Fraction(1, 3)",
        "from fractions import Fraction\nassert f() == Fraction(2, 6)",
    ),
    "OrderedDict": (
        "from collections import OrderedDict\ndef f():\n    return OrderedDict(a=1, b=2)",
        "assert f() == {'b': 2, 'a': 1}",
    ),
    "Counter vs Counter": (
        "from collections import Counter\ndef f(s):\n    return Counter(s)",
        "from collections import Counter\nassert f('abca') == Counter({'a': 2, 'b': 1, 'c': 1})",
    ),
    "defaultdict": (
        "from collections import defaultdict\ndef f():\n    d = defaultdict(list)\n    d[1].append(2)\n    return d",
        "assert f() == {1: [2]}",
    ),
    "sets, bytes, complex, tuples as keys": (
        "def f():\n    return {(1, 2): {frozenset({1}), b'x'}, 'z': 1j}",
        "assert f() == {(1, 2): {frozenset({1}), b'x'}, 'z': 1j}",
    ),
    "nan, inf, huge int": (
        "def f():\n    return [float('inf'), 10 ** 5000, float('nan')]",
        "import math\nr = f()\nassert r[0] == math.inf and r[1] == 10 ** 5000 and math.isnan(r[2])",
    ),
    "generator": (
        "def f(n):\n    yield from range(n)",
        "assert list(f(3)) == [0, 1, 2] and f(3) != [0, 1, 2]",
    ),
    "range": ("def f():\n    return range(3)", "assert f() == range(3)"),
    "str subclass": ("class S(str):\n    pass\ndef f():\n    return S('ab')", "assert f() == 'ab'"),
    "bool and None": ("def f():\n    return (True, None)", "assert f() == (True, None) and f()[0] is True"),
    "in-place mutation": (
        "def f(xs):\n    xs.sort()",
        "a = [3, 1, 2]\nf(a)\nassert a == [1, 2, 3]",
    ),
    "expected exception": (
        "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x",
        "try:\n    f(-1)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass",
    ),
    "helper functions and state": (
        "count = 0\ndef helper(x):\n    return 2 * x\ndef f(x):\n    global count\n    count += 1\n    return helper(x) + count",
        "assert f(1) == 3 and f(1) == 4 and helper(5) == 10",
    ),
    "prints while computing": ("def f():\n    print('debug ' * 100000)\n    return 1", "assert f() == 1"),
}


@pytest.mark.parametrize("name", list(PLAIN_TYPES))
def test_honest_plain_results_pass(sandbox, name):
    solution, test = PLAIN_TYPES[name]
    assert code_tests([block(solution)], tests=[[test]], sandbox=sandbox) == [1.0], grade(
        solution, [test], sandbox
    )


def test_partial_credit(sandbox):
    wrong = block("def add(a, b):\n    return 3")
    prog = block("print(3)")
    assert code_tests([wrong], tests=[ASSERTS], sandbox=sandbox, partial=True)[0] == pytest.approx(1 / 3)
    assert code_tests([wrong, prog], tests=[ASSERTS, PROGRAM], sandbox=sandbox) == [0.0, 0.0]
    assert code_tests([prog], tests=[PROGRAM], sandbox=sandbox, partial=True) == [0.5]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHEATS))
def test_cheats_score_zero_on_every_test_shape(sandbox, name):
    completions = [block(cheat(name, "add"))] * len(SHAPES)
    out = code_tests(completions, tests=list(SHAPES.values()), sandbox=sandbox, timeout=2.0, partial=True)
    assert out == [0.0] * len(SHAPES)


def test_control_flow_exceptions_do_not_cross(process_box):
    """A StopIteration from the candidate would end the test's map() early: all(map(f, xs)) would hold."""
    hack = block("def positive(x):\n    raise StopIteration")
    tests = ["assert all(map(positive, [1, 2, 3]))", "assert list(map(positive, [1])) == []"]
    assert code_tests([hack], tests=[tests], sandbox=process_box, partial=True) == [0.0]
    honest = block("def positive(x):\n    return x > 0")
    assert code_tests([honest], tests=[tests[:1]], sandbox=process_box) == [1.0]


def test_interpreter_death_is_confined_to_its_test_case(sandbox):
    """A case that kills the candidate fails; the next case gets a fresh interpreter with the code loaded."""
    code = block("import os\ndef add(a, b):\n    if a < 0:\n        os._exit(1)\n    return a + b")
    out = code_tests([code], tests=[["assert add(-1, 1) == 0", "assert add(2, 2) == 4"]], sandbox=sandbox)
    assert out == [0.0]
    assert code_tests(
        [code], tests=[["assert add(-1, 1) == 0", "assert add(2, 2) == 4"]], sandbox=sandbox, partial=True
    ) == [0.5]


PROGRAM_CHEATS = {
    "exit(0) without output": "exit(0)",
    "os._exit(0)": "import os\nos._exit(0)",
    "print the likely answer": "print(3)\nprint(42)",
    "output padding": "print('3\\n' * 2_000_000)",
    "invalid utf-8": "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 1000)",
    "answer on stderr and a crash": "import sys\nprint(3, file=sys.stderr)\nraise SystemExit(1)",
    "read the expected output": (
        "import glob, os\nfound = []\nfor p in glob.glob('/tmp/**', recursive=True) + glob.glob('**', recursive=True):\n"
        "    try:\n        found.append(open(p, errors='ignore').read())\n    except Exception:\n        pass\n"
        "print('42' if any('42' in t for t in found) else 0)"
    ),
    "kill the parent": "import os\nos.kill(os.getppid(), 9)",
    "spin": "while True:\n    pass",
}


@pytest.mark.parametrize("name", list(PROGRAM_CHEATS))
def test_program_cheats_score_zero(sandbox, name):
    cases = [{"input": "20 22\n", "output": "42\n"}]
    assert code_tests([block(PROGRAM_CHEATS[name])], tests=[cases], sandbox=sandbox, timeout=2.0) == [0.0]


def test_never_raises_on_a_completion(process_box):
    class Bad:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    odd = [Bad(), None, 7, [Bad(), {"role": "assistant", "content": [1, {"text": GOOD}]}], {"content": Bad()}]
    out = code_tests(odd, tests=[ASSERTS] * len(odd), sandbox=process_box)
    assert out == [0.0, 0.0, 0.0, 1.0, 0.0]


def test_no_code_no_tests_and_broken_tests(process_box):
    assert code_tests(["no code", GOOD], tests=[ASSERTS, None], sandbox=process_box) == [0.0, None]
    reset_counters()
    assert code_tests([GOOD], tests=[["assert undefined_helper() == 1"]], sandbox=process_box) == [0.0]
    # the dataset's own test code fails before calling the candidate: not the candidate's fault
    broken = {"test": "raise RuntimeError('bad row')\ndef check(candidate):\n    pass", "entry_point": "add"}
    assert code_tests([GOOD], tests=[broken], sandbox=process_box) == [None]
    assert counters()["code/infra_errors"] == 1


class FakeSandbox:
    """A sandbox whose infrastructure fails: on every call, or only on runs after the candidate loaded."""

    def __init__(self, real=None, fail_after: int = 0, probe_fails: bool = True) -> None:
        self.real, self.fail_after, self.probe_fails, self.limits = real, fail_after, probe_fails, None

    def _result(self):
        from toolgym.sandboxes.result import ExecResult

        return ExecResult("sandbox_error", "", "", None, 0.0, detail="box died")

    def run(self, code, *, timeout=None, stdin=None, files=None):
        if self.real is not None and not self.probe_fails:
            return self.real.run(code, timeout=timeout, stdin=stdin, files=files)
        return self._result()

    def session(self):
        fake = self

        class Session:
            calls = 0

            def run(self, code, *, timeout=None, stdin=None):
                self.calls += 1
                if fake.real is not None and self.calls <= fake.fail_after:
                    return self.inner.run(code, timeout=timeout, stdin=stdin)
                return fake._result()

            def close(self):
                if fake.real is not None:
                    self.inner.close()

        s = Session()
        if self.real is not None:
            s.inner = self.real.session()
        return s


def test_infrastructure_failures(process_box):
    reset_counters()
    seen = []
    out = code_tests(
        [GOOD, GOOD],
        tests=[ASSERTS, PROGRAM],
        sandbox=FakeSandbox(),
        log_metric=lambda k, v: seen.append((k, v)),
    )
    assert out == [None, None] and counters()["code/infra_errors"] == 2
    assert seen == [("code/infra_errors", 2.0)]
    # the box dies after the candidate's code was sent: infrastructure only if a fresh probe fails too
    after_load = FakeSandbox(process_box, fail_after=2, probe_fails=True)
    assert code_tests([GOOD], tests=[ASSERTS], sandbox=after_load) == [None]
    healthy = FakeSandbox(process_box, fail_after=2, probe_fails=False)
    assert code_tests([GOOD], tests=[ASSERTS], sandbox=healthy) == [0.0]
