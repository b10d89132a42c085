"""``toolgym.make_vec``: n copies of a toolgym env as one ``gymnasium.vector.VectorEnv``.

The API is gymnasium's (``reset`` / ``step`` over a batch, ``step_async`` / ``step_wait``, ``call``,
``get_attr``), built on gymnasium's own ``SyncVectorEnv`` and ``AsyncVectorEnv``; only the defaults and one
attribute are ours:

- **Autoreset: ``SAME_STEP`` by default.** The step that ends an episode resets that env at once and returns
  the new episode's first messages as its observation; the last step's observation and info are in
  ``infos["final_obs"]`` / ``infos["final_info"]`` (masked by ``infos["_final_obs"]``). Gymnasium's default,
  ``NEXT_STEP``, would ignore the action of the step after an episode ends: for an LLM agent a generated
  turn thrown away. ``autoreset_mode="next_step"`` or ``"disabled"`` give gymnasium's other modes.
- **Text observations.** A batch observation is a tuple of n message lists (each env's ``Messages``); the
  action is a sequence of n model turns (text, or assistant messages).
- **Per-env info.** ``infos`` is gymnasium's dict of arrays with ``_key`` masks; ``vec.env_infos`` holds the
  same step's n info dicts unbatched (``env_infos[i]["tools"]`` is env i's tool specs after a reset).
- **``mode="async"``** runs each env in its own worker process (gymnasium's ``AsyncVectorEnv``, no shared
  memory: observations are text), so n sandboxed or browser envs step in parallel; ``step_async`` sends a
  batch and ``step_wait`` collects it, so a caller can generate the next turns meanwhile. For continuous
  batching, ``send(i, action)`` steps env i alone as soon as its turn is generated, ``ready()`` lists the
  envs whose step finished and ``recv(i)`` returns that env's ``(obs, reward, terminated, truncated, info)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from toolgym.errors import ConfigError

MODES = ("sync", "async")
AUTORESET = {
    "same_step": AutoresetMode.SAME_STEP,
    "next_step": AutoresetMode.NEXT_STEP,
    "disabled": AutoresetMode.DISABLED,
}


class _PerEnvInfos:
    """Keeps each env's own info dict of the last reset/step beside gymnasium's batched one."""

    num_envs: int
    env_infos: list[dict[str, Any]]

    def _add_info(
        self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int
    ) -> dict[str, Any]:
        self._depth = getattr(self, "_depth", 0) + 1  # gymnasium recurses into nested dicts: keep the top
        try:
            if self._depth == 1:
                self._keep(env_info, env_num)
            return super()._add_info(vector_infos, env_info, env_num)  # type: ignore[misc,no-any-return]
        finally:
            self._depth -= 1

    def _keep(self, env_info: dict[str, Any], env_num: int) -> None:
        if set(env_info) == {"final_obs", "final_info"}:
            # sync SAME_STEP reports the ended episode first; env i's info is the new episode's, with the
            # ended one's under "final_obs" / "final_info" (as the async workers send it)
            self._final[env_num] = env_info
            return
        final = self._final.pop(env_num, None)
        self.env_infos[env_num] = env_info if final is None else {**env_info, **final}

    def _fresh(self) -> None:
        self.env_infos = [{} for _ in range(self.num_envs)]
        self._final: dict[int, Any] = {}


class ToolSyncVectorEnv(_PerEnvInfos, SyncVectorEnv):
    """Envs stepped one after another in this process."""

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> Any:
        self._fresh()
        return super().reset(seed=seed, options=options)

    def step(self, actions: Any) -> Any:
        self._fresh()
        return super().step(actions)


class ToolAsyncVectorEnv(_PerEnvInfos, AsyncVectorEnv):
    """Each env in its own worker process; ``step_async``/``step_wait`` split a step."""

    def reset_async(
        self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        if self._in_flight:
            raise RuntimeError(
                f"envs {sorted(self._in_flight)} have a step in flight (send): recv them first"
            )
        super().reset_async(seed=seed, options=options)

    def reset_wait(self, timeout: int | float | None = None) -> Any:
        self._fresh()
        return super().reset_wait(timeout=timeout)

    def step_wait(self, timeout: int | float | None = None) -> Any:
        self._fresh()
        return super().step_wait(timeout=timeout)

    def step_async(self, actions: Any) -> None:
        if self._in_flight:
            raise RuntimeError(
                f"envs {sorted(self._in_flight)} have a step in flight (send): recv them first"
            )
        super().step_async(actions)

    # ----- one env at a time: continuous batching ------------------------------------------------------
    @property
    def _in_flight(self) -> set[int]:
        return self.__dict__.setdefault("_sent", set())

    def send(self, index: int, action: Any) -> None:
        """Starts a step of env ``index`` alone, e.g. as soon as the engine has generated that env's turn;
        ``recv(index)`` returns its ``(obs, reward, terminated, truncated, info)`` (SAME_STEP autoreset as in
        a batch step). Batch ``step``/``reset`` wait until every sent step is received."""
        from gymnasium.vector.async_vector_env import AsyncState

        self._assert_is_running()
        if self._state != AsyncState.DEFAULT:
            raise RuntimeError(f"a batch call is pending ({self._state.value}): finish it before send")
        if not 0 <= index < self.num_envs or index in self._in_flight:
            raise RuntimeError(f"env {index} does not exist or already has a step in flight")
        self.parent_pipes[index].send(("step", action))
        self._in_flight.add(index)

    def ready(self, timeout: float | None = 0.0) -> list[int]:
        """The envs whose sent step has finished (waiting up to ``timeout`` seconds for the first one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = [i for i in sorted(self._in_flight) if self.parent_pipes[i].poll()]
            if done or not self._in_flight or (deadline is not None and time.monotonic() >= deadline):
                return done
            time.sleep(0.001)

    def recv(self, index: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """The result of env ``index``'s sent step (blocks until it is there)."""
        if index not in self._in_flight:
            raise RuntimeError(f"env {index} has no step in flight: send it one first")
        result, success = self.parent_pipes[index].recv()
        self._in_flight.discard(index)
        self._raise_if_errors([success])
        obs, reward, terminated, truncated, info = result
        self.env_infos[index] = info
        return obs, float(reward), bool(terminated), bool(truncated), info


class _EnvFactory:
    """A picklable ``gym.make(env_id, **kwargs)`` (async workers may be spawned, not forked)."""

    def __init__(self, env_id: str, kwargs: dict[str, Any]) -> None:
        self.env_id, self.kwargs = env_id, kwargs

    def __call__(self) -> gym.Env[Any, Any]:
        import toolgym  # noqa: F401  (a spawned worker registers the ids)

        return gym.make(self.env_id, **self.kwargs)


def make_vec(
    env_id: str,
    n: int,
    mode: str = "sync",
    *,
    autoreset_mode: str = "same_step",
    env_kwargs: Sequence[dict[str, Any]] | None = None,
    context: str | None = None,
    **kwargs: Any,
) -> ToolSyncVectorEnv | ToolAsyncVectorEnv:
    """``n`` copies of ``env_id`` (each made with ``gym.make(env_id, **kwargs)``) as one vector env.

    ``mode``: ``"sync"`` (one process, envs in turn) or ``"async"`` (a worker process per env).
    ``autoreset_mode``: ``"same_step"`` (default; see the module docstring), ``"next_step"`` or ``"disabled"``.
    ``env_kwargs``: n dicts of per-env kwargs, merged over ``kwargs`` (e.g. a different ``sandbox_options``).
    ``context``: the async workers' multiprocessing start method (default: gymnasium's).

    >>> vec = make_vec("toolgym/Calculator-v0", 2)
    >>> obs, infos = vec.reset(seed=0)
    >>> len(obs), obs[0][1]["role"], vec.env_infos[1]["tools"][0]["function"]["name"]
    (2, 'user', 'calculator')
    >>> vec.close()
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    if autoreset_mode not in AUTORESET:
        raise ConfigError(f"autoreset_mode must be one of {tuple(AUTORESET)}, got {autoreset_mode!r}")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"n must be an int >= 1, got {n!r}")
    if env_kwargs is not None and len(env_kwargs) != n:
        raise ConfigError(f"env_kwargs must hold n={n} dicts, got {len(env_kwargs)}")
    if env_id not in gym.registry:
        raise ConfigError(f"unknown env id {env_id!r} (see `toolgym list`)")
    per_env = env_kwargs or [{} for _ in range(n)]
    fns: list[Callable[[], gym.Env[Any, Any]]] = [
        _EnvFactory(env_id, {**kwargs, **extra}) for extra in per_env
    ]
    reset_mode = AUTORESET[autoreset_mode]
    if mode == "sync":
        return ToolSyncVectorEnv(fns, copy=False, autoreset_mode=reset_mode)
    return ToolAsyncVectorEnv(
        fns, shared_memory=False, copy=False, context=context, autoreset_mode=reset_mode
    )


def _expert_rewards(env: gym.Env[Any, Any], seed: int | None) -> list[float]:
    """The rewards of one expert episode of a single env."""
    env.reset(seed=seed)
    inner: Any = env.unwrapped
    rewards: list[float] = []
    for _ in range(int(inner.max_turns)):
        _, r, te, tr, _ = env.step(inner.expert_action())
        rewards.append(float(r))
        if te or tr:
            break
    return rewards


def check_vector(env_id: str, n: int = 2, mode: str = "sync", seed: int = 0, **kwargs: Any) -> None:
    """``toolgym check``'s vector check: through ``make_vec``, env i reset with seed ``seed + i`` and played
    by the scripted expert shows the same first messages and earns the same rewards as one ``gym.make`` env,
    and the step that ends its episode resets it (a new first observation, the ended episode's info under
    ``final_info``). Raises AssertionError naming the first difference."""
    seeds: list[int | None] = [seed + i for i in range(n)]
    single = gym.make(env_id, **kwargs)
    try:
        firsts = [single.reset(seed=s)[0] for s in seeds]
        expected = [_expert_rewards(single, s) for s in seeds]
    finally:
        single.close()
    vec = make_vec(env_id, n, mode, **kwargs)
    try:
        obs, _ = vec.reset(seed=seeds)
        for i in range(n):
            if obs[i] != firsts[i]:
                raise AssertionError(
                    f"env {i}: the first observation differs from gym.make's (seed {seeds[i]})"
                )
        got: list[list[float]] = [[] for _ in seeds]
        live = np.ones(n, dtype=bool)
        while live.any():
            obs, rewards, terms, truncs, _ = vec.step(list(vec.call("expert_action")))
            for i in map(int, np.flatnonzero(live)):
                got[i].append(float(rewards[i]))
                if terms[i] or truncs[i]:
                    live[i] = False
                    info = vec.env_infos[i]
                    if "final_info" not in info or "tools" not in info or obs[i][0].get("role") != "system":
                        raise AssertionError(f"env {i} was not reset in the step that ended its episode")
                elif len(got[i]) > len(expected[i]):
                    raise AssertionError(f"env {i}: its episode runs longer through make_vec than alone")
        for i in range(n):
            if not np.allclose(got[i], expected[i]):
                raise AssertionError(f"env {i}: rewards {got[i]} through make_vec, {expected[i]} alone")
    finally:
        vec.close()
