"""The one reasoning rule (toolgym.reasoning): every case, and the parser and the rewards reading through it."""

import pytest

from toolgym.parsing import parse_action
from toolgym.reasoning import strip_reasoning
from toolgym.rewards import strip_reasoning as rewards_strip_reasoning
from toolgym.rewards.extract import extract_answer


@pytest.mark.parametrize(
    ("text", "outside"),
    [
        ("no reasoning at all", "no reasoning at all"),
        ("<think>a</think>b", "b"),  # a closed block is removed
        ("x<think>a</think>b<think>c</think>d", "xbd"),  # wherever it stands, as often as it comes
        ("<subgoal>plan</subgoal>b", "b"),  # a HiPER plan is reasoning too
        ("<think>a</think>b<subgoal>p</subgoal>c", "bc"),
        ("<subgoal>p <think>q</think></subgoal>c", "c"),  # a block ends at its own closing tag
        ("<think>a <subgoal>q</think>b", "b"),  # an opener inside a block is the block's text
        ("b<think>cut off while thinking", "b"),  # an unclosed block hides the rest
        ("b<subgoal>cut off", "b"),
        ("b<think>x</subgoal>y", "b"),  # the other kind's closing tag does not close it
        ("reasoning the template opened</think>b", "b"),  # a lone </think>: only what follows it
        ("r1</think>x</think>b", "b"),  # ... the last of several
        ("r</think>a<think>x</think>b", "b"),
        ("a</subgoal>b", "a</subgoal>b"),  # no template opens <subgoal>: a lone closer is text
        ("<think></think>", ""),
        ("", ""),
    ],
)
def test_every_case(text, outside):
    assert strip_reasoning(text) == outside


def test_one_function_for_parser_and_rewards():
    assert rewards_strip_reasoning is strip_reasoning


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<subgoal>answer 3</subgoal><answer>4</answer>", "4"),
        ("<think><answer>3</answer></think><answer>4</answer>", "4"),
        ("<answer>3</answer></think><answer>4</answer>", "4"),  # before a lone </think> is reasoning
        ("<subgoal><answer>3</answer>", None),
    ],
)
def test_parser_and_rewards_agree(text, answer):
    parsed = parse_action(text, None)
    assert parsed.answer == answer and extract_answer(text) == answer


def test_a_command_env_reads_past_a_template_opened_think():
    assert parse_action("go west? no.</think>go north", None, "command").command == "go north"
