"""Every toolgym id, registered with Gymnasium. Bump -vN when reward semantics change.

Each env family is a subpackage of ``toolgym.envs`` whose ``__init__`` declares ``ENVS = {id: "module:Class"}``
and imports nothing heavy; the ids of every family are collected here, so adding a family never edits this
file. Entry points are strings, so registering imports nothing heavy; the env module loads on ``gym.make``.
Turn limits live in the envs themselves (``max_turns``), not in a TimeLimit wrapper, so that
``info["truncation"]`` always says why an episode stopped.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from gymnasium.envs.registration import register, registry


def _collect() -> dict[str, str]:
    found: dict[str, str] = {}
    for module in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if not module.ispkg:
            continue
        family = importlib.import_module(f"toolgym.envs.{module.name}")
        found.update(getattr(family, "ENVS", {}))
    return found


ENVS: dict[str, str] = _collect()


def register_all() -> None:
    for env_id, entry_point in ENVS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, disable_env_checker=True)
