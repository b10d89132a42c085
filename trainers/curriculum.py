"""Curricula: a schedule over an env's difficulty knobs that follows the learner (``curriculum:`` in a GRPO
config).

Each env id it drives keeps its own level and its own window of recent episodes at that level (per-task
pools). After at least ``min_episodes`` episodes at a level, a success rate over the window of at least
``promote_at`` moves the env one level up, at most ``demote_at`` one level down; the window then starts
empty. The levels are

- ``levels``: a list of gym.make keyword dicts, easiest first (``[{digits: 2}, {digits: 3, num_ops: 2}]``);
- ``knobs``: values per knob, advanced together (level i takes each knob's i-th value, or its last), as
  reasoning-gym's global levels do: ``{digits: [2, 3, 4, 5], num_ops: [1, 2, 3]}`` is 4 levels;
- ``reasoning_gym: true``: reasoning-gym's own curriculum for the env's task (its ``create_curriculum``
  global levels, each a ``config`` for toolgym/ReasoningGym-*).

How it reaches the envs: each (env id, level) is registered once with Gymnasium under a derived id
(``curriculum/toolgym.Calculator-v0.L2.<hash>``) whose spec holds the level's keywords, and a step's tasks are
rewritten to those ids (``review`` of them drawn from a lower level, against forgetting). After the rollout
the trees get their own env id back (``meta["curriculum_level"]`` says the level), so the add-ons'
success replay and task selection see the tasks they drew; a level change clears task selection's
measurements of that env (they were made at another difficulty). A run's levels are kept in
``output_dir/curriculum.json``; ``resume`` reads them back.

Departures: levels move by the rollouts' own success (no separate probe); with replay on, a replayed
success is not counted; one process only (not under torchrun yet: each rank would move alone).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections import deque
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolgym.errors import ConfigError
from toolgym.optional import require
from toolgym.trainers.rollout import RolloutTask
from toolgym.trainers.tree import RolloutTree, env_error

NAMESPACE = "curriculum"


class CurriculumConfig(BaseModel):
    """The ``curriculum:`` mapping of a GRPO config (one of ``levels``, ``knobs``, ``reasoning_gym``)."""

    model_config = ConfigDict(extra="forbid")

    levels: list[dict[str, Any]] = Field(default_factory=list, description="gym.make kwargs, easiest first")
    knobs: dict[str, list[Any]] = Field(
        default_factory=dict, description="values per knob, advanced together"
    )
    reasoning_gym: bool = Field(default=False, description="reasoning-gym's global levels for the env's task")
    promote_at: float = Field(default=0.8, description="success rate (window) that moves a level up (p)")
    demote_at: float = Field(default=0.2, description="success rate that moves a level down (q; < 0: never)")
    window: int = Field(default=64, ge=1, description="recent episodes at the level that make the rate")
    min_episodes: int = Field(default=32, ge=1, description="episodes at a level before it may move")
    start_level: int = Field(default=0, ge=0)
    review: float = Field(default=0.0, ge=0.0, lt=1.0, description="fraction of tasks from a lower level")
    env_ids: list[str] | None = Field(default=None, description="env ids it drives (default: every one)")

    @model_validator(mode="after")
    def _check(self) -> CurriculumConfig:
        kinds = [bool(self.levels), bool(self.knobs), self.reasoning_gym]
        if sum(kinds) != 1:
            raise ValueError("give exactly one of levels, knobs or reasoning_gym: true")
        if any(not isinstance(v, list) or not v for v in self.knobs.values()):
            raise ValueError("each knob needs a non-empty list of values, easiest first")
        if not self.demote_at < self.promote_at <= 1.0:
            raise ValueError(f"need demote_at < promote_at <= 1, got {self.demote_at}, {self.promote_at}")
        return self

    def level_kwargs(self, env_id: str, env_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        """The gym.make keywords of every level of ``env_id``, easiest first."""
        if self.levels:
            out = [dict(lv) for lv in self.levels]
        elif self.knobs:
            n = max(len(v) for v in self.knobs.values())
            out = [{k: v[min(i, len(v) - 1)] for k, v in self.knobs.items()} for i in range(n)]
        else:
            out = [{"config": c} for c in reasoning_gym_levels(env_id, env_kwargs)]
        clash = sorted({k for lv in out for k in lv} & set(env_kwargs))
        if clash:
            raise ConfigError(
                f"curriculum: {clash} are set by the curriculum's levels; remove them from env_kwargs "
                "(evaluations take theirs from eval_env_kwargs)"
            )
        if self.start_level >= len(out):
            raise ConfigError(f"curriculum: start_level {self.start_level} but only {len(out)} levels")
        return out

    def check_run(self, env_ids: list[str], env_kwargs: dict[str, Any]) -> None:
        """The checks of `Curriculum` that need no env, made when the run's config is built (a clash with
        ``env_kwargs`` or an unknown env id fails at config load, not when the run starts); reasoning-gym's
        levels come from the env's task, so they are checked when the run starts."""
        unknown = sorted(set(self.env_ids or env_ids) - set(env_ids))
        if unknown:
            raise ConfigError(f"curriculum env_ids {unknown} are not among the run's env_ids {env_ids}")
        if not self.reasoning_gym:
            for env_id in self.env_ids or env_ids:
                self.level_kwargs(env_id, env_kwargs)


