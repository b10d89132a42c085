"""The envs of a rollout's trees: made by id, pooled between paths, put in a tree node's state, stepped.

Forking an env: a forkable env (`env.unwrapped.supports_fork`) is snapshotted with `get_state()` on every
env node while a branching policy is active (`snapshots`), and a fork restores the snapshot into a pooled
env with `set_state`; otherwise the fork resets a pooled env with the task's seed and replays the path's
actions. Envs are stepped through `env.unwrapped` (the ToolEnv): gymnasium wrappers keep state
(TimeLimit's step count) that `set_state` cannot restore; the env's own `max_turns` ends episodes instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from toolgym.agents.episode_loop import EnvPool, close_quietly
from toolgym.envs.base import action_reader
from toolgym.trainers.tree import RolloutTree


class TreeEnvs:
    """Envs of ids made with ``env_kwargs``; every call may run on a thread of the episode loop."""

    def __init__(self, env_kwargs: dict[str, Any], snapshots: bool) -> None:
        self.env_kwargs = dict(env_kwargs)
        self.snapshots = snapshots
        self._pool = EnvPool()
        self._wrappers: list[Any] = []  # every env made (closed through its gymnasium wrappers)
        self._lock = threading.Lock()

    def reset(self, env_id: str, seed: int) -> tuple[Any, list[dict[str, Any]], dict[str, Any], Any]:
        """(a pooled env reset with ``seed``, its first messages, its info, its snapshot or None)."""
        env = self.acquire(env_id)
        obs, info = env.reset(seed=seed)
        snap = env.get_state() if self.snapshots and env.supports_fork else None
        return env, obs, info, snap

    def at(self, tree: RolloutTree, node_id: int) -> Any:
        """A pooled env in the state before the next turn from `node_id` (restored, or replayed)."""
        anchor = node_id
        while tree.nodes[anchor].kind == "model":
            anchor = tree.nodes[anchor].parent  # type: ignore[assignment]
        env = self.acquire(tree.meta["env_id"])
        try:
            env.reset(seed=tree.meta["seed"])
            snap = tree.nodes[anchor].info.get("snapshot")
            if snap is not None:
                env.set_state(snap)
                return env
            for n in tree.path(anchor):  # replay: the actions of the turns before the anchor
                if "action" in tree.nodes[n].info:
                    env.step(tree.nodes[n].info["action"])
        except Exception:
            close_quietly(env)  # a broken env is closed, never pooled
            raise
        return env

    def stepper(self, env: Any, text: str) -> Callable[[], tuple[Any, ...]]:
        """The env call that steps ``env`` with a model turn's ``text``."""

        def step() -> tuple[Any, ...]:
            # the turn's one parse, by the env's parser: step takes it as it is, the tree keeps its calls
            reader = action_reader(env)
            read = reader(text) if reader is not None else None
            obs, reward, terminated, truncated, info = env.step(read if read is not None else text)
            snap = None
            if self.snapshots and not (terminated or truncated) and env.supports_fork:
                snap = env.get_state()
            return obs, reward, terminated, truncated, info, snap, read

        return step

    def acquire(self, env_id: str) -> Any:
        return self._pool.acquire(env_id, lambda: self._make(env_id))

    def release(self, env_id: str, env: Any) -> None:
        self._pool.release(env_id, env)

    def _make(self, env_id: str) -> Any:
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids)
        from toolgym.envs.base import tool_env

        wrapped = gym.make(env_id, **self.env_kwargs)
        with self._lock:
            self._wrappers.append(wrapped)
        return tool_env(wrapped)

    def close(self) -> None:
        for w in self._wrappers:
            close_quietly(w)  # best effort: a failing close must not hide results
        self._pool.drain()
        self._wrappers = []
