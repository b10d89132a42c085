"""The episode runner: many episodes over many envs, interleaved, with one batched policy call a round.

Each round, every live episode that waits for the model is put in one batch: a token-level policy
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
(an infrastructure failure, not the model's), the env is closed and replaced, and the run goes on.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.policy import AssistantTurn, Policy, SamplingParams, TokenPolicy
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


class EpisodeRunner:
    """Runs ``EpisodeSpec``s with up to ``concurrency`` episodes live at once.

    ``make_env(spec)`` builds an env (default: ``gym.make(spec.env_id, **kwargs)``); envs are reused across
    episodes of the same spec kwargs. ``on_episode(trajectory)`` is called as each episode ends,
    ``on_round(n, live)`` before each batched policy call.
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
        self._pool: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Any]] = {}
        self._pool_lock = threading.Lock()
        self.continuous = getattr(policy, "engine", None) is not None and hasattr(policy, "generation")

    # ----- public ------------------------------------------------------------------------------------------
    def run(self, specs: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Run every spec; trajectories come back in the order of ``specs``."""
        if self.continuous:
            return self._run_continuous(specs)
        t0 = time.perf_counter()
        results: list[Trajectory | None] = [None] * len(specs)
        queue = list(enumerate(specs))[::-1]
        live: dict[int, _Live] = {}
        rounds = 0
        executor = ThreadPoolExecutor(self.env_workers) if self.env_workers > 0 else None
        try:
            while queue or live:
                while queue and len(live) < self.concurrency:
                    idx, spec = queue.pop()
                    ep = self._start(spec)
                    if ep.traj.error is not None:
                        results[idx] = self._finish(ep)
                    else:
                        live[idx] = ep
                if not live:
                    continue
                order = list(live)
                rounds += 1
                if self.on_round is not None:
                    self.on_round(rounds, len(order))
                turns = self._act([live[i] for i in order])
                done = self._step_all([live[i] for i in order], turns, executor)
                for i, finished in zip(order, done, strict=True):
                    if finished:
                        results[i] = self._finish(live.pop(i))
        finally:
            if executor is not None:
                executor.shutdown(wait=True)
            for ep in live.values():  # the run was interrupted: nothing may leak
                if ep.env is not None:
                    _close_quietly(ep.env)
            self.stats["total_s"] += time.perf_counter() - t0
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Close every pooled env."""
        for envs in self._pool.values():
            for env in envs:
                _close_quietly(env)
        self._pool.clear()

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- episode life ------------------------------------------------------------------------------------
    def _start(self, spec: EpisodeSpec) -> _Live:
        traj = Trajectory(env_id=spec.env_id, seed=spec.seed, agent=getattr(self.policy, "name", ""))
        ep = _Live(spec, None, traj, time.perf_counter())
        try:
            with self._pool_lock:  # reset may run on the env thread pool
                pool = self._pool.get((spec.env_id, spec.kwargs))
                env = pool.pop() if pool else None
            ep.env = env if env is not None else self.make_env(spec)
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

    def _run_continuous(self, specs: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Continuous batching with the engine (see the module docstring)."""
        from toolgym.agents.engine.policy import mode_of

        policy: Any = self.policy
        eng = policy.engine
        policy.refresh()
        sp = self.sampling or policy.sampling
        mode = mode_of(sp, policy.top_k)
        if sp.seed is not None:
            eng.seed(sp.seed)
        t0 = time.perf_counter()
        results: list[Trajectory | None] = [None] * len(specs)
        queue = list(enumerate(specs))[::-1]
        live: dict[int, _Live | None] = {}  # None while its reset runs
        seqs: dict[int, Any] = {}
        pending: dict[Future[Any], tuple[str, int]] = {}
        steps = 0
        executor = ThreadPoolExecutor(self.env_workers if self.env_workers > 0 else 8)

        def submit(idx: int) -> bool:
            """Queue the next turn of episode ``idx``; False when it cannot fit the engine any more."""
            seq, ep = seqs[idx], live[idx]
            room = eng.cache.capacity - 2 - len(seq.ids)
            if room < 1:
                assert ep is not None
                ep.traj.truncated, ep.traj.truncation = True, "token_budget"
                ep.traj.reward = sum(ep.traj.rewards)
                return False
            eng.submit(seq, mode, min(sp.max_new_tokens, room), sp.stop)
            return True

        def end(idx: int) -> None:
            ep = live.pop(idx)
            assert ep is not None
            results[idx] = self._finish(ep)
            seq = seqs.pop(idx, None)
            if seq is not None:
                eng.release(seq)

        try:
            while queue or live:
                while queue and len(live) < self.concurrency:
                    idx, spec = queue.pop()
                    live[idx] = None
                    pending[executor.submit(self._start, spec)] = ("start", idx)
                if eng.busy():
                    steps += 1
                    if self.on_round is not None:
                        self.on_round(steps, len(live))
                    t1 = time.perf_counter()
                    for seq in eng.step():
                        idx = seq.tag
                        ep = live[idx]
                        assert ep is not None
                        gen = policy.generation(seq)
                        turn = self._to_turn(gen, ep, len(seq.ids) - len(seq.out))
                        self.stats["model_turns"] += 1
                        pending[executor.submit(self._step, ep, turn)] = ("step", idx)
                    self.stats["policy_s"] += time.perf_counter() - t1
                    self.stats["policy_calls"] += 1
                    ready = [f for f in pending if f.done()]
                elif pending:
                    t1 = time.perf_counter()
                    done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                    self.stats["idle_s"] = self.stats.get("idle_s", 0.0) + time.perf_counter() - t1
                    ready = list(done)
                else:
                    ready = []
                for fut in ready:
                    kind, idx = pending.pop(fut)
                    if kind == "start":
                        ep = fut.result()  # a ConfigError from make_env ends the run, as in rounds
                        live[idx] = ep
                        if ep.traj.error is not None:
                            end(idx)
                            continue
                        seqs[idx] = eng.new(ep.traj.token_ids, tag=idx)
                        if not submit(idx):
                            end(idx)
                        continue
                    ep = live[idx]
                    assert ep is not None
                    if fut.result():
                        end(idx)
                        continue
                    _extend_context(ep.traj, ep.pending)
                    eng.extend(seqs[idx], ep.pending)
                    ep.pending = []
                    if not submit(idx):
                        end(idx)
        finally:
            executor.shutdown(wait=True)
            for ep in live.values():  # the run was interrupted: nothing may leak
                if ep is not None and ep.env is not None:
                    _close_quietly(ep.env)
            for seq in seqs.values():
                if seq.state in ("idle", "new"):
                    eng.release(seq)
            self.stats["total_s"] += time.perf_counter() - t0
        return [r for r in results if r is not None]

    def _act(self, eps: list[_Live]) -> list[AssistantTurn]:
        t0 = time.perf_counter()
        if self.token_level:
            policy: Any = self.policy
            for ep in eps:
                if ep.pending:
                    _extend_context(ep.traj, ep.pending)
                    ep.pending = []
            gens = policy.generate([ep.traj.token_ids for ep in eps], self.sampling)
            turns = [self._to_turn(g, ep, len(ep.traj.token_ids)) for g, ep in zip(gens, eps, strict=True)]
        else:
            turns = self.policy.act(
                [ep.traj.messages for ep in eps],
                [ep.tools for ep in eps],
                sampling=self.sampling,
                envs=[ep.env for ep in eps],
            )
        if len(turns) != len(eps):
            raise ConfigError(f"{self.policy!r} returned {len(turns)} turns for {len(eps)} conversations")
        self.stats["policy_s"] += time.perf_counter() - t0
        self.stats["policy_calls"] += 1
        self.stats["model_turns"] += len(eps)
        return turns

    def _step_all(
        self, eps: list[_Live], turns: list[AssistantTurn], executor: ThreadPoolExecutor | None
    ) -> list[bool]:
        t0 = time.perf_counter()
        if executor is None:
            done = [self._step(ep, turn) for ep, turn in zip(eps, turns, strict=True)]
        else:
            done = list(executor.map(self._step, eps, turns))
        self.stats["env_s"] += time.perf_counter() - t0
        return done

    def _step(self, ep: _Live, turn: AssistantTurn) -> bool:
        """Record the turn, step the env, record what came back; True when the episode is over."""
        t_env = time.perf_counter()
        try:
            return self._step_inner(ep, turn)
        finally:
            if self.continuous:  # (in rounds, _step_all times the whole round)
                self.stats["env_s"] += time.perf_counter() - t_env

    def _step_inner(self, ep: _Live, turn: AssistantTurn) -> bool:
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
            _close_quietly(ep.env)
            ep.env = None

    def _finish(self, ep: _Live) -> Trajectory:
        ep.traj.duration_s = time.perf_counter() - ep.started
        if ep.traj.entropies:  # aligned with token_ids, 0.0 off the sampled tokens
            ep.traj.entropies += [0.0] * (len(ep.traj.token_ids) - len(ep.traj.entropies))
        if ep.env is not None:
            with self._pool_lock:
                self._pool.setdefault((ep.spec.env_id, ep.spec.kwargs), []).append(ep.env)
        if self.on_episode is not None:
            self.on_episode(ep.traj)
        return ep.traj


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


def _close_quietly(env: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken env must not end the run
        env.close()


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
