"""Gymnasium text environments for tool-using agents. ``list_envs()`` describes every registered id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolgym.envs.registration import ENVS, ORIGINS, register_all

if TYPE_CHECKING:
    from toolgym.envs.base import ToolEnv

__all__ = ["ENVS", "ORIGINS", "EnvInfo", "list_envs", "register_all"]


@dataclass(frozen=True)
class EnvInfo:
    id: str
    family: str
    tools: tuple[str, ...]
    description: str
    expert_success_rate: float
    origin: str = "toolgym"


def list_envs() -> list[EnvInfo]:
    """Id, family, tools and one-line description of every toolgym env (imports each env's module)."""
    out = []
    for env_id in ENVS:
        cls = _load(ENVS[env_id])
        env = cls()
        try:
            tools = tuple(t.name for t in env.tool_specs)
        finally:
            env.close()
        doc = (cls.__doc__ or "").strip().splitlines()
        first = doc[0] if doc else ""
        out.append(EnvInfo(env_id, cls.family, tools, first, float(cls.expert_success_rate), ORIGINS[env_id]))
    return out


def _load(entry_point: str) -> type[ToolEnv]:
    import importlib

    module, name = entry_point.split(":")
    from toolgym.envs.base import ToolEnv

    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, ToolEnv), entry_point
    return cls
