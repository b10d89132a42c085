"""The episode runner: many episodes over many envs, interleaved, with one batched policy call a round.

Each episode is an ``Episode`` of the one episode loop (agents/episode_loop.py), which also runs the
trainers' rollout trees: reset, then a turn and an env step until the episode ends. Each round, every live episode that waits for the model is put in one batch: a token-level policy
(``hf``) gets the prompt ids kept per episode (``ChatRenderer``: turn k+1's prompt is turn k's prompt +
its sampled ids + the rendered env suffix, never re-tokenized); other policies get the message lists.
Then each env steps (in a thread pool when ``env_workers > 0``, for envs that wait on I/O).

With our engine (``EnginePolicy``) there are no rounds: continuous batching over every episode. Each
episode is one engine sequence; a turn that ends leaves the decode batch at once, its env step (and every
reset) runs on a thread pool while the GPU keeps decoding the other episodes, and the sequence comes back
with only the env's reply to prefill (its KV stays in its slot, unless evicted for lack of slots).

A token-level policy's turn is parsed once, by the env's own parser: the runner has the env read it
(``ToolEnv.read_action``, on the env's thread), records the env's assistant message (the tool call ids the
env's tool results answer) and steps with that ``ParsedAction``, which ``step`` takes without parsing again.
Where the env cannot take one (``Remote-v0``, an ``ActionWrapper``) the policy parses and the env steps on
the text, as for ``act`` policies (their backend already returned the parsed message).

An exception from an env's ``reset``/``step`` (or an env reporting ``truncation == "env_error"``, or a
backend turn with ``finish_reason == "error"``) ends that episode only: it is recorded with ``error`` set
(an infrastructure failure, not the model's), the env is closed and replaced, and the run goes on. A turn no
rollout server answered (``TurnFailed`` from the engine's step, e.g. ``VLLMPolicy``'s ``RequestFailed``) ends
its episode the same way (``error`` ``"policy: rollout server: ..."``, ``truncation == "env_error"``), but
its env, which did nothing wrong, is pooled again; the other episodes go on in the same engine.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.episode_loop import (
    Answered,
    EnvCalls,
    EnvPool,
    Episode,
    EpisodeLoop,
    Fault,
    Generate,
    LoopStats,
    close_quietly,
    submit_turn,
)
from toolgym.agents.policy import AssistantTurn, Policy, SamplingParams, TokenPolicy, context_of
from toolgym.agents.trajectory import Trajectory
from toolgym.envs.base import ParsedAction, action_reader
from toolgym.errors import ConfigError
from toolgym.messages import Message

EnvFactory = Callable[[], Any]


@dataclass(frozen=True)
class EpisodeSpec:
    """Which env (an id for ``gym.make``) and which seed; ``kwargs`` go to ``gym.make``."""

    env_id: str
    seed: int | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def env_key(self) -> tuple[str, str]:
        """What envs are pooled under: the id and the kwargs as text (a value may be a list, unhashable).

        >>> EpisodeSpec("a", 0, (("num_ops", [1, 2]),)).env_key
        ('a', "(('num_ops', [1, 2]),)")
        """
        return self.env_id, repr(self.kwargs)


def episode_specs(
    env_ids: Iterable[str], episodes: int, *, first_seed: int = 0, **kwargs: Any
) -> list[EpisodeSpec]:
    """``episodes`` seeds (``first_seed``…) for each env id.

    >>> [(s.env_id, s.seed) for s in episode_specs(["a", "b"], 2)]
    [('a', 0), ('a', 1), ('b', 0), ('b', 1)]
    """
    items = tuple(sorted(kwargs.items()))
    return [EpisodeSpec(e, first_seed + i, items) for e in env_ids for i in range(episodes)]


@dataclass
class _Live:
    spec: EpisodeSpec
    env: Any
    traj: Trajectory
    started: float
    tools: list[dict[str, Any]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # ids to append before the next prompt (mask 0)
    # the env's read_action when this runner parses turns through the env (token-level policies)
    reader: Callable[[Any], ParsedAction] | None = None
    seq: Any = None  # the episode's engine sequence (continuous)


class EpisodeRunner:
    """Runs ``EpisodeSpec``s with up to ``concurrency`` episodes live at once.

    ``make_env(spec)`` builds an env (default: ``gym.make(spec.env_id, **kwargs)``); envs are reused across
    episodes of the same spec kwargs. ``on_episode(trajectory)`` is called as each episode ends,
    ``on_round(n, live)`` before each batched policy call (each engine step, with the engine).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        concurrency: int = 64,
        sampling: SamplingParams | None = None,
        make_env: Callable[[EpisodeSpec], Any] | None = None,
        env_workers: int = 0,
        max_prompt_tokens: int | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
        on_round: Callable[[int, int], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self.policy = policy
        self.concurrency = concurrency
        self.sampling = sampling
        self.make_env = make_env or _gym_make
        self.env_workers = env_workers
        self.max_prompt_tokens = max_prompt_tokens
        self.on_episode = on_episode
        self.on_round = on_round  # (round number, live episodes) before each batched policy call
        self.token_level = isinstance(policy, TokenPolicy)
        # a token policy whose to_turn can skip its parse (RenderedTokenPolicy): the env's is then the only one
        self._lazy_turns = self.token_level and _has_parameter(getattr(policy, "to_turn", None), "parse")
        self.stats = {"policy_s": 0.0, "env_s": 0.0, "policy_calls": 0, "model_turns": 0, "total_s": 0.0}
        self._pool = EnvPool()
        self.continuous = getattr(policy, "engine", None) is not None and hasattr(policy, "generation")

    # ----- public ------------------------------------------------------------------------------------------
    def run(self, specs: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Run every spec; trajectories come back in the order of ``specs``."""
        results: list[Trajectory | None] = [None] * len(specs)
        live: dict[int, _Live] = {}
        stats = LoopStats()
        turns: _EngineTurns | _RoundTurns = _EngineTurns(self) if self.continuous else _RoundTurns(self)
        workers = (self.env_workers or 8) if self.continuous else self.env_workers
        loop = EpisodeLoop(
            concurrency=self.concurrency, env_workers=workers, on_step=self.on_round, stats=stats
        )
        try:
            loop.run(
                [functools.partial(self._episode, i, spec, live, results) for i, spec in enumerate(specs)],
                turns,
            )
        finally:
            for ep in live.values():  # the run was interrupted: nothing may leak
                if ep.env is not None:
                    close_quietly(ep.env)
                if ep.seq is not None and ep.seq.state in ("idle", "new"):
                    self.policy.engine.release(ep.seq)  # type: ignore[attr-defined]
            self.stats["policy_s"] += stats.generate_s
            self.stats["policy_calls"] += stats.generate_calls
            self.stats["env_s"] += stats.env_s
            self.stats["total_s"] += stats.wall_s
            if self.continuous:
                self.stats["idle_s"] = self.stats.get("idle_s", 0.0) + stats.idle_s
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Close every pooled env."""
        for env in self._pool.drain():
            close_quietly(env)

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- one episode (what it does, not when) ------------------------------------------------------------
    def _episode(
        self, idx: int, spec: EpisodeSpec, live: dict[int, _Live], results: list[Trajectory | None]
    ) -> Episode:
        """Reset, then turns and env steps until the episode ends; its trajectory goes to ``results[idx]``."""
        (ep,) = yield EnvCalls([functools.partial(self._start, spec)])
        if isinstance(ep, Fault):
            raise RuntimeError(f"{spec.env_id} seed {spec.seed}: starting the episode failed: {ep.error}")
        live[idx] = ep
        while ep.traj.error is None:
            (turn,) = yield Generate([ep])
            if turn is None:  # no room left in the engine's slot for another turn
                break
            if isinstance(turn, Fault):  # no rollout server answered the turn (`_EngineTurns.failed`)
                self._lost_turn(ep, turn)
                break
            (done,) = yield EnvCalls([functools.partial(self._step, ep, turn)])
            if isinstance(done, Fault):
                self._fail(ep, "step", RuntimeError(done.error))
            elif done:
                break
        del live[idx]
        results[idx] = self._finish(ep)
        if ep.seq is not None:
            self.policy.engine.release(ep.seq)  # type: ignore[attr-defined]

    def _start(self, spec: EpisodeSpec) -> _Live:
        traj = Trajectory(env_id=spec.env_id, seed=spec.seed, agent=getattr(self.policy, "name", ""))
        ep = _Live(spec, None, traj, time.perf_counter())
        try:
            ep.env = self._pool.acquire(spec.env_key, lambda: self.make_env(spec))
            obs, info = ep.env.reset(seed=spec.seed)
        except ConfigError:
            raise
        except Exception as exc:  # an env fault: this episode only
            self._fail(ep, "reset", exc)
            return ep
        ep.tools = list(info.get("tools") or [])
        ep.reader = action_reader(ep.env) if self.token_level else None
        traj.task_id = str(info.get("task_id", ""))
        traj.tools = ep.tools
        traj.messages = list(obs)
        if self.token_level:
            renderer = self.policy.renderer  # type: ignore[attr-defined]
            prompt = renderer.prompt_ids(obs, ep.tools)
            traj.token_ids = list(prompt)
            traj.loss_mask = [0] * len(prompt)
            traj.logprobs = [0.0] * len(prompt)
        return ep

    def _act(self, eps: list[_Live]) -> list[AssistantTurn | None]:
        """A round's turns: one batched policy call for every waiting episode (``None`` for an episode whose
        prompt and reply would pass the model's positions: it ends there as a ``token_budget`` truncation,
        instead of failing the batch or extrapolating past the context)."""
        turns: list[AssistantTurn | None]
        if self.token_level:
            policy: Any = self.policy
            for ep in eps:
                if ep.pending:
                    _extend_context(ep.traj, ep.pending)
                    ep.pending = []
            context = context_of(policy)
            fits = [True] * len(eps)
            if context is not None:
                sp = self.sampling or getattr(policy, "sampling", None) or SamplingParams()
                fits = [len(ep.traj.token_ids) + sp.max_new_tokens <= context for ep in eps]
            run = [ep for ep, ok in zip(eps, fits, strict=True) if ok]
            got = list(policy.generate([ep.traj.token_ids for ep in run], self.sampling)) if run else []
            if len(got) != len(run):
                raise ConfigError(f"{policy!r} returned {len(got)} turns for {len(run)} prompts")
            gens = iter(got)
            turns = []
            for ep, ok in zip(eps, fits, strict=True):
                if ok:
                    turns.append(self._to_turn(next(gens), ep, len(ep.traj.token_ids)))
                else:  # the model's own length, as when the engine's slot has no room left
                    ep.traj.truncated, ep.traj.truncation = True, "token_budget"
                    ep.traj.reward = sum(ep.traj.rewards)
                    turns.append(None)
            eps = run
        else:
            turns = list(
                self.policy.act(
                    [ep.traj.messages for ep in eps],
                    [ep.tools for ep in eps],
                    sampling=self.sampling,
                    envs=[ep.env for ep in eps],
                )
            )
            if len(turns) != len(eps):
                raise ConfigError(f"{self.policy!r} returned {len(turns)} turns for {len(eps)} conversations")
        self.stats["model_turns"] += len(eps)
        return turns

    def _step(self, ep: _Live, turn: AssistantTurn) -> bool:
        """Record the turn, step the env, record what came back; True when the episode is over."""
        traj = ep.traj
        traj.completion_tokens += len(turn.token_ids) or int(turn.usage.get("completion_tokens", 0))
        if self.token_level:
            start = len(traj.token_ids)
            traj.token_ids += turn.token_ids
            traj.loss_mask += [1] * len(turn.token_ids)
            traj.logprobs += turn.logprobs
            if turn.entropies is not None:
                traj.entropies += [0.0] * (start - len(traj.entropies)) + turn.entropies
            traj.turn_spans.append((start, len(traj.token_ids)))
        traj.turn_texts.append(turn.text)
        traj.finish_reasons.append(turn.finish_reason)
        if turn.finish_reason == "error":
            traj.messages.append(turn.message.to_dict())
            self._fail(ep, "policy", RuntimeError(turn.text or "the backend failed"))
            return True
        action, message = self._read(ep, turn)
        traj.messages.append(message.to_dict())
        try:
            obs, reward, terminated, truncated, info = ep.env.step(action)
        except Exception as exc:
            self._fail(ep, "step", exc)
            return True
        info = {k: v for k, v in info.items() if k != "tools"}
        traj.messages += obs
        traj.rewards.append(float(reward))
        traj.infos.append(info)
        if info.get("truncation") == "env_error":
            traj.error = str(info.get("infra_error", "the env reported an infrastructure error"))
        if terminated or truncated:
            traj.terminated, traj.truncated = bool(terminated), bool(truncated)
            traj.truncation = info.get("truncation")
            traj.success = bool(info.get("success", False))
            traj.reward = float(info.get("episode_reward", sum(traj.rewards)))
            traj.reward_components = dict(info.get("episode_reward_components", {}))
            return True
        if self.token_level:
            renderer = self.policy.renderer  # type: ignore[attr-defined]
            ep.pending = renderer.close_turn(turn.token_ids) + renderer.env_suffix(obs)
            needed = len(traj.token_ids) + len(ep.pending)
            if self.max_prompt_tokens is not None and needed > self.max_prompt_tokens:
                traj.truncated, traj.truncation = True, "token_budget"
                traj.reward = sum(traj.rewards)
                return True
        return False

    def _to_turn(self, gen: Any, ep: _Live, prompt_len: int) -> AssistantTurn:
        """A token-level turn, left unparsed where the env will parse it (on its thread, in ``_read``)."""
        policy: Any = self.policy
        if ep.reader is not None and self._lazy_turns:
            return policy.to_turn(gen, ep.tools, prompt_len, parse=False)
        return policy.to_turn(gen, ep.tools, prompt_len)

    @staticmethod
    def _read(ep: _Live, turn: AssistantTurn) -> tuple[Any, Message]:
        """What to step the env with and the assistant message to record: the env's reading of the turn (its
        one parse, passed on to its step) where the env reads turns, else the turn as the policy gave it."""
        if ep.reader is None:
            return turn.action, turn.message
        try:
            read = ep.reader(turn.action)
        except Exception:  # a family's parse that raises: step raises it again and the episode fails there
            return turn.action, turn.message
        return read, turn.message if turn.structured else read.assistant_message()

    def _fail(self, ep: _Live, where: str, exc: BaseException) -> None:
        ep.traj.error = f"{where}: {type(exc).__name__}: {exc}"
        ep.traj.truncated, ep.traj.truncation = True, "env_error"
        ep.traj.reward = sum(ep.traj.rewards)
        if ep.env is not None:
            close_quietly(ep.env)
            ep.env = None

    @staticmethod
    def _lost_turn(ep: _Live, fault: Fault) -> None:
        """The episode ends as an infrastructure failure; its env stays (pooled by ``_finish``)."""
        ep.traj.error = f"policy: {fault.error}"
        ep.traj.truncated, ep.traj.truncation = True, "env_error"
        ep.traj.reward = sum(ep.traj.rewards)

    def _finish(self, ep: _Live) -> Trajectory:
        ep.traj.duration_s = time.perf_counter() - ep.started
        if ep.traj.entropies:  # aligned with token_ids, 0.0 off the sampled tokens
            ep.traj.entropies += [0.0] * (len(ep.traj.token_ids) - len(ep.traj.entropies))
        if ep.env is not None:
            self._pool.release(ep.spec.env_key, ep.env)
        if self.on_episode is not None:
            self.on_episode(ep.traj)
        return ep.traj


class _RoundTurns:
    """The loop's ``RoundTurns`` for episodes: a round's turns in one batched policy call."""

    def __init__(self, runner: EpisodeRunner) -> None:
        self.runner = runner

    def generate(self, eps: list[_Live], left: int | None) -> list[AssistantTurn | None]:
        return self.runner._act(eps)


class _EngineTurns:
    """The loop's ``EngineTurns`` for episodes: each episode is one engine sequence, continued turn after turn
    (only the env's reply is prefilled: its KV stays in the slot unless evicted), released when it ends."""

    def __init__(self, runner: EpisodeRunner) -> None:
        from toolgym.agents.engine.engine_policy import mode_of

        policy: Any = runner.policy
        self.runner, self.policy, self.engine = runner, policy, policy.engine
        policy.refresh()
        self.sp = runner.sampling or policy.sampling
        self.mode = mode_of(self.sp, policy.top_k)
        if self.sp.seed is not None:
            self.engine.seed(self.sp.seed)

    def plan(self, eps: list[_Live], lefts: list[int | None]) -> list[Any]:
        out: list[Any] = []
        for ep in eps:
            if ep.seq is None:
                ep.seq = self.engine.new(ep.traj.token_ids)
            else:
                _extend_context(ep.traj, ep.pending)
                self.engine.extend(ep.seq, ep.pending)
                ep.pending = []
            if submit_turn(self.engine, ep.seq, self.mode, self.sp.max_new_tokens, self.sp.stop):
                out.append(ep.seq)
            else:  # the episode cannot fit the engine any more
                ep.traj.truncated, ep.traj.truncation = True, "token_budget"
                ep.traj.reward = sum(ep.traj.rewards)
                out.append(Answered(None))
        return out

    def result(self, ep: _Live, seq: Any) -> AssistantTurn:
        self.runner.stats["model_turns"] += 1
        return self.runner._to_turn(self.policy.generation(seq), ep, len(seq.ids) - len(seq.out))

    def failed(self, ep: _Live, seq: Any, error: str) -> Fault:
        """A turn no rollout server answered (``TurnFailed``; ``seq`` is released): that episode's env_error."""
        return Fault(f"rollout server: {error}")


def _has_parameter(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # not a callable, or one without a signature
        return False


def _extend_context(traj: Trajectory, ids: list[int]) -> None:
    traj.token_ids += ids
    traj.loss_mask += [0] * len(ids)
    traj.logprobs += [0.0] * len(ids)


def _gym_make(spec: EpisodeSpec) -> Any:
    import gymnasium as gym

    import toolgym  # noqa: F401  (registers the ids)

    try:
        return gym.make(spec.env_id, **dict(spec.kwargs))
    except gym.error.Error as exc:
        raise ConfigError(f"{exc} (see `toolgym list`)") from exc


def run_episodes(
    policy: Policy,
    env_ids: Sequence[str] | str,
    episodes: int = 1,
    *,
    first_seed: int = 0,
    concurrency: int = 64,
    sampling: SamplingParams | None = None,
    env_kwargs: dict[str, Any] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    **runner_kwargs: Any,
) -> list[Trajectory]:
    """Run ``episodes`` seeded episodes of each env id with ``policy``; returns their trajectories.

    >>> from toolgym.agents import ScriptedPolicy
    >>> trajs = run_episodes(ScriptedPolicy(), "toolgym/Calculator-v0", episodes=3)
    >>> [t.success for t in trajs], trajs[0].turns
    ([True, True, True], 2)
    """
    ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
    specs = episode_specs(ids, episodes, first_seed=first_seed, **(env_kwargs or {}))
    with EpisodeRunner(
        policy, concurrency=concurrency, sampling=sampling, on_episode=on_episode, **runner_kwargs
    ) as runner:
        return runner.run(specs)
