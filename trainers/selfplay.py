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
prompt), so the rows are exactly what was sampled. The text seats of all tables are generated together, one
``policy.generate`` call per round (and one for the frozen seats). A seat whose next prompt would pass
``max_total_tokens`` ends the game for its table: every learner seat of it is truncated (no side wins). A
learner seat that is out of the game before its first turn (killed on night 1) has no row in that copy (a
group may have fewer than ``budget`` leaves; a seat with none in any copy has no group).

A policy with an engine (``EnginePolicy``, ``VLLMPolicy``) runs each batch through the episode loop
(``generate_each``), so that a turn no rollout server answered (``TurnFailed``) fails only its table: that
game ends there and every learner seat of it is an ``env_error`` (no row, not scored; counted in
``rollout/env_errors`` and ``rollout/server_errors``, one a learner seat); the other tables go on. A seat
prompt that does not fit the engine (no room for one token) ends its table as ``token_budget``, as a prompt
past ``max_total_tokens`` does (the model's own length, not an infrastructure fault).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from toolgym.agents.episode_loop import Answered, EpisodeLoop, Fault, Generate, submit_turn
from toolgym.agents.policy import Generation, SamplingParams
from toolgym.envs.multiagent.selfplay import SelfPlayTable
from toolgym.errors import ConfigError
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


def load_snapshot(policy: Any, snapshot: str, initial: str | None = None) -> Any:
    """A frozen copy of ``policy`` (its model, renderer and tokenizer) with the snapshot's weights;
    ``snapshot == "initial"`` with ``initial`` (a model name or folder) loads that model, not the live weights."""
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
    return HFPolicy(frozen, policy.tokenizer, batch_size=256)


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
    ) -> None:
        self.policy = policy
        self.renderer = policy.renderer
        self.cfg = cfg
        self.env_kwargs = dict(env_kwargs or {})
        self.options = options if isinstance(options, SelfPlayConfig) else SelfPlayConfig.from_dict(options)
        self.frozen = (
            load_snapshot(policy, self.options.snapshot, initial) if self.options.frozen_seats else None
        )
        self.snapshot_version = _version(self.options.snapshot, initial) if self.frozen is not None else ""
        self._rules: dict[str, Any] = {}

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
        if hasattr(self.policy, "refresh"):  # the engine's held caches predate the last optimizer step
            self.policy.refresh()
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
        live = set(range(len(tables)))
        lost: dict[int, str] = {}  # tables ended by a turn no rollout server answered -> the error
        while live:
            pending: dict[bool, list[_Seat]] = {True: [], False: []}
            t_env = time.perf_counter()
            for ti in sorted(live):
                name = tables[ti].next_seat()
                if name is None:
                    live.discard(ti)
                    continue
                seat = seats[(ti, name)]
                if not self._prompt(tables[ti], seat):
                    self._abandon(tables[ti], ti, seats)
                    live.discard(ti)
                    continue
                pending[seat.learner].append(seat)
            stats.env_s += time.perf_counter() - t_env
            for learner, batch in pending.items():
                if not batch:
                    continue
                policy = self.policy if learner or self.frozen is None else self.frozen
                t_gen = time.perf_counter()
                sp = SamplingParams(
                    temperature=self.cfg.temperature, top_p=self.cfg.top_p, max_new_tokens=self.cfg.max_new_tokens,
                    seed=int(sampling.integers(2**31)),
                )  # fmt: skip
                gens = generate_each(policy, [s.ids for s in batch], sp)
                stats.generate_s += time.perf_counter() - t_gen
                stats.generate_calls += 1
                t_env = time.perf_counter()
                for seat, g in zip(batch, gens, strict=True):
                    if g is None or isinstance(g, Fault):  # this table's game ends here
                        live.discard(seat.table)
                        if g is None:  # the seat's prompt fills the engine: the model's length
                            self._abandon(tables[seat.table], seat.table, seats)
                        else:
                            lost[seat.table] = g.error
                        continue
                    seat.ids += list(g.token_ids)
                    seat.last_gen = list(g.token_ids)
                    seat.turns += 1
                    if seat.learner:
                        seat.pieces.append(("model", list(g.token_ids), list(g.logprobs), ""))
                        stats.generated_tokens += len(g.token_ids)
                    text = self.renderer.decode(self.renderer.strip_stop(g.token_ids))
                    tables[seat.table].act(seat.name, text)
                    seat.seen += 1  # its own answer; what the table added after it is news for the next turn
                stats.env_s += time.perf_counter() - t_env
        for ti in lost:  # each learner seat of a lost table is a path ended by the fault (its row is dropped)
            n = sum(1 for s in tables[ti].text_seats if seats[(ti, s)].learner)
            stats.env_errors += n
            stats.server_errors += n
        trees = [
            self._tree(task, s, idx, tables, seats, lost) for task, learners, idx in groups for s in learners
        ]
        forest = [t for t in trees if t.leaves()]
        stats.wall_s = time.perf_counter() - t0
        return forest, stats

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
        idx = [ti for ti in idx if seats[(ti, name)].turns > 0]  # a seat out before its first turn: no row
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
