"""The ``scripted`` backend: each env family's expert (``env.expert_action()``) behind the ``Policy`` protocol.

It reads the env, not the conversation, so ``act`` needs ``envs=`` (the runner passes them). Used by
tests, benchmarks (no model cost: it measures the runner itself) and to make SFT data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolgym.agents.policy import (
    AssistantTurn,
    Conversation,
    SamplingParams,
    ToolDicts,
    broadcast_tools,
    parse_turn,
)
from toolgym.errors import ConfigError, InfrastructureError

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
            # a Ray env's proxy (toolgym/ray_envs.py) calls the expert on its worker
            inner: Any = env.unwrapped if getattr(env, "remote", False) else tool_env(env)
            text = inner.expert_action()
            turns.append(AssistantTurn(text=text, message=parse_turn(text, tl, inner.action_format)))
        return turns


Transcript = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (messages, tools)


def expert_transcripts(
    env_ids: Sequence[str],
    env_kwargs: dict[str, Any] | None = None,
    episodes: int = 1,
    *,
    first_seed: int = 0,
    concurrency: int = 1,
) -> list[Transcript]:
    """The successful episodes of each env's scripted expert, as ``(messages, tools)`` for SFT data.

    Each assistant message is the expert's text as written (``{"role": "assistant", "content": text}``), not
    the parsed message, so a model trained on it learns to write exactly what the env read. The episodes
    run through the one episode runner (env by env, seed by seed: seeds ``first_seed``…); an env fault
    raises, since SFT data with an episode left out for an infra reason would silently change.

    >>> convs = expert_transcripts(["toolgym/Calculator-v0"], {"prompt_format": "text"}, 2)
    >>> [m["role"] for m in convs[0][0]], convs[0][0][2]["content"][:12]
    (['system', 'user', 'assistant', 'tool', 'assistant'], '<tool_call>{')
    """
    from toolgym.agents.runner import run_episodes

    trajs = run_episodes(
        ScriptedPolicy(), list(env_ids), episodes, first_seed=first_seed, concurrency=concurrency,
        env_kwargs=env_kwargs,
    )  # fmt: skip
    broken = [t for t in trajs if t.error is not None]
    if broken:
        t = broken[0]
        raise InfrastructureError(f"{t.env_id} seed {t.seed}: the expert's episode failed: {t.error}")
    out: list[Transcript] = []
    for t in trajs:
        if t.success:
            texts = iter(t.turn_texts)
            messages = [
                {"role": "assistant", "content": next(texts)} if m["role"] == "assistant" else m
                for m in t.messages
            ]
            out.append((messages, list(t.tools)))
    return out
