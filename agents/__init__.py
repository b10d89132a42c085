"""Agents: policies, token-faithful chat rendering and the episode runner (docs/architecture.md).

The public API (docs/agents.md describes it)::

    from toolgym.agents import HFPolicy, SamplingParams, run_episodes, save_trajectories
    policy = HFPolicy("smollm2-135m")                  # or make_policy("hf:…" | "openai:URL" | "scripted")
    trajs = run_episodes(policy, "toolgym/Calculator-v0", episodes=8,
                         sampling=SamplingParams(temperature=0.7), env_kwargs={"prompt_format": "text"})

Backends that need torch or httpx load on first use, so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolgym.agents.factory import AGENT_HELP, make_policy
from toolgym.agents.policy import (
    AssistantTurn,
    Generation,
    Policy,
    SamplingParams,
    TokenPolicy,
    parse_turn,
)
from toolgym.agents.rendering import ChatRenderer, TemplateCheck, check_template
from toolgym.agents.runner import EpisodeRunner, EpisodeSpec, episode_specs, run_episodes
from toolgym.agents.scripted import ScriptedPolicy
from toolgym.agents.trajectory import Trajectory, load_trajectories, save_trajectories

if TYPE_CHECKING:
    from toolgym.agents.hf import HFPolicy
    from toolgym.agents.openai_client import OpenAIPolicy

__all__ = [
    "AGENT_HELP",
    "AssistantTurn",
    "ChatRenderer",
    "EpisodeRunner",
    "EpisodeSpec",
    "Generation",
    "HFPolicy",
    "OpenAIPolicy",
    "Policy",
    "SamplingParams",
    "ScriptedPolicy",
    "TemplateCheck",
    "TokenPolicy",
    "Trajectory",
    "check_template",
    "episode_specs",
    "load_trajectories",
    "make_policy",
    "parse_turn",
    "run_episodes",
    "save_trajectories",
]

_LAZY = {"HFPolicy": "toolgym.agents.hf", "OpenAIPolicy": "toolgym.agents.openai_client"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'toolgym.agents' has no attribute {name!r}")
