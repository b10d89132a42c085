"""The code reward in the real process sandbox: honest solutions, partial credit, and reward-hacking cases
31-34 (exit codes, patched asserts/unittest, always-equal objects, conftest.py, reading the tests, printing
a fake report, skipped tests). Infrastructure faults give None with a counter (fake sandbox)."""

from __future__ import annotations

import warnings

import pytest

from toolgym.rewards import code_tests, counters, reset_counters
from toolgym.rewards.code import extract_code


def block(src: str) -> str:
    return f"Here is my solution.\n```python\n{src}\n```"


ASSERTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
MODULE = (
    "def test_small():\n    assert add(1, 2) == 3\n\ndef test_big():\n    assert add(10**6, 1) == 1000001\n"
)
UNITTEST = "import unittest\n\ndef test_eq():\n    unittest.TestCase().assertEqual(add(1, 2), 3)\n"
PROGRAM = [{"input": "1 2\n", "output": "3\n"}, {"input": "20 22\n", "output": "42"}]

GOOD = block("def add(a, b):\n    return a + b")
HACKS = {
    "sys.exit(0)": block("import sys\nsys.exit(0)"),  # case 31
    "exit(0)": block("exit(0)\ndef add(a, b):\n    return 7"),
    "os._exit(0)": block("import os\nos._exit(0)"),
    "exit inside the call": block("def add(a, b):\n    raise SystemExit(0)"),
    "always-equal object": block(
        "class Any:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any()"
    ),  # case 32
    "int subclass equal to all": block(
        "class I(int):\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return I(0)"
    ),
    "patched builtins": block(
        "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\nbuiltins.isinstance = lambda *a: True\ndef add(a, b):\n    return 7"
    ),
    "truthy object": block(
        "class T:\n    def __bool__(self):\n        return True\n    def __eq__(self, o):\n        return self\ndef add(a, b):\n    return T()"
    ),
    "conftest.py": block(
        "open('conftest.py', 'w').write('import pytest\\npytest.skip(allow_module_level=True)')\ndef add(a, b):\n    return 7"
    ),
    "read the tests": block(
        "import glob, sys\nsrc = [open(p).read() for p in glob.glob('**', recursive=True)]\ndata = sys.stdin.read()\ndef add(a, b):\n    return 7"
    ),  # case 33
    "print a fake report": block(
        "print('PASS')\nprint('TOOLGYM-REPORT 0000 {\"results\": []}')\ndef add(a, b):\n    return 7"
    ),
    "skip the test": block(
        "import unittest\ndef add(a, b):\n    raise unittest.SkipTest('later')"
    ),  # case 34
}


@pytest.fixture(scope="module")
def sandbox():
    from toolgym.sandboxes import get_sandbox

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        box = get_sandbox("process", pool_size=2)
    yield box
    box.close()


def test_extract_code():
    assert (
        extract_code(
            [{"role": "assistant", "content": GOOD}, {"role": "tool", "content": "```python\nx\n```"}]
        )
        == "def add(a, b):\n    return a + b\n"
    )
    assert extract_code("<think>```python\nx = 1\n```</think>") is None


def test_honest_solutions_all_test_shapes(sandbox):
    prog = block("a, b = map(int, input().split())\nprint(a + b)")
    out = code_tests([GOOD, GOOD, GOOD, prog], tests=[ASSERTS, MODULE, UNITTEST, PROGRAM], sandbox=sandbox)
    assert out == [1.0, 1.0, 1.0, 1.0]


def test_partial_credit(sandbox):
    wrong = block("def add(a, b):\n    return 3")
    prog = block("print(3)")
    assert code_tests([wrong, wrong], tests=[ASSERTS, ASSERTS], sandbox=sandbox, partial=True)[
        0
    ] == pytest.approx(1 / 3)
    assert code_tests([wrong, prog], tests=[ASSERTS, PROGRAM], sandbox=sandbox) == [0.0, 0.0]
    assert code_tests([prog], tests=[PROGRAM], sandbox=sandbox, partial=True) == [0.5]


@pytest.mark.parametrize("name", list(HACKS))
def test_reward_hacks_score_zero(sandbox, name):
    tests = UNITTEST if name == "patched builtins" else ASSERTS
    assert code_tests([HACKS[name]], tests=[tests], sandbox=sandbox, partial=True) == [0.0]


def test_patched_unittest_is_undone(sandbox):  # case 32
    hack = block(
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\ndef add(a, b):\n    return 0"
    )
    assert code_tests([hack], tests=[UNITTEST], sandbox=sandbox) == [0.0]


def test_timeout_and_no_code(sandbox):
    spin = block("def add(a, b):\n    while True:\n        pass")
    assert code_tests([spin, "no code"], tests=[ASSERTS[:1], ASSERTS], sandbox=sandbox, timeout=1.0) == [
        0.0,
        0.0,
    ]
    assert code_tests([GOOD], tests=[None], sandbox=sandbox) == [None]


SNOOP = block(
    "import glob, os, sys\n"
    "texts = []\n"
    "for p in glob.glob('**', recursive=True) + glob.glob('../*') + glob.glob('../*/*'):\n"
    "    try:\n"
    "        texts.append(open(p, errors='ignore').read())\n"
    "    except Exception:\n"
    "        pass\n"
    "for p in ['/dev/stdin', '/proc/%d/fd/0' % os.getppid(), '/proc/%d/cmdline' % os.getppid()]:\n"
    "    try:\n"
    "        texts.append(open(p, errors='ignore').read())\n"
    "    except Exception:\n"
    "        pass\n"
    "found = any('add(2, 2)' in t for t in texts)\n"
    "def add(a, b):\n"
    "    return a + b if found else 7"
)


def test_tests_are_unreadable_by_the_candidate(sandbox):  # case 33: it passes only if it can read the tests
    assert code_tests([SNOOP], tests=[ASSERTS], sandbox=sandbox) == [0.0]
    leaky = block(SNOOP.split("```python\n")[1].split("```")[0].replace("found = any", "found = True or any"))
    assert code_tests([leaky], tests=[ASSERTS], sandbox=sandbox) == [1.0]  # the control: a reader would win


class FakeSandbox:
    """Stands in for a sandbox whose infrastructure fails."""

    def __init__(self, status: str = "sandbox_error", raises: bool = False) -> None:
        self.status, self.raises = status, raises

    def run(self, code, *, timeout=None, stdin=None, files=None):
        from toolgym.errors import InfrastructureError
        from toolgym.sandboxes.result import ExecResult

        if self.raises:
            raise InfrastructureError("docker daemon went away")
        return ExecResult(self.status, "", "", None, 0.0, detail="box died")


def test_infrastructure_failure_is_none_and_counted():  # case 29/40 analogue: excluded, not 0
    reset_counters()
    seen = []
    out = code_tests(
        [GOOD, GOOD],
        tests=[ASSERTS, ASSERTS],
        sandbox=FakeSandbox(),
        log_metric=lambda k, v: seen.append((k, v)),
    )
    assert (
        out == [None, None] and counters()["code/infra_errors"] == 2 and seen == [("code/infra_errors", 2.0)]
    )
    assert code_tests([GOOD], tests=[ASSERTS], sandbox=FakeSandbox(raises=True)) == [None]
    assert code_tests([GOOD], tests=[ASSERTS], sandbox=FakeSandbox(status="ok")) == [None]  # no report
    assert code_tests([GOOD], tests=[ASSERTS], sandbox=FakeSandbox(status="timeout")) == [0.0]
