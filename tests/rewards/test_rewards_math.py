"""Answer extraction and the math reward: tables, reward-hacking cases 35-37 and 40, pathological LaTeX from a
thread and from asyncio, the hard timeout, and agreement with labels on a pool of 200+ answer pairs."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from tests.rewards.math_pairs import math_pairs
from toolgym.rewards import counters, math_match, math_match_async, numeric_match, reset_counters
from toolgym.rewards.extract import extract_answer, extract_boxed, strip_reasoning
from toolgym.rewards.math_pool import MathJudgePool

NESTED = "\\frac{1}{" * 10_000 + "2" + "}" * 10_000
PATHOLOGICAL = [
    NESTED,
    "10^{10^{10^{10}}}",
    "(10^{10})!",
    "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "9" * 5000 + "!",
]


@pytest.fixture(scope="module")
def pool():
    p = MathJudgePool(workers=2, timeout=3.0)
    yield p
    p.close()


@pytest.mark.parametrize(
    "text, several, expected",
    [
        ("<answer>42</answer>", "last", "42"),
        ("<answer> \\boxed{7} </answer>", "last", "7"),
        ("so \\boxed{1} then \\boxed{2}", "last", "2"),
        ("so \\boxed{1} then \\boxed{2}", "first", "1"),
        ("so \\boxed{1} then \\boxed{2}", "reject", None),
        ("\\boxed{3} and again \\boxed{3}", "reject", "3"),
        ("<think>\\boxed{9}</think>Answer: 10.", "last", "10"),
        ("<think>\\boxed{9} I ran out of tokens", "last", None),  # case 37: truncated inside <think>
        ("reasoning only, no marker</think>\\boxed{5}", "last", "5"),  # template opened <think> in the prompt
        ("\\boxed{\\frac{a}{b}}", "last", "\\frac{a}{b}"),
        ("The final answer is: $x=2$", "last", "$x=2$"),
        ("no answer at all 12", "last", None),
        ("<answer>1</answer> and \\boxed{2}", "last", "1"),  # tags outrank boxes
    ],
)
def test_extract_answer(text, several, expected):
    assert extract_answer(text, several) == expected


def test_extract_helpers():
    assert extract_boxed("\\boxed{{a}{b}} \\fbox{c}") == ["{a}{b}", "c"]
    assert strip_reasoning("<think>a</think>b<think>c</think>d") == "bd"


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
        ("<answer>2\\sqrt{2}</answer>", "\\sqrt{8}", 1.0),
        ("Answer: 3/4", "\\frac{3}{4}", 1.0),
        ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", 1.0),
        ("\\boxed{5}", "The answer is \\boxed{5} because …", 1.0),  # gold given as a whole solution
        ("\\boxed{4}", "5", 0.0),
        ("\\boxed{1} \\boxed{2} \\boxed{3}", "2", 0.0),  # case 35: hedging never wins
        ("<think>\\boxed{2}</think> no idea", "2", 0.0),  # case 37: answer only inside <think>
        ("<think>long reasoning \\boxed{2}", "2", 0.0),  # case 37: truncated, no </think>
        ("I think it is 2", "2", 0.0),  # no marked answer
        ("\\boxed{2}", "", None),  # case 40: unparseable gold is skipped
        ("\\boxed{2}", "\\frac{", None),
    ],
)
def test_math_match_table(pool, completion, gold, expected):
    assert math_match([completion], solution=[gold], pool=pool) == [expected]
    assert math_match([completion], solution=[gold], pool=pool, fast_path=False) == [expected]


def test_math_match_columns_and_conversations(pool):
    conv = [{"role": "assistant", "content": "\\boxed{12}"}]
    assert math_match([conv, "\\boxed{12}"], answer=["12", "12"], pool=pool) == [1.0, 1.0]
    assert math_match(["\\boxed{1} \\boxed{2} \\boxed{3}"], answer=["3"], several="reject", pool=pool) == [
        0.0
    ]
    assert math_match(["the result is 12"], answer=["12"], fallback=True, pool=pool) == [1.0]


def test_unparseable_gold_is_counted(pool):
    reset_counters()
    logged = []
    assert math_match(
        ["\\boxed{1}", "\\boxed{1}"],
        answer=["", "1"],
        pool=pool,
        log_metric=lambda k, v: logged.append((k, v)),
    ) == [None, 1.0]
    assert counters()["math/gold_unparseable"] == 1 and logged == [("math/gold_unparseable", 1.0)]


def test_numeric_match_unchanged():
    assert numeric_match(["<think>9</think><answer>2,146</answer>", "7 then 8"], answer=[2146, 8]) == [
        1.0,
        1.0,
    ]


def test_pathological_latex_returns_in_time_from_a_thread(pool):  # case 36
    completions = [f"\\boxed{{{p}}}" for p in PATHOLOGICAL]
    out: list = []
    start = time.monotonic()
    thread = threading.Thread(
        target=lambda: out.append(
            math_match(completions, answer=["1"] * len(completions), pool=pool, fast_path=False)
        )
    )
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert out == [[0.0] * len(completions)]
    assert time.monotonic() - start < len(PATHOLOGICAL) * (pool.timeout + 1)
    assert math_match(["\\boxed{2}"], answer=["2"], pool=pool, fast_path=False) == [1.0]  # still serving


def test_pathological_latex_from_asyncio(pool):
    async def main():
        return await asyncio.gather(
            math_match_async(["\\boxed{10^{10^{10^{10}}}}"], answer=["1"], pool=pool, fast_path=False),
            math_match_async(["\\boxed{\\frac{2}{4}}"], answer=["1/2"], pool=pool),
        )

    assert asyncio.run(main()) == [[0.0], [1.0]]


def test_soft_timeout_stops_the_answer_without_a_restart():
    pool = MathJudgePool(workers=1, timeout=2.0)  # the worker's own timer fires at 1 s
    try:
        pool.judge([("1", "2")])  # warm up
        start = time.monotonic()
        assert pool.judge([("1", "10^{10^{10^{10}}}"), ("2", "2")]) == [0.0, 1.0]
        assert pool.timeouts == 1 and pool.restarts == 0
        assert time.monotonic() - start < 5
    finally:
        pool.close()


def test_many_threads_share_one_pool():
    pool = MathJudgePool(workers=2, timeout=3.0)  # generous: the test machine's cores are shared
    pairs = [("\\frac{1}{2}", "0.5"), ("3", "4"), ("1", "10^{10^{10^{10}}}"), ("x^2-1", "(x-1)(x+1)")]
    out: dict[int, list] = {}
    try:
        threads = [
            threading.Thread(target=lambda k=k: out.__setitem__(k, pool.judge(pairs))) for k in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert out == {k: [1.0, 0.0, 0.0, 1.0] for k in range(3)}
        assert pool.timeouts == 3 and pool.restarts == 0
    finally:
        pool.close()


def test_hard_timeout_kills_and_replaces_a_stuck_worker():
    pool = MathJudgePool(workers=1, timeout=2.0)
    try:
        pool.judge([("1", "2")])  # warm up
        os.kill(pool._all[0].proc.pid, signal.SIGSTOP)  # stuck where no signal handler runs
        start = time.monotonic()
        assert pool.judge([("1", "1"), ("2", "2")]) == [0.0, 1.0]
        assert pool.timeouts == 1 and pool.restarts == 1
        assert time.monotonic() - start < 30
    finally:
        pool.close()


def test_in_process_mode_matches_pool(pool):
    inline = MathJudgePool(workers=0)
    pairs = [("\\frac{1}{2}", "0.5"), ("3", "4"), ("", "1")]
    assert inline.judge(pairs) == pool.judge(pairs) == [1.0, 0.0, None]


def test_agreement_on_labelled_pairs(pool):
    pairs = math_pairs()
    assert len(pairs) >= 200 and 0.4 < sum(p[2] for p in pairs) / len(pairs) < 0.6
    completions = [f"<think>work</think> The answer is $\\boxed{{{cand}}}$." for _, cand, _ in pairs]
    scores = math_match(completions, solution=[g for g, _, _ in pairs], pool=pool)
    agreement = sum((s == 1.0) == label for s, (_, _, label) in zip(scores, pairs, strict=False)) / len(pairs)
    false_pos = sum(s == 1.0 and not label for s, (_, _, label) in zip(scores, pairs, strict=False))
    print(f"agreement {agreement:.3f} on {len(pairs)} pairs, false positives {false_pos}")
    assert agreement >= 0.97 and false_pos == 0
