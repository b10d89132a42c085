"""toolgym/TextWorld-v0: games made on demand by TextWorld's own generator and compiler (PyPI ``textworld``)."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, ClassVar

from toolgym.envs.text_games.common import EngineEnv, EngineState
from toolgym.errors import ConfigError
from toolgym.optional import require

# difficulty -> (rooms, objects, quest length)
LEVELS = {1: (2, 4, 2), 2: (4, 8, 3), 3: (6, 12, 4), 4: (8, 16, 6), 5: (10, 20, 8)}
_BANNER_END = re.compile(r"^.*\$\$.*$", re.M)
_PROMPT = re.compile(r"\n\s*>[^\n]*$")  # the Z-machine's input prompt (and status line) after each answer
_INTERPRETER_VERB = re.compile(r"\s*(save|restore|script|unscript|transcript|noscript)\b", re.I)
# jericho's input buffer: it cuts a longer command's UTF-8 bytes there, then decodes the cut for its warning
JERICHO_INPUT_BYTES = 198


def _textworld() -> Any:
    require("textworld.generator")
    return require("textworld")


def default_cache() -> Path:
    """Where generated games are kept: ``$TOOLGYM_CACHE/textworld`` (default ``~/.cache/toolgym``)."""
    root = os.environ.get("TOOLGYM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "toolgym")
    return Path(root) / "textworld"


def game_file(difficulty: int, seed: int, cache_dir: Path | None = None) -> Path:
    """The compiled game of a difficulty and seed, generated and compiled on first use, then cached.

    Concurrent makers are safe: each compiles in its own temporary folder and moves the files in place
    (the ``.json`` first, so a ``.z8`` that exists always has its ``.json``).
    """
    folder = (cache_dir or default_cache()) / f"d{difficulty}"
    target = folder / f"game_{seed}.z8"
    if target.exists():
        return target
    tw = _textworld()
    folder.mkdir(parents=True, exist_ok=True)
    rooms, objects, length = LEVELS[difficulty]
    options = tw.GameOptions()
    options.seeds = seed
    options.nb_rooms, options.nb_objects, options.quest_length = rooms, objects, length
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        options.path = os.path.join(tmp, f"game_{seed}.z8")
        options.force_recompile = True
        game = tw.generator.make_game(options)
        made = Path(tw.generator.compile_game(game, options))
        os.replace(made.with_suffix(".json"), target.with_suffix(".json"))
        os.replace(made, target)
    return target


class TextWorldEnv(EngineEnv):
    """TextWorld games (find, unlock, open, take and put quests in a house of rooms) made by its generator.

    ## Description
    Each episode plays one TextWorld game, chosen by the seed among ``games`` games of ``difficulty``;
    a game is generated and compiled with TextWorld's own generator the first time it is needed, then
    cached on disk (``cache_dir``, default ``$TOOLGYM_CACHE/textworld``), so later episodes start at once.

    ## Action Space
    Plain commands in TextWorld's grammar ("open wooden door", "go east", "take key from table",
    "unlock chest with key", "put apple on counter", …): the whole reply is one command.

    ## Observation Space
    ``Messages``: on reset the system prompt, the quest and the first room; then TextWorld's answer to each
    command. ``info["admissible_commands"]`` lists the commands TextWorld accepts in the current state.

    ## Tools
    None (command format).

    ## Rewards
    ``success``: 1.0 when the quest is won. ``score``: with ``dense_rewards=True``, the change of the game's
    score over its maximum (its subgoals). ``format``: ``format_penalty`` for an empty reply.

    ## Starting State
    The game's start. ``info`` carries ``gold_steps`` (the game's walkthrough length), ``score`` (0-1),
    ``admissible_commands`` and ``state_key`` (a hash of the observation and inventory).

    ## Episode End
    Terminated when the quest is won or lost. Truncated after ``max_turns`` (default 50).

    ## Arguments
    ``difficulty`` (2; 1-5: rooms, objects and quest length grow: 2/4/2 … 10/20/8), ``games`` (10: the
    pool of game seeds an env draws from; raise it for training, each new game costs a few seconds once),
    ``cache_dir`` (None: the default cache), ``dense_rewards`` (False), ``max_turns`` (50),
    ``format_penalty`` (-0.1).

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "text_games"
    expert_success_rate: ClassVar[float] = 1.0
    engine_kind: ClassVar[str] = "textworld"

    def __init__(
        self,
        *,
        difficulty: int = 2,
        games: int = 10,
        cache_dir: str | None = None,
        max_turns: int = 50,
        **kwargs: Any,
    ) -> None:
        if difficulty not in LEVELS:
            raise ConfigError(f"difficulty must be one of {sorted(LEVELS)}, got {difficulty}")
        if games < 1:
            raise ConfigError(f"games must be >= 1, got {games}")
        self.difficulty = difficulty
        self.games = games
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._game: Any = None
        super().__init__(max_turns=max_turns, **kwargs)

    def _new_game(self) -> tuple[str, str, EngineState]:
        tw = _textworld()
        seed = int(self.np_random.integers(self.games))
        path = game_file(self.difficulty, seed, self.cache_dir)
        self._close_game()
        infos = tw.EnvInfos(
            admissible_commands=True, inventory=True, max_score=True, won=True, lost=True, score=True
        )
        infos.objective = True
        with warnings.catch_warnings():  # jericho: "not fully supported" (TextWorld tracks the score itself)
            warnings.simplefilter("ignore")
            self._game = tw.start(str(path), request_infos=infos)
        state = self._game.reset()
        self.episode.gold = [str(c) for c in tw.Game.load(str(path.with_suffix(".json"))).walkthrough]
        first = self._state_of(state)
        intro = _BANNER_END.split(first.observation)[-1].strip()
        return f"textworld-d{self.difficulty}-{seed}", intro, first

    def _step(self, command: str) -> EngineState:
        if "\\" in command or _INTERPRETER_VERB.match(command):
            # the interpreter's own commands, not the game's: a line starting with a backslash is a dumb-frotz
            # command that then waits for input forever (the step hung); save, restore and script write and read
            # files in the trainer's folder (a save restored in a later episode of the same game)
            return dataclasses.replace(self.episode.state, observation="That command is not available here.")
        size = len(command.encode("utf-8"))
        if size > JERICHO_INPUT_BYTES:
            # a cut through a multibyte character made jericho's warning raise UnicodeDecodeError: 50 emoji
            # (200 characters pass the shared length check) ended the episode as env_error and killed the engine
            text = f"That command is {size} bytes long; a command is a few words."
            return dataclasses.replace(self.episode.state, observation=text)
        state, _, _ = self._game.step(command)
        return self._state_of(state)

    @staticmethod
    def _state_of(state: Any) -> EngineState:
        max_score = float(state.get("max_score") or 1)
        return EngineState(
            observation=_PROMPT.sub("", str(state.feedback)).strip(),
            score=float(state.get("score") or 0) / max_score,
            won=bool(state.get("won")),
            lost=bool(state.get("lost")),
            inventory=str(state.get("inventory") or ""),
            admissible=[str(c) for c in state.get("admissible_commands") or []],
        )

    def engine(self) -> Any:
        return self._game

    def _close_game(self) -> None:
        game, self._game = self._game, None
        if game is not None:
            game.close()

    def close(self) -> None:
        self._close_game()
        super().close()
