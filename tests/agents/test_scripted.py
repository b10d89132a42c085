"""The scripted expert's SFT transcripts through the one episode runner equal those of the trainer's own
reset/expert/step loop (``trainers.sft.expert_conversations``), message for message. The first case's
list-valued kwargs (``num_ops``) once failed every episode's reset in the runner (envs were pooled under the
kwargs themselves, unhashable)."""

from __future__ import annotations

from typing import Any

import pytest

from toolgym.agents.scripted import expert_transcripts
from toolgym.trainers.sft import expert_conversations

CALC = "toolgym/Calculator-v0"


@pytest.mark.parametrize(
    ("env_ids", "kwargs"),
    [
        ([CALC], {"prompt_format": "text", "max_turns": 3, "num_ops": [1, 2], "split": "train"}),
        ([CALC], {"action_format": "tags", "ops_per_call": 1, "num_ops": [2, 3]}),
        ([CALC, "toolgym/Household-v0"], {"prompt_format": "text"}),
    ],
)
def test_transcripts_equal_the_trainers_loop(env_ids: list[str], kwargs: dict[str, Any]) -> None:
    seed = 1
    ours = expert_transcripts(env_ids, kwargs, 4, first_seed=seed * 1_000_003)
    theirs = expert_conversations(env_ids, kwargs, 4, seed=seed)
    assert ours == theirs
    assert any(m["role"] == "assistant" and "tool_calls" not in m for m in ours[0][0])


def test_max_turns_cuts_episodes_that_are_then_left_out() -> None:
    kwargs = {"action_format": "tags", "ops_per_call": 1, "num_ops": [3], "max_turns": 2}
    assert expert_transcripts([CALC], kwargs, 3) == []
