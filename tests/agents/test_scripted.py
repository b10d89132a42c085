"""The scripted expert's SFT transcripts through the one episode runner equal those of a plain
reset/expert/step loop (the SFT trainer's own loop before it called the runner), message for message. The
first case's list-valued kwargs (``num_ops``) once failed every episode's reset in the runner (envs were
pooled under the kwargs themselves, unhashable)."""

from __future__ import annotations

from typing import Any

import pytest

from toolgym.agents.scripted import expert_transcripts
from toolgym.trainers.sft import expert_conversations

CALC = "toolgym/Calculator-v0"


def plain_loop(env_ids: list[str], kwargs: dict[str, Any], episodes: int, first_seed: int) -> list[Any]:
    """The reference: each env's expert stepped by hand, successful episodes kept as (messages, tools)."""
    import gymnasium as gym

    import toolgym  # noqa: F401  (registers the envs)
    from toolgym.envs.base import tool_env

    out = []
    for env_id in env_ids:
        env = gym.make(env_id, **kwargs)
        try:
            for i in range(episodes):
                obs, info = env.reset(seed=first_seed + i)
                messages, tools = list(obs), list(info.get("tools") or [])
                done, success = False, False
                while not done:
                    action = tool_env(env).expert_action()
                    messages.append({"role": "assistant", "content": action})
                    obs, _, terminated, truncated, info = env.step(action)
                    messages += list(obs)
                    done = terminated or truncated
                    success = bool(info.get("success"))
                if success:
                    out.append((messages, tools))
        finally:
            env.close()
    return out


@pytest.mark.parametrize(
    ("env_ids", "kwargs"),
    [
        ([CALC], {"prompt_format": "text", "max_turns": 3, "num_ops": [1, 2], "split": "train"}),
        ([CALC], {"action_format": "tags", "ops_per_call": 1, "num_ops": [2, 3]}),
        ([CALC, "toolgym/Household-v0"], {"prompt_format": "text"}),
    ],
)
def test_transcripts_equal_a_plain_loop(env_ids: list[str], kwargs: dict[str, Any]) -> None:
    seed = 1
    ours = expert_transcripts(env_ids, kwargs, 4, first_seed=seed * 1_000_003)
    assert ours == plain_loop(env_ids, kwargs, 4, first_seed=seed * 1_000_003)
    assert expert_conversations(env_ids, kwargs, 4, seed=seed) == ours
    assert any(m["role"] == "assistant" and "tool_calls" not in m for m in ours[0][0])


def test_max_turns_cuts_episodes_that_are_then_left_out() -> None:
    kwargs = {"action_format": "tags", "ops_per_call": 1, "num_ops": [3], "max_turns": 2}
    assert expert_transcripts([CALC], kwargs, 3) == []
