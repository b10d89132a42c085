"""Every toolgym id, registered with Gymnasium. Bump -vN when reward semantics change.

Each env family is a subpackage of ``toolgym.envs`` whose ``__init__`` declares ``ENVS = {id: "module:Class"}``
and imports nothing heavy; the ids of every family are collected here, so adding a family never edits this
file. Third-party packages add ids through the ``toolgym.envs`` entry point group: each entry point names a
module (or a dict) with an ``ENVS`` mapping; a broken plugin is a warning that names it, never a failed
import. ``ORIGINS`` says where each id came from ("toolgym" or the plugin's distribution). Entry points are strings, so registering imports nothing heavy; the env module loads on ``gym.make``.
Turn limits live in the envs themselves (``max_turns``), not in a TimeLimit wrapper, so that
``info["truncation"]`` always says why an episode stopped.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from importlib.metadata import entry_points
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


def _plugins() -> tuple[dict[str, str], dict[str, str]]:
    found: dict[str, str] = {}
    origins: dict[str, str] = {}
    for ep in entry_points(group="toolgym.envs"):
        origin = ep.dist.name if ep.dist is not None else ep.value
        try:
            loaded = ep.load()
            ids = loaded if isinstance(loaded, dict) else getattr(loaded, "ENVS", None)
            if not isinstance(ids, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in ids.items()
            ):
                raise TypeError("it must name a module or dict with ENVS = {id: 'module:Class'}")
        except Exception as exc:  # a broken plugin must not break `import toolgym`
            warnings.warn(f"toolgym: env plugin {ep.name!r} ({origin}) was skipped: {exc}", stacklevel=2)
            continue
        for env_id, entry in ids.items():
            if env_id in ENVS or env_id in found:
                warnings.warn(
                    f"toolgym: env plugin {origin} redefines {env_id}; kept the first", stacklevel=2
                )
                continue
            found[env_id] = entry
            origins[env_id] = origin
    return found, origins


ENVS: dict[str, str] = _collect()
ORIGINS: dict[str, str] = dict.fromkeys(ENVS, "toolgym")
_found, _origins = _plugins()
ENVS.update(_found)
ORIGINS.update(_origins)


def register_all() -> None:
    for env_id, entry_point in ENVS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, disable_env_checker=True)
