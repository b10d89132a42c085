"""What the three engine adapters share: the command loop, rewards, the state key and an engine pool.

An engine (a JVM for ScienceWorld and TextWorldExpress, a Z-machine for TextWorld) is costly to start, so
each adapter takes one from a process-wide pool on its first reset, keeps it across episodes, and gives it
back in ``close()``; the next env made in the process reuses it instead of starting another.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolgym.envs.base import CommandOutcome, Task, ToolEnv
from toolgym.envs.text_games.expert import walkthrough_action
from toolgym.errors import InfrastructureError

MAX_COMMAND_CHARS = 200


@dataclass
class EngineState:
    """One engine answer, in the engine's own words."""

    observation: str
    score: float = 0.0  # normalised to [0, 1] (the engine's score over its maximum)
    won: bool = False
    lost: bool = False
    inventory: str = ""
    admissible: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineEpisode:
    """What changes in an episode: the engine's last answer and the walkthrough of the game in play (the
    game itself lives in the engine, which cannot be copied: these envs do not fork)."""

    state: EngineState = field(default_factory=lambda: EngineState(""))
    gold: list[str] = field(default_factory=list)


class EnginePool:
    """Idle engines by kind. ``take`` returns one (starting it with ``start`` when none is idle)."""

    def __init__(self) -> None:
        self._idle: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self._closers: dict[str, Callable[[Any], None]] = {}
        atexit.register(self.close_all)

    def take(self, kind: str, start: Callable[[], Any], close: Callable[[Any], None]) -> Any:
        with self._lock:
            self._closers[kind] = close
            idle = self._idle.get(kind)
            if idle:
                return idle.pop()
        return start()

    def give(self, kind: str, engine: Any) -> None:
        with self._lock:
            self._idle.setdefault(kind, []).append(engine)

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for kind, engines in idle.items():
            for engine in engines:
                with contextlib.suppress(Exception):  # an engine that died has nothing left to close
                    self._closers[kind](engine)


POOL = EnginePool()


class EngineEnv(ToolEnv):
    """Base of the adapters: subclasses fill in ``_start``, ``_close_engine``, ``_new_game`` and ``_step``."""

    family: ClassVar[str] = "text_games"
    action_format = "command"
    supports_fork: ClassVar[bool] = False  # the engines cannot copy a running game
    reward_keys: ClassVar[tuple[str, ...]] = ("success", "score", "format")
    engine_kind: ClassVar[str] = "engine"

    def __init__(self, *, dense_rewards: bool = False, max_turns: int = 50, **kwargs: Any) -> None:
        self.dense_rewards = dense_rewards
        self._engine: Any = None
        super().__init__(max_turns=max_turns, **kwargs)

    # ----- subclass hooks ----------------------------------------------------------------------------------
    def _start(self) -> Any:
        raise NotImplementedError

    def _close_engine(self, engine: Any) -> None:
        raise NotImplementedError

    def _new_game(self) -> tuple[str, str, EngineState]:
        """Draw a game with ``np_random`` and start it: (task id, task text, first state)."""
        raise NotImplementedError

    def _step(self, command: str) -> EngineState:
        raise NotImplementedError

    # ----- shared ------------------------------------------------------------------------------------------
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = POOL.take(self.engine_kind, self._start, self._close_engine)
        return self._engine

    def instructions(self) -> str:
        return (
            "You are playing a text game. Each turn, reply with exactly one command (for example "
            '"look around", "open door", "take key", "go north"); the game answers with what happens.'
        )

    def new_episode(self) -> EngineEpisode:
        return EngineEpisode()

    def make_task(self) -> Task:
        try:
            task_id, intro, state = self._new_game()
        except (InfrastructureError, ImportError, ValueError):  # typed errors (missing package, bad config)
            raise
        except Exception as exc:  # the engine broke: an infrastructure fault, not a model failure
            self._drop_engine()
            raise InfrastructureError(f"{self.engine_kind} could not start a game: {exc}") from exc
        self.episode.state = state
        return Task(task_id=task_id, prompt=intro, data={"gold": list(self.episode.gold)})

    def run_command(self, command: str) -> CommandOutcome:
        # Engines are fed only short printable commands: a Z-machine can spin for minutes on a 50,000
        # character line or on control characters, and no real command is that long.
        command = " ".join("".join(c if c.isprintable() else " " for c in command).split())
        if not command:
            return CommandOutcome(observation="Type a command (a few words, such as: look around).")
        if len(command) > MAX_COMMAND_CHARS:
            return CommandOutcome(
                observation=f"That command is {len(command)} characters long; a command is a few words."
            )
        before = self.episode.state.score
        try:
            state = self._step(command)
        except Exception as exc:  # a dead engine is an infrastructure fault
            self._drop_engine()
            raise InfrastructureError(f"{self.engine_kind} failed on {command!r}: {exc}") from exc
        self.episode.state = state
        components: dict[str, float] = {}
        if state.won:
            components["success"] = 1.0
        if self.dense_rewards and state.score != before:
            components["score"] = state.score - before
        return CommandOutcome(
            observation=state.observation,
            reward_components=components,
            terminated=state.won or state.lost,
            success=state.won,
        )

    def expert_action(self) -> str:
        """The engine's own walkthrough (gold path) from the start of the episode."""
        return walkthrough_action(self.episode.gold, self._turn)

    def state_key(self) -> str:
        """The engine's observation and inventory, hashed (GiGPO groups turns by it)."""
        state = self.episode.state
        text = f"{state.observation}\x00{state.inventory}"
        return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """The state key (GiGPO), the game's score, its admissible commands and the walkthrough's length."""
        state = self.episode.state
        out: dict[str, Any] = {"state_key": self.state_key(), "score": state.score}
        if state.admissible is not None:
            out["admissible_commands"] = list(state.admissible)
        out["gold_steps"] = len(self.episode.gold)
        return out

    def _drop_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(Exception):  # already dead
                self._close_engine(engine)

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            POOL.give(self.engine_kind, engine)
        super().close()