def parse(data: dict[str, Any]) -> CurriculumConfig:
    try:
        return CurriculumConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid curriculum: {exc}") from exc


def reasoning_gym_levels(env_id: str, env_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """reasoning-gym's global levels of the env's task, each as a dataset config (seed and size left to the
    env): level i sets every attribute to its i-th level (or its last)."""
    import gymnasium as gym

    from toolgym.envs.base import ToolEnv

    cls = gym.spec(env_id).entry_point
    if isinstance(cls, str):
        module, name = cls.split(":")
        import importlib

        cls = getattr(importlib.import_module(module), name)
    task = env_kwargs.get("task") or getattr(cls, "fixed_task", None)
    if (
        not (isinstance(cls, type) and issubclass(cls, ToolEnv))
        or getattr(cls, "family", "") != "reasoning_gym"
    ):
        raise ConfigError(f"curriculum reasoning_gym: {env_id} is not a toolgym/ReasoningGym-* env")
    if not isinstance(task, str):
        raise ConfigError("curriculum reasoning_gym: the env needs one task (task=NAME or a per-task id)")
    create_curriculum = require("reasoning_gym.factory", why="curriculum reasoning_gym").create_curriculum
    try:
        cur = create_curriculum(task)
    except Exception as exc:  # reasoning-gym raises its own errors for a dataset without a curriculum
        raise ConfigError(f"reasoning-gym has no curriculum for {task!r}: {exc}") from exc
    n = max((len(a.levels) for a in cur.attributes.values()), default=1)
    out = []
    for i in range(n):
        cur.set_global_level(i)
        config = dataclasses.asdict(cur.generate_configuration())
        out.append({k: v for k, v in config.items() if k not in ("seed", "size")})
    return out


def level_id(env_id: str, level: int, kwargs: dict[str, Any]) -> str:
    """The Gymnasium id of one level of an env (a hash of its keywords keeps two runs' levels apart).

    >>> level_id("toolgym/Calculator-v0", 2, {"digits": 4})
    'curriculum/toolgym.Calculator-v0.L2.e73ffd'
    """
    digest = hashlib.sha256(json.dumps(kwargs, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"{NAMESPACE}/{env_id.replace('/', '.')}.L{level}.{digest}"


@dataclasses.dataclass
class Track:
    """One env's place in its curriculum."""

    env_id: str
    ids: list[str]  # the level ids, easiest first
    level: int
    recent: deque[bool]
    seen: int = 0  # episodes at this level since it was reached
    moves: int = 0

    def rate(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else 0.0


class Curriculum:
    """What the GRPO loop calls: ``assign`` the step's tasks, ``observe`` its trees, ``end_step``."""

    def __init__(self, cfg: CurriculumConfig, env_ids: list[str], env_kwargs: dict[str, Any], seed: int = 0):
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids the levels derive from)

        self.cfg = cfg
        self.rng = random.Random(seed)
        driven = cfg.env_ids or env_ids
        unknown = sorted(set(driven) - set(env_ids))
        if unknown:
            raise ConfigError(f"curriculum env_ids {unknown} are not among the run's env_ids {env_ids}")
        self.tracks: dict[str, Track] = {}
        self.by_id: dict[str, tuple[str, int]] = {}  # level id -> (env id, level)
        for env_id in driven:
            base = gym.spec(env_id)
            ids = []
            for i, kw in enumerate(cfg.level_kwargs(env_id, env_kwargs)):
                lid = level_id(env_id, i, kw)
                if lid not in gym.registry:
                    gym.register(
                        id=lid, entry_point=base.entry_point, kwargs={**base.kwargs, **kw},
                        max_episode_steps=base.max_episode_steps, disable_env_checker=True,
                    )  # fmt: skip
                ids.append(lid)
                self.by_id[lid] = (env_id, i)
            self.tracks[env_id] = Track(env_id, ids, cfg.start_level, deque(maxlen=cfg.window))
        self.on_move: list[Any] = []  # callables (env_id) run when an env changes level

    # ----- the loop's hooks --------------------------------------------------------------------------------
    def assign(self, tasks: list[RolloutTask]) -> list[RolloutTask]:
        """The tasks with each driven env's id replaced by its current level's (or, ``review`` of the time,
        a lower level's)."""
        out = []
        for t in tasks:
            track = self.tracks.get(t.env_id)
            if track is None:
                out.append(t)
                continue
            level = track.level
            if level > 0 and self.cfg.review and self.rng.random() < self.cfg.review:
                level = self.rng.randrange(level)
            out.append(RolloutTask(track.ids[level], t.seed))
        return out

    def observe(self, forest: list[RolloutTree]) -> None:
        """Counts the fresh episodes played at each env's current level, moves levels, and gives every tree its
        own env id back (``meta["curriculum_level"]`` keeps the level)."""
        for tree in forest:
            lid = str(tree.meta.get("env_id", ""))
            if lid not in self.by_id:
                continue
            env_id, level = self.by_id[lid]
            tree.meta.update(env_id=env_id, curriculum_level=level)
            track = self.tracks[env_id]
            if level != track.level:
                continue  # a review task (or one drawn before a move): not this level's evidence
            for leaf in tree.leaves():
                info = tree.nodes[leaf].info
                if env_error(tree, leaf) or info.get("replayed"):
                    continue
                track.recent.append(bool(info.get("episode", {}).get("success")))
                track.seen += 1
        for track in self.tracks.values():
            self._maybe_move(track)

    def _maybe_move(self, track: Track) -> None:
        if track.seen < self.cfg.min_episodes:
            return
        rate, top = track.rate(), len(track.ids) - 1
        if rate >= self.cfg.promote_at and track.level < top:
            track.level += 1
        elif rate <= self.cfg.demote_at and track.level > 0:
            track.level -= 1
        else:
            return
        track.recent.clear()
        track.seen = 0
        track.moves += 1
        for hook in self.on_move:
            hook(track.env_id)

    def metrics(self) -> dict[str, float]:
        """``curriculum/level`` (the mean over driven envs: the level of the one env most runs drive),
        ``curriculum/success`` (the window's rate), ``curriculum/moves``; per env ``curriculum/level_<name>``
        when several are driven."""
        tracks = list(self.tracks.values())
        n = len(tracks)
        out = {
            "curriculum/level": sum(t.level for t in tracks) / n,
            "curriculum/success": sum(t.rate() for t in tracks) / n,
            "curriculum/moves": float(sum(t.moves for t in tracks)),
        }
        if n > 1:
            for t in tracks:
                out[f"curriculum/level_{t.env_id.split('/')[-1]}"] = float(t.level)
        return out

    # ----- persistence -------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            e: {"level": t.level, "recent": list(t.recent), "seen": t.seen, "moves": t.moves}
            for e, t in self.tracks.items()
        }

    def load(self, state: dict[str, Any]) -> None:
        for env_id, s in state.items():
            track = self.tracks.get(env_id)
            if track is None:
                continue
            track.level = min(int(s["level"]), len(track.ids) - 1)
            track.recent = deque((bool(x) for x in s["recent"]), maxlen=self.cfg.window)
            track.seen, track.moves = int(s["seen"]), int(s["moves"])


class CurriculumHook:
    """The GRPO loop's handle: a no-op without ``curriculum:``; else drives a :class:`Curriculum`, resets the
    task selector's measurements of an env that moved, and keeps ``output_dir/curriculum.json``."""

    FILE = "curriculum.json"

    def __init__(self, cfg: Any, selector: Any = None, world: int = 1) -> None:
        self.cur: Curriculum | None = None
        self.path = Path(cfg.output_dir) / self.FILE
        data = getattr(cfg, "curriculum", None)
        if not data:
            return
        if world > 1:
            raise ConfigError("curriculum runs on one process only (not under torchrun yet)")
        self.cur = Curriculum(parse(data), list(cfg.env_ids), dict(cfg.env_kwargs), cfg.seed)
        if selector is not None:
            self.cur.on_move.append(lambda env_id: forget(selector, env_id))
        if getattr(cfg, "resume", False) and self.path.is_file():
            self.cur.load(json.loads(self.path.read_text()))

    def assign(self, tasks: list[RolloutTask]) -> list[RolloutTask]:
        return self.cur.assign(tasks) if self.cur is not None else tasks

    def observe(self, forest: list[RolloutTree]) -> None:
        if self.cur is not None:
            self.cur.observe(forest)

    def end_step(self, metrics: dict[str, float]) -> None:
        """Adds the curriculum's metrics and writes its state (so that a resume continues at its levels)."""
        if self.cur is None:
            return
        metrics |= self.cur.metrics()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.cur.state()))


def forget(selector: Any, env_id: str) -> None:
    """Task selection's measurements of ``env_id`` are dropped: they were made at another level."""
    for table in (selector.rate, selector.dropped_at):
        for key in [k for k in table if k[0] == env_id]:
            del table[key]
