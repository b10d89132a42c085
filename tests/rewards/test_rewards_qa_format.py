"""QA, format/behaviour and shaped rewards: tables, including reward-hacking cases 38 and 39."""

from __future__ import annotations

import functools
import math

import pytest

from toolgym.errors import ConfigError
from toolgym.rewards import (
    Progressive,
    exact_match,
    has_answer,
    information_gain,
    information_gain_rewards,
    overlong_penalty,
    single_answer,
    substring_match,
    tag_balance,
    token_f1,
    tool_call_bonus,
    tool_call_format,
    void_turn,
)
from toolgym.rewards.qa import normalize_answer

GOLD = ["Eiffel Tower", "La tour Eiffel"]


@pytest.mark.parametrize(
    "completion, em, f1",
    [
        ("<answer>The Eiffel Tower.</answer>", 1.0, 1.0),
        ("<answer>la Tour Eiffel</answer>", 1.0, 1.0),
        ("<think><answer>Eiffel Tower</answer></think><answer>Louvre</answer>", 0.0, 0.0),
        ("<answer>Eiffel</answer>", 0.0, 2 / 3),
        ("<answer></answer>", 0.0, 0.0),  # case 38: the empty answer
        ("<answer>Eiffel Tower</answer>" * 50, 0.0, 0.0),  # case 38: 50 repeated tags
        (
            "<answer>Louvre or Eiffel Tower or Notre Dame</answer>",
            0.0,
            pytest.approx(2 * (2 / 7) / (1 + 2 / 7)),
        ),  # case 38
        ("<answer>Louvre</answer><answer>Eiffel Tower</answer>", 0.0, 0.0),  # two different answers
        ("Eiffel Tower", 0.0, 0.0),  # no answer tag
    ],
)
def test_exact_match_and_f1(completion, em, f1):
    assert exact_match([completion], answer=[GOLD]) == [em]
    assert token_f1([completion], answer=[GOLD]) == [f1]


def test_substring_is_opt_in_and_never_rewards_empty():
    listing = "<answer>Louvre, Eiffel Tower, Notre Dame</answer>"
    assert exact_match([listing], answer=[GOLD]) == [0.0]
    assert substring_match([listing, "<answer></answer>", "<answer>Tower</answer>"], answer=[GOLD] * 3) == [
        1.0,
        0.0,
        0.0,
    ]


def test_qa_gold_shapes_and_errors():
    assert (
        exact_match(["<answer>4</answer>"] * 3, answer=["4", ["five", "4"], {"target": ["4"]}]) == [1.0] * 3
    )
    assert exact_match(["<answer>x</answer>"], answer=[None]) == [None]
    assert exact_match(["the answer"], answer=["answer"], fallback=True) == [1.0]
    with pytest.raises(ConfigError, match="answer"):
        exact_match(["<answer>x</answer>"])
    assert normalize_answer("  The   U.S.A. ") == "usa"


def test_prompt_echo_scores_nothing():  # case 39: tags in the prompt only
    prompts = ["Reply as <answer>…</answer>, e.g. <answer>Eiffel Tower</answer>"]
    assert exact_match(["I do not know"], prompts=prompts, answer=[GOLD]) == [0.0]
    assert single_answer(["I do not know"], prompts=prompts) == [0.0]
    assert tag_balance(["I do not know"], prompts=prompts) == [1.0]


CALL = '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'


@pytest.mark.parametrize(
    "completion, valid, bonus, void",
    [
        (CALL, 1.0, 0.1, 0.0),
        ('<tool_call>{"name": "search", "arguments": "not json"}</tool_call>', 0.0, 0.0, 0.0),
        ("<tool_call>{broken</tool_call>", 0.0, 0.0, 0.0),
        ("<answer>done</answer>", None, 0.0, 0.0),
        ("just thinking", None, 0.0, 1.0),
        (
            [
                {"role": "assistant", "content": CALL},
                {"role": "tool", "content": "r"},
                {"role": "assistant", "content": "hmm"},
            ],
            1.0,
            0.1,
            1.0,
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "1", "function": {"name": "search", "arguments": "{}"}}],
                }
            ],
            1.0,
            0.1,
            0.0,
        ),
        (CALL * 3 + "<tool_call>{bad</tool_call>", 0.0, 0.0, 0.0),
    ],
)
def test_tool_call_rewards(completion, valid, bonus, void):
    assert tool_call_format([completion]) == [valid]
    assert tool_call_bonus([completion], needs_answer=False) == [bonus]  # the count; none of these answers
    assert tool_call_bonus([completion]) == [0.0]
    assert void_turn([completion]) == [void]


