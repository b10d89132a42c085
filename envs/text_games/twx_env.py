"""toolgym/TextWorldExpress-v0: CookingWorld, TextWorld Commonsense and Coin Collector (PyPI
``textworld-express``, a fast Scala reimplementation on a JVM)."""

from __future__ import annotations

import shutil
from typing import Any, ClassVar

from toolgym.envs.text_games.common import EngineEnv, EngineState
from toolgym.errors import ConfigError, DependencyNotInstalled
from toolgym.optional import require

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
FOLDS = ("train", "dev", "test")
# Smaller worlds than the engine's defaults (whose CookingWorld gold paths run past 70 steps); any
# parameter string the engine takes can replace them through ``game_params``.
DEFAULT_PARAMS = {
    "cookingworld": "numLocations=3,numIngredients=2,numDistractorItems=3,includeDoors=0,limitInventorySize=0",
    "twc": "numLocations=2,numItemsToPutAway=3,includeDoors=0",
    "coin": "numLocations=5,numDistractorItems=2,includeDoors=1",
}
# The engine draws a new gold path at each reset; the first one drawn for a game is kept, so the expert
# (and every check that replays it) is the same each time in a process.
_GOLD: dict[tuple[str, str, str, int], list[str]] = {}


def _engine_class() -> Any:
    Engine = require("textworld_express").TextWorldExpressEnv
    if shutil.which("java") is None:
        raise DependencyNotInstalled(
            "java", why="TextWorldExpress runs on a Java runtime: apt-get install default-jre-headless"
        )
    return Engine


class TextWorldExpressEnv(EngineEnv):
    """TextWorldExpress games (CookingWorld, TextWorld Commonsense, Coin Collector, …) through its engine.

    ## Description
    Each episode is one TextWorldExpress game: the game uniformly among ``games`` and its seed among the
    engine's seeds of ``fold``, both drawn from the env's seed. The JVM starts on the first reset, stays up
    across episodes, and goes back to a process-wide pool on ``close()``.

    ## Action Space
    Plain commands in the game's grammar ("open fridge", "take knife", "move south", "put apple in fridge",
    "prepare meal", …): the whole reply is one command.

    ## Observation Space
    ``Messages``: on reset the system prompt and the task description with the first look; then the game's
    answer to each command. ``info["admissible_commands"]`` lists the engine's valid actions.

    ## Tools
    None (command format).

    ## Rewards
    ``success``: 1.0 when the engine reports task success. ``score``: with ``dense_rewards=True``, the change
    of the engine's normalised score. ``format``: ``format_penalty`` for an empty reply.

    ## Starting State
    The game as the engine generates it from its seed. ``info`` carries ``gold_steps`` (the engine's gold
    path length), ``score`` (0-1), ``admissible_commands`` and ``state_key`` (a hash of the observation and
    inventory).

    ## Episode End
    Terminated on task success or failure. Truncated after ``max_turns`` (default 100).

    ## Arguments
    ``games`` (["cookingworld", "twc", "coin"]; any of ``GAMES``), ``game_params`` (a dict of game name
    to the engine's parameter string, e.g. {"coin": "numLocations=5,includeDoors=1"}; default
    ``DEFAULT_PARAMS``: 2-5 locations),
    ``fold`` ("train", "dev" or "test" seeds), ``dense_rewards`` (False), ``max_turns`` (100),
    ``format_penalty`` (-0.1).

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "text_games"
    expert_success_rate: ClassVar[float] = 1.0
    engine_kind: ClassVar[str] = "textworld_express"

    def __init__(
        self,
        *,
        games: list[str] | tuple[str, ...] = ("cookingworld", "twc", "coin"),
        game_params: dict[str, str] | None = None,
        fold: str = "train",
        max_turns: int = 100,
        **kwargs: Any,
    ) -> None:
        unknown = [g for g in games if g not in GAMES]
        if unknown or not games:
            raise ConfigError(f"unknown TextWorldExpress games {unknown}; known: {list(GAMES)}")
        if fold not in FOLDS:
            raise ConfigError(f"fold must be one of {list(FOLDS)}, got {fold!r}")
        self.games = tuple(games)
        self.game_params = dict(game_params or {})
        self.fold = fold
        self._seeds: dict[str, list[int]] = {}
        super().__init__(max_turns=max_turns, **kwargs)

    def _start(self) -> Any:
        return _engine_class()(envStepLimit=10**6)

    def _close_engine(self, engine: Any) -> None:
        engine.close()

    def _new_game(self) -> tuple[str, str, EngineState]:
        engine = self.engine()
        game = self.games[int(self.np_random.integers(len(self.games)))]
        params = self.game_params.get(game, DEFAULT_PARAMS.get(game, ""))
        engine.load(game, params)
        if game not in self._seeds:
            getter = {
                "train": engine.getValidSeedsTrain,
                "dev": engine.getValidSeedsDev,
                "test": engine.getValidSeedsTest,
            }
            self._seeds[game] = list(getter[self.fold]())
        seeds = self._seeds[game]
        seed = int(seeds[int(self.np_random.integers(len(seeds)))])
        observation, infos = engine.reset(
            seed=seed, gameFold=self.fold, gameName=game, gameParams=params, generateGoldPath=True
        )
        key = (game, params, self.fold, seed)
        if key not in _GOLD:
            gold = [str(a) for a in engine.getGoldActionSequence()]
            # the gold path opens with the "look around" the reset already did
            _GOLD[key] = gold[1:] if gold and gold[0] == "look around" else gold
        self.episode.gold = list(_GOLD[key])
        state = self._state_of(observation, infos)
        intro = f"{infos.get('taskDescription', '')}\n\n{observation}".strip()
        return f"twx-{game}-{self.fold}-{seed}", intro, state

    def _step(self, command: str) -> EngineState:
        observation, _, _, infos = self.engine().step(command)
        return self._state_of(observation, infos)

    @staticmethod
    def _state_of(observation: str, infos: dict[str, Any]) -> EngineState:
        return EngineState(
            observation=str(observation),
            score=float(infos.get("score", 0.0)),
            won=bool(infos.get("tasksuccess")),
            lost=bool(infos.get("taskfailure")),
            inventory=str(infos.get("inventory", "")),
            admissible=sorted(str(a) for a in infos.get("validActions", [])),
        )
