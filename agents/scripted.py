"""The ``scripted`` backend: each env family's expert (``env.expert_action()``) behind the ``Policy`` protocol.

It reads the env, not the conversation, so ``act`` needs ``envs=`` (the runner passes them). Used by
tests, benchmarks (no model cost: it measures the runner itself) and to make SFT data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from toolgym.agents.policy import (
    AssistantTurn,
    Conversation,
    SamplingParams,
    ToolDicts,
    broadcast_tools,
    parse_turn,
)
from toolgym.errors import ConfigError

if TYPE_CHECKING:
    from toolgym.envs.base import ToolEnv


class ScriptedPolicy:
    """Plays each env's scripted expert.

    >>> import gymnasium as gym, toolgym
    >>> env = gym.make("toolgym/Calculator-v0")
    >>> obs, info = env.reset(seed=0)
    >>> turn = ScriptedPolicy().act([obs], [info["tools"]], envs=[env])[0]
    >>> turn.message.tool_calls[0].name
    'calculator'
    """

    name = "scripted"

    def act(
        self,
        conversations: Sequence[Conversation],
        tools: Sequence[ToolDicts | None] | None = None,
        *,
        sampling: SamplingParams | None = None,
        envs: Sequence[ToolEnv | None] | None = None,
    ) -> list[AssistantTurn]:
        from toolgym.envs.base import tool_env

        if envs is None or len(envs) != len(conversations) or any(e is None for e in envs):
            raise ConfigError(
                "the scripted policy plays the env's expert: pass envs= (one env per conversation), "
                "or run it through toolgym.agents.run_episodes"
            )
        tool_lists = broadcast_tools(tools, len(conversations))
        turns = []
        for env, tl in zip(envs, tool_lists, strict=True):
            assert env is not None
            text = tool_env(env).expert_action()
            turns.append(AssistantTurn(text=text, message=parse_turn(text, tl, tool_env(env).action_format)))
        return turns
