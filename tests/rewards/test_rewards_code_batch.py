"""The batch acceptance test: 256 ``code_tests`` completions on one sandbox (a pool of 2 boxes), a quarter
hostile and spread through the batch: every honest completion scores 1.0, every hostile one 0.0, none None.
The hostile ones attack what serves other candidates (the box's spare worker and other processes: their
memory through /proc/PID/mem, prlimit, SIGSTOP, renice and SCHED_IDLE; hooks set with sys.setprofile,
sys.settrace and threading.setprofile; output after closing fds 0-2) and the grader (every cheat of
tests/rewards/code_cheats.py). Slow: about a minute per backend on 2 cores."""

from __future__ import annotations

import time

import pytest

from tests.rewards.code_cheats import CHEATS, POISONERS, cheat, poisoner
from tests.rewards.honest_shapes import SHAPES
from toolgym.rewards import code_tests

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
ADD_CHECK = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
SIZE = 256


def block(src: str) -> str:
    return f"```python\n{src}\n```"


def batch() -> tuple[list[str], list[object], list[str]]:
    """Completions, their tests, and for each "honest" or the hostile program's name."""
    honest = list(SHAPES)
    hostile = [("poisoner", n) for n in POISONERS for _ in range(5)] + [("cheat", n) for n in CHEATS]
    completions, tests, kinds = [], [], []
    h = b = 0
    for i in range(SIZE):
        if i % 4 == 1:
            kind, name = hostile[b % len(hostile)]
            src = poisoner(name, "add") if kind == "poisoner" else cheat(name, "add")
            completions.append(block(src))
            tests.append(ADD_TESTS if b % 2 else ADD_CHECK)
            kinds.append(name)
            b += 1
        else:
            name = honest[h % len(honest)]
            completions.append(block(SHAPES[name][0]))
            tests.append(SHAPES[name][1])
            kinds.append("honest")
            h += 1
    return completions, tests, kinds


def test_the_batch_is_what_it_claims():
    _, _, kinds = batch()
    hostile = [k for k in kinds if k != "honest"]
    assert len(kinds) == SIZE and len(hostile) == SIZE // 4
    assert set(POISONERS) <= set(hostile) and set(CHEATS) <= set(hostile)


@pytest.mark.slow
def test_a_quarter_hostile_batch(sandbox):
    completions, tests, kinds = batch()
    t0 = time.monotonic()
    out = code_tests(completions, tests=tests, sandbox=sandbox, timeout=3.0)
    seconds = time.monotonic() - t0
    wrong = {
        f"{i} {k}": s
        for i, (k, s) in enumerate(zip(kinds, out, strict=True))
        if s != (1.0 if k == "honest" else 0.0)
    }
    assert not wrong, f"{len(wrong)} misgraded in {seconds:.0f} s: {wrong}"