def test_tool_call_bonus_needs_a_final_answer():
    """Paid per call alone, a policy farms the bonus by calling tools until it runs out of turns and never
    answering; the bonus comes only with a final answer in the last turn."""
    result = {"role": "tool", "content": "r"}
    spam = [{"role": "assistant", "content": CALL}, result] * 5
    assert tool_call_bonus([spam]) == [0.0]
    answer_call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "9", "function": {"name": "answer", "arguments": '{"answer": "4"}'}}],
    }
    endings = ["<answer>4</answer>", "so \\boxed{4}", answer_call, "<answer> </answer>", "<think><answer>4"]
    paid = [tool_call_bonus([[*spam, ending]])[0] for ending in endings]
    assert paid == [0.3, 0.3, 0.3, 0.0, 0.0]  # the cap; an empty or hidden answer is none
    # an answer in an earlier turn, then more calls: the last turn is not an answer
    assert tool_call_bonus([[{"role": "assistant", "content": "<answer>4</answer>"}, *spam]]) == [0.0]


def test_tool_call_bonus_cap_and_known_tools():
    assert tool_call_bonus([[CALL * 10, "<answer>4</answer>"]], per_call=0.05, cap=0.2) == [0.2]
    from toolgym.tools import ToolSpec

    spec = ToolSpec(
        name="calculator",
        description="calc",
        parameters={"type": "object", "properties": {"expression": {"type": "string"}}},
    )
    assert tool_call_format([CALL], tools=[spec]) == [0.0]  # unknown tool name


@pytest.mark.parametrize(
    "completion, balanced, single",
    [
        ("<think>a</think><answer>b</answer>", 1.0, 1.0),
        ("<think>a<answer>b</answer></think>", 1.0, 0.0),
        ("<think>a</think><answer>b", 0.0, 0.0),
        ("</think><answer>b</answer>", 0.0, 1.0),
        ("<answer><answer>b</answer></answer>", 0.0, 0.0),
        ("<answer>1</answer><answer>1</answer>", 1.0, 0.0),
    ],
)
def test_tags(completion, balanced, single):
    assert tag_balance([completion]) == [balanced]
    assert single_answer([completion]) == [single]


def test_overlong_penalty_dapo_and_both_id_spellings():
    ids = [[0] * n for n in (10, 12, 14, 16, 30)]
    expected = [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(["x"] * 5, max_length=16, buffer=4, completion_ids=ids) == expected
    assert overlong_penalty(["x"] * 5, max_length=16, buffer=4, completions_ids=ids) == expected
    with pytest.raises(ConfigError, match="completion_ids"):
        overlong_penalty(["x"])
    partial = functools.partial(overlong_penalty, max_length=16, buffer=4)
    assert partial(["x"], completion_ids=[[0] * 15]) == [-0.75]


def test_progressive_stages():
    shaped = Progressive([(has_answer, 0.1), (single_answer, 0.3), (exact_match, 1.0)])
    comps = [
        "nothing",
        "Answer: Paris",
        "<answer>Paris</answer><answer>Paris</answer>",
        "<answer>Rome</answer>",
        "<answer>Paris</answer>",
    ]
    assert shaped(comps, answer=["Paris"] * 5) == [0.0, 0.1, 0.1, 0.3, 1.0]
    assert shaped.__name__ == "progressive"


def fake_scorer(table):
    """log p(gold | history) read from a table keyed by the last message's content."""
    return lambda messages, gold: math.log(table[messages[-1]["content"]])


def test_information_gain_known_values():
    prompt = [{"role": "user", "content": "q"}]
    conv = [
        {"role": "assistant", "content": "search A"}, {"role": "tool", "content": "A says 1"},
        {"role": "assistant", "content": "search B"}, {"role": "tool", "content": "B is noise"},
        {"role": "assistant", "content": "<answer>1</answer>"},
    ]  # fmt: skip
    scorer = fake_scorer({"q": 0.1, "A says 1": 0.6, "B is noise": 0.5, "<answer>1</answer>": 0.9})
    assert information_gain(prompt, conv, "1", scorer) == pytest.approx([0.5, -0.1, 0.4])
    assert information_gain(prompt, conv, "1", scorer, space="logprob") == pytest.approx(
        [math.log(6), math.log(0.5 / 0.6), math.log(0.9 / 0.5)]
    )
    assert information_gain(prompt, conv, "1", scorer, outcome=1.0) == pytest.approx([0.5, -0.1, 1.0])
    batch = information_gain_rewards(
        [conv, conv[:2]], prompts=[prompt, prompt], answer=["1", "1"], scorer=scorer
    )
    assert [len(b) for b in batch] == [3, 1] and batch[1] == pytest.approx([0.5])
    with pytest.raises(ConfigError):
        information_gain(prompt, "text", "1", scorer)  # type: ignore[arg-type]
