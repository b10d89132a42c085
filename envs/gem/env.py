"""toolgym/GEM-v0 and toolgym/GEM-<Game>-<level>-v0: GEM's text games through ``gem.make``."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from toolgym.envs.base import CommandOutcome, Task, ToolEnv
from toolgym.envs.gem import GAMES, class_name, gem_id
from toolgym.envs.gem.expert import HAS_EXPERT, expert_move, solved
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.optional import require
from toolgym.parsing import ParseResult


def _gem() -> Any:
    return require("gem")


def _observation(text: Any, info: dict[str, Any]) -> str:
    """One turn's text as GEM's own observation wrapper builds it: prefix, the text, then the suffix
    (most games put the board and "Enter your move" in ``info["suffix"]``)."""
    body = str(text)
    if body and not body.endswith("\n"):
        body += "\n"
    return str(info.get("prefix", "")) + body + str(info.get("suffix", ""))


RngState = tuple[Any, Any]  # Python's and numpy's global RNG states


@dataclass
class GemEpisode:
    game: Any = None  # GEM's game object, in play (forks copy it deeply)
    rng: RngState | None = None  # the game's private copy of Python's and numpy's global RNG states
    moves: list[str] = field(default_factory=list)  # every reply GEM's step took, to rebuild the game
    raised: str | None = None  # GEM raised on this turn's reply and the reply was to blame (see run_command)


@contextmanager
def _rngs(state: RngState | None, keep: Callable[[RngState], None]) -> Iterator[None]:
    """Run GEM code on the RNG ``state`` (or the current one), hand the state it leaves to ``keep``, and give
    the caller back its own RNGs (GEM draws from, and seeds, Python's and numpy's global generators)."""
    outer = (random.getstate(), np.random.get_state())
    if state is not None:
        random.setstate(state[0])
        np.random.set_state(state[1])
    try:
        yield
    finally:
        keep((random.getstate(), np.random.get_state()))
        random.setstate(outer[0])
        np.random.set_state(outer[1])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


def _game_name(gem_env_id: str) -> str:
    """``game:Sudoku-v0-easy`` -> ``Sudoku``."""
    return gem_env_id.split(":", 1)[-1].split("-v", 1)[0]


class GemEnv(ToolEnv):
    """GEM's text games (PyPI ``gem-llm``) driven through its own ``gem.make`` API.

    ## Description
    Each episode is one game of a GEM environment (Sudoku, Minesweeper, Mastermind, Tower of Hanoi, Guess
    the Number, 2048, Sokoban, the 15-puzzle, crosswords), made with ``gem.make(env_id)`` and reset with a
    seed drawn from ``np_random``. GEM writes the instructions and the board; the model replies with a move.

    ## Action Space
    Text: the model's whole reply goes to GEM's ``step``, which reads the move from its last
    ``\\boxed{…}`` (``\\boxed{reveal 2 3}``, ``\\boxed{A C}``, …). An empty reply is an invalid action
    (format penalty, feedback); GEM itself scores a reply without a readable move (usually -0.1, game over).
    A reply that makes GEM's step raise (Crosswords' ``int()`` of a 5000-digit number) is an invalid action
    too: ``format_penalty``, ``info["invalid_action"]``, ``info["gem_error"]``, game over. Only an exception
    that is not the reply's doing (replayed from the same state, the reply does not raise it again, or an
    empty reply raises too: see ``_raised``) ends the episode as ``env_error``.

    ## Observation Space
    ``Messages``: on reset the system prompt and GEM's first observation; on each step GEM's next one,
    each composed as GEM's ``ObservationWrapper`` does: ``info["prefix"]``, the text, ``info["suffix"]``
    (where most games put the board).

    ## Tools
    None: moves are text (``action_format="command"``).

    ## Rewards
    ``gem``: GEM's step reward (1.0 for a win, partial progress in some games, -0.1 for an unreadable move).
    ``format``: ``format_penalty`` for an empty reply or one GEM raised on. ``info["success"]``: the game was won.

    ## Starting State
    GEM's ``reset(seed)`` with a seed drawn from ``np_random``. GEM seeds Python's and numpy's global RNGs;
    this env gives each game a private copy of both (swapped in around every GEM call), so envs and forks
    never disturb each other or the caller.

    ## Episode End
    Terminated when GEM ends the game (won, lost, out of GEM's own turns) or raised on the reply. Truncated
    after ``max_turns`` (a cap above GEM's, 200) as ``turn_limit``, or as ``env_error`` when the game itself
    fails (an exception that is not the reply's doing).

    ## Arguments
    ``env_id`` (GEM's id, e.g. "game:Sudoku-v0-easy"; fixed for the per-game ids), ``env_kwargs`` (passed to
    ``gem.make``), ``max_turns`` (200), ``format_penalty``.

    ## Version History
    - v0: first version (gem-llm 0.1.0); a reply GEM's step raises on is an invalid move, not an env_error.
    """

    family: ClassVar[str] = "gem"
    expert_success_rate: ClassVar[float] = 0.0
    reward_keys: ClassVar[tuple[str, ...]] = ("gem", "format")
    action_format = "command"
    fixed_env: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        max_turns: int = 200,
        **kwargs: Any,
    ) -> None:
        if self.fixed_env is not None and env_id not in (None, self.fixed_env):
            raise ConfigError(f"this id plays {self.fixed_env!r}; use toolgym/GEM-v0 for env_id={env_id!r}")
        self.gem_env_id = env_id or self.fixed_env or "game:GuessTheNumber-v0-easy"
        if not isinstance(self.gem_env_id, str) or ":" not in self.gem_env_id:
            raise ConfigError(f"env_id must be a GEM id such as 'game:Sudoku-v0-easy', got {env_id!r}")
        self.game_name = _game_name(self.gem_env_id)
        self.env_kwargs = dict(env_kwargs or {})
        self._game: Any = None  # made once, by the first episode; each episode resets it
        super().__init__(max_turns=max_turns, **kwargs)

    def _own_rng(self) -> AbstractContextManager[None]:
        """Run GEM code on this game's private copy of the global RNGs (GEM draws from ``random``)."""
        ep = self.episode
        return _rngs(ep.rng, lambda state: setattr(ep, "rng", state))

    def _make_game(self) -> Any:
        gem = _gem()
        from gem.envs.registration import ENV_REGISTRY

        if self.gem_env_id not in ENV_REGISTRY:
            games = sorted(k for k in ENV_REGISTRY if k.startswith("game:"))
            raise ConfigError(f"GEM has no env {self.gem_env_id!r}; its games: {', '.join(games)}")
        try:
            return gem.make(self.gem_env_id, **self.env_kwargs)
        except TypeError as exc:
            if not self.env_kwargs:
                raise  # GEM's own fault, not the user's settings
            raise ConfigError(f"gem.make({self.gem_env_id!r}) rejected env_kwargs: {exc}") from exc

    def instructions(self) -> str:
        return (
            "You are playing a text game. Each turn, reply with your next move written inside \\boxed{} "
            "exactly as the game's instructions describe (the last \\boxed{} of your reply is read)."
        )

    def begin_episode(self, options: dict[str, Any] | None) -> None:
        if self._game is None:
            self._game = self._make_game()

    def new_episode(self) -> GemEpisode:
        return GemEpisode(game=self._game)

    def make_task(self) -> Task:
        seed = int(self.np_random.integers(2**31 - 1))
        with self._own_rng():
            _seed_all(seed)
            observation, info = self.episode.game.reset(seed=seed)
        prompt = _observation(observation, info)
        return Task(task_id=f"gem-{self.gem_env_id}-{seed}", prompt=prompt, data={"seed": seed})

    def parse(self, action: Any) -> ParseResult:
        """The whole reply (GEM reads the move from it); only an empty or non-text reply is invalid here."""
        parsed = super().parse(action)
        if parsed.ok and parsed.command is not None and parsed.text.strip():
            return ParseResult(text=parsed.text, command=parsed.text.strip(), message=parsed.message)
        return parsed

    def run_command(self, command: str) -> CommandOutcome:
        ep = self.episode
        try:
            with self._own_rng():
                observation, reward, terminated, truncated, info = ep.game.step(command)
        except Exception as exc:  # whose fault: the reply's (an invalid move) or the game's (env_error)
            return self._raised(command, exc)
        ep.moves.append(command)
        reward = float(reward)
        over = bool(terminated or truncated)
        return CommandOutcome(
            observation=_observation(observation, info or {}),
            reward_components={"gem": reward},
            terminated=over,
            success=over and solved(self.game_name, ep.game, reward),
        )

    # The rule for an exception out of GEM's step. GEM's games are plain, deterministic Python given the seed,
    # the moves and the RNG states this env keeps, so "whose fault" is answered by replaying the turn, not by
    # the exception's type: the game is rebuilt as it stood before the reply (a fresh ``gem.make``, reset with
    # the episode's seed, every earlier move replayed on scratch RNGs), then one copy is given the same reply
    # and another an empty one (GEM's "no readable move" path, which also renders the board).
    #   - the reply raises the same exception type again and the empty reply does not: the reply is to blame
    #     (Crosswords' int() of a 5000-digit row number, say). It is an invalid move: the format penalty, an
    #     observation that says so, and the game ends as GEM ends a game on a move it cannot read.
    #   - anything else (the rebuild fails, the reply does not raise again, the empty reply raises too): the
    #     game or this adapter is at fault whatever the model wrote: InfrastructureError, the episode's
    #     env_error, never scored.
    # As GEM is deterministic (tests/envs/gem checks the rebuild equals the live game for every id), a reply
    # that raised raises again on the rebuilt game: a model cannot turn its own bad move into an unscored
    # episode; and a fault the empty reply also hits, or one that does not come back, is never charged to it.
    def _raised(self, command: str, exc: Exception) -> CommandOutcome:
        what = f"{type(exc).__name__}: {exc}"
        if len(what) > 300:
            what = what[:300] + "…"
        try:
            game, rng = self._rebuilt()
        except Exception as rebuild_exc:
            raise InfrastructureError(
                f"GEM's {self.gem_env_id} raised {what} in step, and the game could not be rebuilt to tell "
                f"whose fault it was: {type(rebuild_exc).__name__}: {rebuild_exc}"
            ) from exc
        if not _raises(copy.deepcopy(game), rng, command, type(exc)) or _raises(game, rng, "", Exception):
            raise InfrastructureError(
                f"GEM's {self.gem_env_id} raised {what} in step, a fault of the game, not of the reply (replayed "
                "from the same state, the reply did not raise it again or an empty reply raised too)"
            ) from exc
        self.episode.raised = what
        return CommandOutcome(
            observation=(
                f"Your move could not be played: the game failed reading it ({what}). "
                "A move the game cannot read ends the game."
            ),
            reward_components={"gem": 0.0, "format": self.format_penalty},
            terminated=True,
            success=False,
        )

    def _rebuilt(self) -> tuple[Any, RngState]:
        """A fresh copy of the game as it stood before this turn, and its RNG state: ``gem.make``, reset with
        the episode's seed, then every move GEM played so far, all on scratch RNGs (neither the episode's
        nor the caller's move)."""
        seed = int(self.task.data["seed"])
        out: list[RngState] = []
        with _rngs(None, out.append):
            game = self._make_game()
            _seed_all(seed)
            game.reset(seed=seed)
            for move in self.episode.moves:
                game.step(move)
        return game, out[0]

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """A reply GEM raised on (and was to blame, see ``_raised``) is an invalid action."""
        ep = self.episode
        if ep is None or ep.raised is None:
            return {}
        extra: dict[str, Any] = {"invalid_action": True, "gem_error": ep.raised}
        if "episode_invalid_actions" in info:
            extra["episode_invalid_actions"] = info["episode_invalid_actions"] + 1
        ep.raised = None
        return extra

    def expert_action(self) -> str:
        """The game's scripted expert (it reads the hidden state); a fixed move where there is none."""
        move = expert_move(self.game_name, self.episode.game)
        return move if move is not None else "\\boxed{1}"


def _raises(game: Any, rng: RngState, reply: str, kind: type[BaseException]) -> bool:
    """Whether GEM's step on ``game`` (at RNG state ``rng``, on scratch RNGs) raises an exception of ``kind``."""
    try:
        with _rngs(rng, lambda state: None):
            game.step(reply)
    except kind:
        return True
    except Exception:
        return False
    return False


def _game_class(game: str, level: str) -> type[GemEnv]:
    doc = f"GEM's ``{gem_id(game, level)}`` (see ``GemEnv`` for the contract).\n"
    declared = 1.0 if game in HAS_EXPERT else 0.0
    attrs = {"fixed_env": gem_id(game, level), "__doc__": doc, "expert_success_rate": declared}
    return type(class_name(game, level), (GemEnv,), attrs)


_CLASSES = {class_name(g, lv): (g, lv) for g, levels in GAMES.items() for lv in levels}


def __getattr__(name: str) -> type[GemEnv]:
    """``GEM_Sudoku_easy`` and friends: one class per game and level, made on first use."""
    found = _CLASSES.get(name)
    if found is None:
        raise AttributeError(name)
    cls = _game_class(*found)
    globals()[name] = cls
    return cls
