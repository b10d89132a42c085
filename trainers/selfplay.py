"""Self-play rollouts: the policy plays several seats of one multi-agent game with shared weights, and each
seat's turns are its own trajectory, credited with its own side's outcome.

``SelfPlayRollout`` has ``TreeRollout``'s interface (``run(tasks, seed) -> (forest, stats)``, ``close()``), so
the GRPO loop needs one hook line (the trainer picks it when the config has ``selfplay:`` options):

    roller = SelfPlayRollout(policy, rollout_cfg, cfg.env_kwargs, cfg.selfplay) if cfg.selfplay else TreeRollout(...)

For each task (env id, seed) it deals one game (``SeatEnv.new_game`` then ``reset(seed)``), picks the seats
from that deal (``learner_seats`` of the chosen ``side``, then ``frozen_seats`` among the rest) and plays
``budget`` copies of that deal (the scripted players' generators and the sampling differ). The seats are:
- learner: the live policy; every learner seat of every copy is one trajectory (one row);
- frozen: a snapshot answering with text but never trained: the initial weights (``snapshot: initial``), a
  toolgym checkpoint folder (``model.pt``) or a transformers folder. ``initial`` is the live weights when the
  roller is built unless the trainer names the run's starting model (``initial=cfg.model``): a resumed run
  builds its roller after loading the checkpoint, so without it the "initial" snapshot would silently be the
  checkpoint's weights (a different opponent after every resume). A folder snapshot is stable either way;
- scripted: the env's scripted players (``others``: random | basic | strong for Werewolf).
Groups: one tree per (task, learner seat): its ``budget`` leaves are that seat (same role, same deal) in the
``budget`` copies, so GRPO's baseline compares a seat with itself. A leaf's reward is the seat's return: +1
when its side wins (the game's reward) plus its parse and referee penalties (``SelfPlayTable.returns``).

Each seat's tokens are built the way ``TreeRollout`` builds an episode (the first prompt rendered once, then
for each turn the generated ids, the template's end of turn and the new messages with the next generation
prompt), so the rows are exactly what was sampled. Each table is an episode of the episode loop
(agents/episode_loop.py) asking for one seat's turn at a time. When every seat's policy has an engine (the
learner an ``EnginePolicy``: the frozen snapshot then gets an ``EnginePolicy`` of its own, the learner's
slots, capacity and engine dtype, bf16 on CUDA; the two KV caches share the run's ``engine_memory``, the
learner's built with ``learner_engine_memory`` and the frozen one's slots capped to what is left; a GRPO
run on CUDA gives each its bytes from the run's memory estimate, trainers/gpu_memory.py, which counts the frozen
weights and their packed copy), the loop
runs continuously over both engines: a turn enters its policy's engine when its table asks and leaves it the
step it ends, so no table waits for another and the frozen seats decode beside the learner's (in rounds every table waited for the learner's call, then
for the frozen seats' fp32 HF call, each as long as its longest turn). Otherwise it plays in rounds: one
``generate`` call per round for the learner seats of all tables and one for the frozen seats. A seat whose
next prompt would pass ``max_total_tokens`` ends the game for its table: every learner seat of it is
truncated (no side wins). A learner seat that is out of the game before its first turn (killed on night 1)
has no row in that copy (a group may have fewer than ``budget`` leaves; a seat with none in any copy has no
group). ``roller.timing`` holds the last run's split (engine steps and seconds per policy, or calls per
policy in rounds); ``TOOLGYM_SELFPLAY_TIMING=1`` prints it on stderr after every run.

A turn no rollout server answered (``TurnFailed``, a ``VLLMPolicy`` on servers) fails only its table: that
game ends there and each learner seat of it with a path there (it took a turn, or the lost turn was its
own: an empty last turn, as ``TreeRollout`` ends a lost turn's path) is an ``env_error`` leaf (no row, not
scored); the other tables go on. ``rollout/env_errors`` and ``rollout/server_errors`` count exactly those
leaves, one per learner path the fault ended (``TreeRollout``'s unit: a path); a learner seat never asked for
a turn in that table (out of the game, or its turn had not come) has no path there and is not counted, so a
frozen seat's lost turn before any learner turn counts 0. A seat
prompt that does not fit the engine (no room for one token) ends its table as ``token_budget``, as a prompt
past ``max_total_tokens`` does (the model's own length, not an infrastructure fault).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from toolgym.agents.episode_loop import (
    Answered,
    Episode,
    EpisodeLoop,
    Fault,
    Generate,
    TurnFailed,
    submit_turn,
)
from toolgym.agents.policy import Generation, SamplingParams
from toolgym.envs.multiagent.selfplay import SelfPlayTable
from toolgym.errors import ConfigError
from toolgym.trainers.gpu_memory import free_bytes as _free_bytes  # (tests set the free memory here)
from toolgym.trainers.rollout import RolloutConfig, RolloutStats, RolloutTask
from toolgym.trainers.tree import RolloutTree

Side = Literal["any", "village", "werewolves"]


@dataclass(frozen=True)
class SelfPlayConfig:
    """The trainer config's ``selfplay:`` options."""

    learner_seats: int = 2  # seats the live policy plays per game (each its own row)
    side: str = "any"  # any | a team name (Werewolf: village, werewolves): the learner seats' side
    frozen_seats: int = 0  # other seats played by the frozen snapshot
    snapshot: str = "initial"  # initial | a toolgym checkpoint folder (model.pt) | a transformers folder
    others: str = "strong"  # the scripted players of the remaining seats
    max_turns_per_seat: int = 40

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelfPlayConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown selfplay options {unknown}; known: {sorted(names)}")
        cfg = cls(**data)
        if cfg.learner_seats < 1 or cfg.frozen_seats < 0 or cfg.max_turns_per_seat < 1:
            raise ConfigError(
                "selfplay: learner_seats and max_turns_per_seat must be >= 1, frozen_seats >= 0"
            )
        if cfg.snapshot != "initial" and not Path(cfg.snapshot).is_dir():
            raise ConfigError(f"selfplay.snapshot: no folder {cfg.snapshot!r} (or give 'initial')")
        return cfg


