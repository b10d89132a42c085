"""Reward functions in TRL's form ``fn(completions, **kwargs) -> list[float | None]`` (None = not applicable),
rubrics, and trainer adapters. See docs/rewards.md.

Nothing heavy is imported here: Math-Verify starts in worker processes on the first math reward.
"""

from toolgym.rewards.adapters import to_verl
from toolgym.rewards.code import code_tests
from toolgym.rewards.counters import counters, reset_counters
from toolgym.rewards.extract import extract_answer, strip_reasoning
from toolgym.rewards.format import (
    overlong_penalty,
    single_answer,
    tag_balance,
    tool_call_bonus,
    tool_call_format,
    void_turn,
)
from toolgym.rewards.judge import Judge, JudgeRubric, judge  # the function shadows its module's name here
from toolgym.rewards.math import math_match, math_match_async
from toolgym.rewards.numeric import numeric_match, parse_number
from toolgym.rewards.qa import exact_match, substring_match, token_f1
from toolgym.rewards.rubric import Rubric, RubricResult
from toolgym.rewards.shaping import Progressive, has_answer, information_gain, information_gain_rewards

REWARD_FUNCTIONS = {
    f.__name__: f
    for f in (
        numeric_match,
        math_match,
        exact_match,
        token_f1,
        substring_match,
        code_tests,
        tool_call_format,
        single_answer,
        tag_balance,
        tool_call_bonus,
        overlong_penalty,
        void_turn,
        has_answer,
    )
}
"""The reward functions by name (``toolgym serve-reward --reward NAME``)."""

__all__ = [
    "REWARD_FUNCTIONS",
    "Judge",
    "JudgeRubric",
    "Progressive",
    "Rubric",
    "RubricResult",
    "code_tests",
    "counters",
    "exact_match",
    "extract_answer",
    "has_answer",
    "information_gain",
    "information_gain_rewards",
    "judge",
    "math_match",
    "math_match_async",
    "numeric_match",
    "overlong_penalty",
    "parse_number",
    "reset_counters",
    "single_answer",
    "strip_reasoning",
    "substring_match",
    "tag_balance",
    "to_verl",
    "token_f1",
    "tool_call_bonus",
    "tool_call_format",
    "void_turn",
]
