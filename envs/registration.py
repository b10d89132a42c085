"""Every toolgym id, registered with Gymnasium. Bump -vN when reward semantics change.

Entry points are strings, so registering imports nothing heavy; the env module loads on ``gym.make``.
Turn limits live in the envs themselves (``max_turns``), not in a TimeLimit wrapper, so that
``info["truncation"]`` always says why an episode stopped.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

ENVS: dict[str, str] = {
    "toolgym/Calculator-v0": "toolgym.envs.calculator.env:CalculatorEnv",
}


def register_all() -> None:
    for env_id, entry_point in ENVS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, disable_env_checker=True)