def choose_seats(game: Any, cfg: SelfPlayConfig, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """(learner seats, frozen seats) of a dealt game: learners among the players of ``cfg.side`` (the game's
    ``infos[p]["team"]``), frozen among the rest; both in seat order."""
    players = list(game.possible_agents)
    team = {p: game.infos.get(p, {}).get("team", "any") for p in players}
    pool = [p for p in players if cfg.side in ("any", team[p])]
    if len(pool) < cfg.learner_seats:
        raise ConfigError(
            f"selfplay: {cfg.learner_seats} learner seats asked, the deal has {len(pool)} on {cfg.side}"
        )
    learners = sorted(rng.choice(pool, cfg.learner_seats, replace=False).tolist(), key=players.index)
    rest = [p for p in players if p not in learners]
    frozen = sorted(
        rng.choice(rest, min(cfg.frozen_seats, len(rest)), replace=False).tolist(), key=players.index
    )
    return learners, frozen


def learner_engine_memory(options: dict[str, Any] | None, engine: str, memory: float) -> float:
    """The share of free GPU memory the learner's engine takes of the run's ``engine_memory``: with frozen
    seats on our engine the two engines' KV caches split it in proportion to the seats each serves per copy
    (the frozen engine is sized from what the learner's left, ``_frozen_slots``); else all of it (HF or vLLM
    learners give the frozen snapshot an ``HFPolicy``, which reserves no KV cache)."""
    if not options or engine not in ("auto", "fast"):
        return memory
    cfg = SelfPlayConfig.from_dict(options)
    return memory * cfg.learner_seats / (cfg.learner_seats + cfg.frozen_seats)


def _frozen_slots(
    slots: int, capacity: int, per_token: int, learner_bytes: int, free: int | None, memory: float,
    budget: int | None = None,
) -> int:  # fmt: skip
    """Slots of the frozen engine: the learner's ``slots``, capped so that both engines' KV caches together
    take at most ``memory`` of the GPU memory free when the learner's was made (``free`` now plus the
    learner's ``learner_bytes``; what was allocated since only lowers it). A cache holds one scratch slot
    beyond its slots (kv_slots.py). ``free`` None (CPU): the learner's slots. A ``ConfigError`` when not one
    sequence of ``capacity`` tokens fits in what the learner's cache left. ``budget``: the frozen engine's
    KV-cache bytes in the run's memory estimate (``gpu_memory.memory_plan``, which counts the frozen weights
    and their packed copy), used instead of ``free`` and ``memory``."""
    if budget is not None:
        from toolgym.agents.engine.select import budget_slots

        fit = budget_slots(
            budget, capacity, per_token, "selfplay: the frozen seats' engine gets",
            "raise engine_memory, lower max_total_tokens, or play without frozen_seats",
        )  # fmt: skip
        return min(slots, fit)
    if free is None:
        return slots
    per_slot = capacity * per_token
    gb = 1e9
    left = int(memory * (free + learner_bytes)) - learner_bytes
    fit = left // per_slot - 1
    if fit < 1:
        raise ConfigError(
            f"selfplay: the frozen seats' engine does not fit in engine_memory={memory:.3g}: the learner's KV "
            f"cache takes {learner_bytes / gb:.2f} GB of {memory * (free + learner_bytes) / gb:.2f} GB, and one "
            f"sequence of {capacity} tokens (+ a scratch slot) needs {2 * per_slot / gb:.2f} GB; raise "
            "engine_memory, lower max_total_tokens, or play without frozen_seats"
        )
    return min(slots, fit)


def load_snapshot(
    policy: Any, snapshot: str, initial: str | None = None, memory: float = 1 / 3, budget: int | None = None
) -> Any:
    """A frozen copy of ``policy`` (its model, renderer and tokenizer) with the snapshot's weights;
    ``snapshot == "initial"`` with ``initial`` (a model name or folder) loads that model, not the live weights.
    On our engine its KV cache and the learner's take at most ``memory`` of free GPU memory, or its own takes
    ``budget`` bytes when given (``_frozen_slots``)."""
    import torch

    from toolgym.agents.hf import HFPolicy, load_model

    model = getattr(policy, "model", None)
    if model is None:
        raise ConfigError("frozen self-play seats need a policy with a model (HFPolicy or EnginePolicy)")
    device = next(model.parameters()).device
    folder = Path(snapshot)
    if snapshot == "initial" and initial:
        frozen, _ = load_model(initial, device=str(device), dtype="float32")
    elif snapshot == "initial":
        frozen = copy.deepcopy(model)
    elif (folder / "model.pt").is_file():
        frozen = copy.deepcopy(model)
        frozen.load_state_dict(torch.load(folder / "model.pt", map_location="cpu", weights_only=False))
    elif (folder / "config.json").is_file():
        frozen, _ = load_model(str(folder), device=str(device), dtype="float32")
    else:
        raise ConfigError(f"selfplay.snapshot {snapshot!r} holds neither model.pt nor config.json")
    frozen = frozen.to(device).eval().requires_grad_(False)
    return _engine_like(policy, frozen, memory, budget) or HFPolicy(frozen, policy.tokenizer, batch_size=256)


def _engine_like(policy: Any, frozen: Any, memory: float = 1 / 3, budget: int | None = None) -> Any:
    """An ``EnginePolicy`` over ``frozen`` shaped like the learner's (its slots, capacity and engine dtype:
    bf16 on CUDA; on CUDA fewer slots where the two KV caches would pass ``memory``, ``_frozen_slots``), or
    None when the learner is not one (HF, vLLM) or the engine cannot run the model. The
    frozen seats then decode as fast as the learner's (with ``HFPolicy`` in fp32 each of their turns cost
    the GPU run most of its rollout time) and run in the same continuous batch (``SelfPlayRollout.run``)."""
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.engine.weights import shape_of, unsupported

    if not isinstance(policy, EnginePolicy) or unsupported(frozen) is not None:
        return None
    eng = policy.engine
    slots = _frozen_slots(
        eng.cache.slots, eng.cache.capacity, shape_of(frozen).kv_bytes_per_token(eng.dtype),
        eng.cache.nbytes(), _free_bytes(eng.device), memory, budget,
    )  # fmt: skip
    out = EnginePolicy(
        frozen, policy.tokenizer, slots=slots, capacity=eng.cache.capacity, engine_dtype=eng.dtype,
        chat_template=policy.renderer.chat_template, tool_role=policy.renderer.tool_role,
        cuda_graphs=eng.cuda_graphs,
    )  # fmt: skip
    # the two engines' sequences meet in one episode loop, which keys its turns in flight by sequence id:
    # the frozen engine numbers its own far from the learner's
    out.engine._ids = itertools.count(1 << 48)
    # packed once: a weights version counts every optimizer step of the process, so the learner's update
    # re-packed the frozen copy (the same values) and dropped its held caches every step
    setattr(out, "refresh", _frozen_refresh)  # noqa: B010 (an instance's own method: mypy refuses assignment)
    return out


def _frozen_refresh(force: bool = False) -> None:
    """The frozen snapshot's ``refresh``: its weights never change, so its engine never re-packs."""


class _BatchTurns:
    """The episode loop's ``EngineTurns`` for one batch of prompts: planned as the policy's ``generate`` plans
    them (held caches continued, shared prefixes once), each turn clamped to its sequence's room; a turn that
    ends is indexed and kept held, as ``generate`` leaves it; a failed turn is a ``Fault``."""

    def __init__(self, policy: Any, sampling: SamplingParams) -> None:
        self.policy, self.engine, self.sampling = policy, policy.engine, sampling

    def plan(self, requests: list[Any], lefts: list[int | None]) -> list[Any]:
        from toolgym.agents.engine.engine_policy import plan_turns  # (torch: imported when an engine runs)

        sp, mode, seqs = plan_turns(self.policy, requests, self.sampling)
        out: list[Any] = []
        for seq in seqs:
            if submit_turn(self.engine, seq, mode, sp.max_new_tokens, sp.stop):
                out.append(seq)
            else:  # the prompt leaves no room for a token: the model's length, not a fault
                self.engine.release(seq)
                out.append(Answered(None))
        return out

    def result(self, request: Any, seq: Any) -> Generation:
        self.policy.index.add(seq)
        return self.policy.generation(seq)

    def failed(self, request: Any, seq: Any, error: str) -> Fault:
        return Fault(f"rollout server: {error}")


def generate_each(
    policy: Any, prompts: list[list[int]], sampling: SamplingParams
) -> list[Generation | Fault | None]:
    """One result per prompt: a ``Generation``; a ``Fault`` for a turn no rollout server answered; ``None``
    for a prompt with no room left in the engine. Policies without an engine: their ``generate`` as is."""
    if getattr(policy, "engine", None) is None or not hasattr(policy, "generation"):
        return list(policy.generate(prompts, sampling))
    out: list[Generation | Fault | None] = []

    def batch() -> Any:
        out.extend((yield Generate(list(prompts))))

    EpisodeLoop().run([batch], _BatchTurns(policy, sampling))
    return out


@dataclass(frozen=True)
class _Ask:
    """A seat's turn request in the episode loop: its prompt ids and whose turn it is (learner or frozen)."""

    learner: bool
    ids: list[int]


def _has_engine(policy: Any) -> bool:
    return getattr(policy, "engine", None) is not None and hasattr(policy, "generation")


def _sampling(cfg: RolloutConfig, left: int | None, seed: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=left or cfg.max_new_tokens, seed=seed
    )


class _SeatRounds:
    """The episode loop's ``RoundTurns`` for policies without an engine: each round's turns in one call per
    policy (the learner's, then the frozen seats'), each seeded by a draw from the run's generator."""

    def __init__(self, policies: dict[bool, Any], cfg: RolloutConfig, sampling: np.random.Generator) -> None:
        self.policies, self.cfg, self.sampling = policies, cfg, sampling
        self.calls = {True: 0, False: 0}
        self.seconds = {True: 0.0, False: 0.0}

    def generate(self, requests: list[_Ask], left: int | None) -> list[Any]:
        out: list[Any] = [None] * len(requests)
        for learner in (True, False):
            idx = [i for i, r in enumerate(requests) if r.learner == learner]
            if not idx:
                continue
            sp = _sampling(self.cfg, left, int(self.sampling.integers(2**31)))
            t0 = time.perf_counter()
            gens = generate_each(self.policies[learner], [requests[i].ids for i in idx], sp)
            self.seconds[learner] += time.perf_counter() - t0
            self.calls[learner] += 1
            for i, g in zip(idx, gens, strict=True):
                out[i] = g
        return out

    def timing(self, wall: float, stats: RolloutStats) -> dict[str, Any]:
        return {
            "mode": "rounds", "wall_s": round(wall, 2), "env_s": round(stats.env_s, 2),
            "learner_calls": self.calls[True], "learner_s": round(self.seconds[True], 2),
            "frozen_calls": self.calls[False], "frozen_s": round(self.seconds[False], 2),
        }  # fmt: skip


class _Engines:
    """One engine for the episode loop over the learner's and the frozen seats' engines: a step steps every
    busy one, so a table whose frozen seat decodes and one whose learner seat does go on together (in
    rounds every table waited for the learner's call, then for the frozen seats' call)."""

    def __init__(self, engines: list[Any]) -> None:
        self.engines = engines
        self.owner: dict[int, Any] = {}  # sequence id -> its engine (for ``cancel``)
        self.carry: list[Any] = []  # turns that ended in a step another engine's failure cut short
        self.steps = [0] * len(engines)
        self.seconds = [0.0] * len(engines)

    def busy(self) -> bool:
        return bool(self.carry) or any(e.busy() for e in self.engines)

    def step(self) -> list[Any]:
        done, self.carry = self.carry, []
        for k, eng in enumerate(self.engines):
            if not eng.busy():
                continue
            t0 = time.perf_counter()
            try:
                done += eng.step()
            except (
                TurnFailed
            ):  # (one turn no server answered): the turns that did end come with the next step
                self.carry = done
                raise
            finally:
                self.steps[k] += 1
                self.seconds[k] += time.perf_counter() - t0
        for seq in done:
            self.owner.pop(seq.id, None)
        return done

    def cancel(self, seq: Any) -> None:
        self.owner.pop(seq.id, self.engines[0]).cancel(seq)


class _SeatEngines:
    """The episode loop's ``EngineTurns`` when every seat's policy has an engine: a turn enters its policy's
    engine as soon as its table asks (held caches continued, shared prefixes once, as ``generate`` plans
    them), leaves it the step it ends; a prompt with no room is ``None`` (``token_budget``), a turn no
    rollout server answered a ``Fault``. Each engine is seeded once a run from the run's generator."""

    def __init__(self, policies: dict[bool, Any], cfg: RolloutConfig, sampling: np.random.Generator) -> None:
        from toolgym.agents.engine.engine_policy import mode_of

        self.policies = policies
        self.uniq = list({id(p): p for p in policies.values()}.values())
        self.engine = _Engines([p.engine for p in self.uniq])
        for p in self.uniq:
            p.engine.seed(int(sampling.integers(2**31)))
        self.sp = _sampling(cfg, None, None)
        self.modes = {k: mode_of(self.sp, getattr(p, "top_k", 0)) for k, p in policies.items()}
        self.start = [self._clocks(p) for p in self.uniq]  # (the engines' counters run over their life)

    @staticmethod
    def _clocks(policy: Any) -> tuple[float, float]:
        st = getattr(policy.engine, "stats", None)
        return (st.prefill_s, st.decode_s) if st is not None else (0.0, 0.0)

    def plan(self, requests: list[_Ask], lefts: list[int | None]) -> list[Any]:
        out: list[Any] = [None] * len(requests)
        for learner in (True, False):
            idx = [i for i, r in enumerate(requests) if r.learner == learner]
            if not idx:
                continue
            policy = self.policies[learner]
            eng = policy.engine
            seqs = policy._plan([requests[i].ids for i in idx])  # continues / forks held caches
            for i, seq in zip(idx, seqs, strict=True):
                if submit_turn(
                    eng, seq, self.modes[learner], lefts[i] or self.sp.max_new_tokens, self.sp.stop
                ):
                    self.engine.owner[seq.id] = eng
                    out[i] = seq
                else:  # the prompt leaves no room for a token: the model's length, not a fault
                    eng.release(seq)
                    out[i] = Answered(None)
        return out

    def result(self, request: _Ask, seq: Any) -> Generation:
        policy = self.policies[request.learner]
        policy.index.add(seq)
        return policy.generation(seq)

    def failed(self, request: _Ask, seq: Any, error: str) -> Fault:
        self.engine.owner.pop(seq.id, None)
        return Fault(f"rollout server: {error}")

    def timing(self, wall: float, stats: RolloutStats) -> dict[str, Any]:
        names = ["learner" if p is self.policies[True] else "frozen" for p in self.uniq]
        out: dict[str, Any] = {"mode": "continuous", "wall_s": round(wall, 2), "env_s": round(stats.env_s, 2)}
        for k, (name, p) in enumerate(zip(names, self.uniq, strict=True)):
            (pre0, dec0), (pre, dec) = self.start[k], self._clocks(p)
            out |= {
                f"{name}_steps": self.engine.steps[k], f"{name}_s": round(self.engine.seconds[k], 2),
                f"{name}_prefill_s": round(pre - pre0, 2), f"{name}_decode_s": round(dec - dec0, 2),
            }  # fmt: skip
        return out


@dataclass
class _Seat:
    """One text seat of one table: its ids so far and, for a learner, the pieces of its row."""

    table: int
    name: str
    learner: bool
    ids: list[int] = field(default_factory=list)
    seen: int = 0  # messages of the seat's transcript already in ids
    pieces: list[tuple[str, list[int], list[float], str]] = field(
        default_factory=list
    )  # kind, ids, logprobs, key
    last_gen: list[int] = field(default_factory=list)
    turns: int = 0
    truncated: bool = False
    lost_turn: bool = False  # its turn was the one no rollout server answered (its path ends there)


def _has_path(seat: _Seat) -> bool:
    """Whether the seat is a leaf of its group in this copy: it took a turn or its turn was lost to a fault (a
    seat out of the game, or whose table ended, before it was asked for a turn has no path and no row)."""
    return seat.turns > 0 or seat.lost_turn


def _version(snapshot: str, initial: str | None) -> str:
    """What the frozen seats play, for the logs: the snapshot's source and, for a file, its size and mtime
    (a checkpoint folder rewritten by a later save is another opponent)."""
    if snapshot == "initial":
        return f"initial:{initial}" if initial else "initial:live-weights-at-start"
    folder = Path(snapshot)
    weights = next((folder / n for n in ("model.pt", "model.safetensors") if (folder / n).is_file()), None)
    if weights is None:
        return snapshot
    st = weights.stat()
    return f"{weights}:{st.st_size}:{int(st.st_mtime)}"


def _key(messages: list[dict[str, Any]]) -> str:
    return hashlib.sha1(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()[:16]


class SelfPlayRollout:
    """Self-play rollouts with ``TreeRollout``'s interface (module docstring)."""

    def __init__(
        self,
        policy: Any,
        cfg: RolloutConfig,
        env_kwargs: dict[str, Any] | None,
        options: dict[str, Any] | SelfPlayConfig,
        initial: str | None = None,
        engine_memory: float = 1 / 3,
        kv_budget: int | None = None,
    ) -> None:
        self.policy = policy
        self.renderer = policy.renderer
        self.cfg = cfg
        self.env_kwargs = dict(env_kwargs or {})
        self.options = options if isinstance(options, SelfPlayConfig) else SelfPlayConfig.from_dict(options)
        self.frozen = (  # (engine_memory: the run's, the learner's engine built with learner_engine_memory;
            # kv_budget: the frozen engine's KV bytes in the run's memory estimate, gpu_memory.memory_plan)
            load_snapshot(policy, self.options.snapshot, initial, engine_memory, kv_budget)
            if self.options.frozen_seats
            else None
        )
        self.snapshot_version = _version(self.options.snapshot, initial) if self.frozen is not None else ""
        self._rules: dict[str, Any] = {}
        self.timing: dict[str, Any] = {}  # the last run's split (``_SeatRounds`` / ``_SeatEngines.timing``)

    def rules(self, env_id: str) -> Any:
        """The single-agent seat env of ``env_id`` (its prompts, parsing, scripted players)."""
        if env_id not in self._rules:
            import gymnasium as gym

            from toolgym.envs.base import tool_env
            from toolgym.envs.multiagent.seat import SeatEnv

            env = tool_env(gym.make(env_id, **{**self.env_kwargs, "opponents": self.options.others}))
            if not isinstance(env, SeatEnv):
                raise ConfigError(f"self-play needs a multi-agent seat env; {env_id} is not one")
            self._rules[env_id] = env
        return self._rules[env_id]

    def tables(self, task: RolloutTask, copies: int) -> tuple[list[SelfPlayTable], list[str], list[str]]:
        rules = self.rules(task.env_id)
        probe = rules.new_game()
        probe.reset(seed=task.seed)
        learners, frozen = choose_seats(probe, self.options, np.random.default_rng([task.seed, 17]))

        def scripted(game: Any, agent: str, rng: np.random.Generator) -> Any:
            return rules.opponent_move(game, agent, rng)

        out = []
        for c in range(copies):
            game = rules.new_game()
            game.reset(seed=task.seed)
            out.append(
                SelfPlayTable(rules, game, learners + frozen, scripted, seed=task.seed * 1009 + c,
                              max_turns_per_seat=self.options.max_turns_per_seat)
            )  # fmt: skip
        return out, learners, frozen

    def run(self, tasks: list[RolloutTask], seed: int) -> tuple[list[RolloutTree], RolloutStats]:
        stats = RolloutStats()
        t0 = time.perf_counter()
        policies = {True: self.policy, False: self.frozen if self.frozen is not None else self.policy}
        for policy in {id(p): p for p in policies.values()}.values():
            if hasattr(policy, "refresh"):  # the learner engine's held caches predate the last optimizer step
                policy.refresh()
        sampling = np.random.default_rng(seed)
        tables: list[SelfPlayTable] = []
        groups: list[
            tuple[RolloutTask, list[str], list[int]]
        ] = []  # (task, learner seats, its table indices)
        for task in tasks:
            made, learners, _ = self.tables(task, self.cfg.budget)
            groups.append((task, learners, list(range(len(tables), len(tables) + len(made)))))
            tables += made
        seats = {
            (ti, s): _Seat(ti, s, s in learners)
            for task, learners, idx in groups
            for ti in idx
            for s in tables[ti].text_seats
        }
        lost: dict[int, str] = {}  # tables ended by a turn no rollout server answered -> the error
        starts = [
            functools.partial(self._play, ti, tables[ti], seats, lost, stats) for ti in range(len(tables))
        ]
        turns: _SeatEngines | _SeatRounds
        if all(_has_engine(p) for p in policies.values()):  # every table at its own pace
            turns = _SeatEngines(policies, self.cfg, sampling)
        else:  # rounds: one generate call per policy (learner, frozen) for every table waiting on it
            turns = _SeatRounds(policies, self.cfg, sampling)
        EpisodeLoop(stats=stats).run(starts, turns)
        self.timing = turns.timing(time.perf_counter() - t0, stats)
        if os.environ.get(
            "TOOLGYM_SELFPLAY_TIMING"
        ):  # (the Werewolf pipeline's GPU runs: where the time goes)
            print(f"toolgym selfplay: {json.dumps(self.timing)}", file=sys.stderr, flush=True)
        for ti in lost:  # the learner paths the fault ended: each an env_error leaf (its row is dropped)
            n = sum(1 for s in tables[ti].text_seats if seats[(ti, s)].learner and _has_path(seats[(ti, s)]))
            stats.env_errors += n
            stats.server_errors += n
        trees = [
            self._tree(task, s, idx, tables, seats, lost) for task, learners, idx in groups for s in learners
        ]
        forest = [t for t in trees if t.leaves()]
        stats.wall_s = time.perf_counter() - t0
        return forest, stats

    def _play(
        self, ti: int, table: SelfPlayTable, seats: dict[tuple[int, str], _Seat], lost: dict[int, str],
        stats: RolloutStats,
    ) -> Episode:  # fmt: skip
        """One table's game as an episode of the episode loop: the next text seat's prompt, its turn from the
        seat's policy (``_Ask``), the move; until the game ends (what it records depends only on what was
        generated, never on which tables shared a batch)."""
        while True:
            t_env = time.perf_counter()
            name = table.next_seat()
            seat = seats[(ti, name)] if name is not None else None
            if seat is not None and not self._prompt(table, seat):
                self._abandon(table, ti, seats)
                seat = None
            stats.env_s += time.perf_counter() - t_env
            if seat is None:
                return
            (g,) = yield Generate([_Ask(seat.learner, list(seat.ids))])
            if g is None or isinstance(g, Fault):  # this table's game ends here
                if g is None:  # the seat's prompt fills the engine: the model's length
                    self._abandon(table, ti, seats)
                else:
                    lost[ti] = g.error
                    if seat.learner:  # its path ends at an empty turn, as a lost turn does in TreeRollout
                        seat.lost_turn = True
                        seat.pieces.append(("model", [], [], ""))
                return
            t_env = time.perf_counter()
            seat.ids += list(g.token_ids)
            seat.last_gen = list(g.token_ids)
            seat.turns += 1
            if seat.learner:
                seat.pieces.append(("model", list(g.token_ids), list(g.logprobs), ""))
                stats.generated_tokens += len(g.token_ids)
            table.act(seat.name, self.renderer.decode(self.renderer.strip_stop(g.token_ids)))
            seat.seen += 1  # its own answer; what the table added after it is news for the next turn
            stats.env_s += time.perf_counter() - t_env

    def _prompt(self, table: SelfPlayTable, seat: _Seat) -> bool:
        """Extends the seat's ids with what it has to read before its turn; False when over the budget."""
        messages = table.messages(seat.name)
        if not seat.ids:
            ids = self.renderer.prompt_ids(messages, table.tools)
            kind = "prompt"
        else:
            new = [dict(m) for m in messages[seat.seen :]]
            ids = self.renderer.close_turn(seat.last_gen) + self.renderer.env_suffix(new)
            kind = "user"
        seat.seen = len(messages)
        if len(seat.ids) + len(ids) + 1 > self.cfg.max_total_tokens:
            return False
        seat.ids += ids
        if seat.learner:
            seat.pieces.append((kind, ids, [], _key(messages)))
        return True

    @staticmethod
    def _abandon(table: SelfPlayTable, ti: int, seats: dict[tuple[int, str], _Seat]) -> None:
        for s in table.text_seats:
            seats[(ti, s)].truncated = True

    def _tree(
        self,
        task: RolloutTask,
        name: str,
        idx: list[int],
        tables: list[SelfPlayTable],
        seats: dict[tuple[int, str], _Seat],
        lost: dict[int, str] | None = None,
    ) -> RolloutTree:
        """One group: the seat ``name`` in each copy of the deal, as the leaves of one tree."""
        idx = [ti for ti in idx if _has_path(seats[(ti, name)])]
        firsts = [seats[(ti, name)].pieces[0][1] for ti in idx]
        common = firsts[0] if firsts else []
        for f in firsts[1:]:
            n = next(
                (i for i, (a, b) in enumerate(zip(common, f, strict=False)) if a != b),
                min(len(common), len(f)),
            )
            common = common[:n]
        tree = RolloutTree(f"{task.env_id}#{task.seed}/{name}", common)
        tree.meta.update(env_id=task.env_id, seed=task.seed, tools=[], answer=None, seat=name)
        if self.frozen is not None:
            tree.meta["snapshot"] = self.snapshot_version  # which opponent the frozen seats were
        if idx:
            tree.meta["tools"] = tables[idx[0]].tools
        for ti in idx:
            seat, table = seats[(ti, name)], tables[ti]
            node, turn, last_key = tree.root, -1, ""
            for j, (kind, ids, logprobs, key) in enumerate(seat.pieces):
                if j == 0:
                    last_key, ids = key, ids[len(common) :]
                    if not ids:
                        continue
                if kind == "model":
                    turn += 1
                    node = tree.add(node, "model", ids, turn=turn, logprobs=logprobs, state_key=last_key)
                else:
                    last_key = key
                    node = tree.add(node, "user", ids, turn=max(turn, 0))
            record = table.records[name]
            if lost and ti in lost:  # an infrastructure failure: no row, not scored
                tree.nodes[node].info["episode"] = {
                    "success": False, "truncation": "env_error", "episode_reward": 0.0, "truncated": True,
                    "turns": seat.turns, "tool_calls": seat.turns - record.invalid, "void": False,
                    "tokens": len(seat.ids), "invalid_turns": record.invalid,
                }  # fmt: skip
                tree.nodes[node].info["infra_error"] = lost[ti]
                tree.set_reward(node, 0.0)
                continue
            won = bool(table.game.done and table.rules.seat_won(table.game, name))
            ret = 0.0 if seat.truncated else table.returns()[name]
            truncated = seat.truncated or not table.game.done
            tree.nodes[node].info["episode"] = {
                "success": won and not seat.truncated,
                "truncation": ("token_budget" if seat.truncated else "max_turns") if truncated else None,
                "episode_reward": ret,
                "truncated": truncated,
                "turns": seat.turns,
                "tool_calls": seat.turns - record.invalid,
                "void": False,
                "tokens": len(seat.ids),
                "invalid_turns": record.invalid,
            }
            tree.set_reward(node, ret)
        return tree

    def close(self) -> None:
        for env in self._rules.values():
            env.close()
        self._rules.clear()
