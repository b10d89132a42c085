"""toolgym/Werewolf-v0: a text Werewolf game, one seat played by the model, the others by scripted players."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from toolgym.envs.multiagent.api import MultiAgentEnv
from toolgym.envs.multiagent.seat import SeatEnv
from toolgym.envs.multiagent.selfplay import SelfPlayTable
from toolgym.envs.werewolf.agents import POLICIES, view_of
from toolgym.envs.werewolf.expert import expert_action
from toolgym.envs.werewolf.rules import Move, WerewolfGame, team_of
from toolgym.errors import ConfigError
from toolgym.tools import Tool

ROLES = ("any", "werewolf", "seer", "doctor", "villager")


def kill(player: str) -> str:
    """Night, werewolves only: propose a player for the werewolves to kill.

    Args:
        player: a living player who is not a werewolf, e.g. "P3".
    """
    return player


def inspect(player: str) -> str:
    """Night, seer only: learn privately whether a player is a werewolf.

    Args:
        player: another living player, e.g. "P3".
    """
    return player


def protect(player: str) -> str:
    """Night, doctor only: save a player from tonight's kill (not the same player two nights in a row).

    Args:
        player: a living player, e.g. "P3" (yourself allowed).
    """
    return player


def say(text: str) -> str:
    """Day discussion: speak to every player (plain text without a tool call does the same).

    Args:
        text: what you say, e.g. "I am the seer. P3 is a werewolf."
    """
    return text


def vote(player: str) -> str:
    """Day vote: vote to eliminate a player.

    Args:
        player: another living player, e.g. "P3".
    """
    return player


_KIND_OF = {"kill": "kill", "inspect": "inspect", "protect": "protect", "vote": "vote", "say": "speak"}


class WerewolfEnv(SeatEnv):
    """A text Werewolf game in which the model plays one seat against scripted players.

    ## Description
    ``n_players`` players (5-7): werewolves (1 with 5 players, else 2), a seer, a doctor and villagers
    (``toolgym.envs.werewolf.rules``). Night: werewolves pick a victim, the seer inspects a player, the
    doctor protects one. Day: ``discussion_rounds`` rounds of public speech, then a vote that eliminates the
    most-voted player (ties: nobody). A dead player's role is revealed. The village wins when no werewolf
    lives; the werewolves when they are at least half of the living; after ``max_days`` it is a draw.
    The model plays one seat (drawn each episode, or of ``seat_role``); every other seat is the scripted
    player named by ``opponents`` (``random``, ``basic`` or ``strong``; ``toolgym.envs.werewolf.agents``).
    The multi-agent game itself is ``WerewolfGame`` (AEC API, ``toolgym.envs.multiagent.api``) for
    self-play over several seats.

    ## Action Space
    Text, one tool call per turn: ``kill``/``inspect``/``protect`` at night (by role), ``say`` in the
    discussion (plain text is a speech too), ``vote`` in the vote. Hermes format by default,
    ``<tool_call>{"name": "vote", "arguments": {"player": "P3"}}</tool_call>``; tags: ``<vote>P3</vote>``.

    ## Observation Space
    ``Messages``: on reset the system prompt and the game so far as the seat sees it (its role, for a
    werewolf its teammates); on each step what happened since (speeches, the seer's private result, the
    wolves' proposals, deaths and votes) and what to do now.

    ## Tools
    ``kill(player)``, ``inspect(player)``, ``protect(player)``, ``say(text)``, ``vote(player)``.

    ## Rewards
    ``win``: 1.0 when the seat's side wins. ``illegal``: ``illegal_penalty`` (-0.1) per move the referee
    rejects (wrong phase or role, a dead or unknown player, the doctor's repeat, several calls in a turn).
    ``format``: ``format_penalty`` per turn that is no move at all.

    ## Starting State
    A seeded deal of roles and seat; the scripted players move (night one) until the seat must move.

    ## Episode End
    Terminated when the game ends (also when the seat dies: the others play the game out in that step).
    Truncated after ``max_turns`` turns of the model.

    ## Arguments
    ``n_players`` (7), ``opponents`` ("basic"), ``seat_role`` ("any"), ``discussion_rounds`` (1),
    ``max_days`` (7), ``illegal_penalty`` (-0.1), ``max_turns`` (40).

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "games"
    # the strong player in a drawn seat against basic opponents, 7 players (benchmarks/results/werewolf.md)
    expert_success_rate: ClassVar[float] = 0.4
    text_phases: ClassVar[tuple[str, ...]] = ("discussion",)

    def __init__(
        self,
        *,
        n_players: int = 7,
        opponents: str = "basic",
        seat_role: str = "any",
        discussion_rounds: int = 1,
        max_days: int = 7,
        max_turns: int = 40,
        **kwargs: Any,
    ) -> None:
        if opponents not in POLICIES:
            raise ConfigError(f"opponents must be one of {sorted(POLICIES)}, got {opponents!r}")
        if seat_role not in ROLES:
            raise ConfigError(f"seat_role must be one of {ROLES}, got {seat_role!r}")
        if discussion_rounds < 1 or max_days < 1:
            raise ConfigError("discussion_rounds and max_days must be >= 1")
        WerewolfGame(n_players=n_players)  # validates n_players
        self.n_players = n_players
        self.opponents = opponents
        self.seat_role = seat_role
        self.discussion_rounds = discussion_rounds
        self.max_days = max_days
        super().__init__(max_turns=max_turns, **kwargs)

    def tools(self) -> list[Tool]:
        return [Tool(kill), Tool(inspect), Tool(protect), Tool(say), Tool(vote)]

    def instructions(self) -> str:
        return (
            "You play Werewolf. Werewolves kill at night; the village votes by day. Win with your side: the "
            "village wins when every werewolf is dead, the werewolves when they are at least half of the "
            "living. Make exactly one move per turn with the tool your phase and role allow."
        )

    def new_game(self) -> MultiAgentEnv[Any]:
        return WerewolfGame(
            n_players=self.n_players,
            discussion_rounds=self.discussion_rounds,
            max_days=self.max_days,
            illegal_penalty=self.illegal_penalty,
        )

    def choose_seat(self, game: MultiAgentEnv[Any], rng: np.random.Generator) -> str:
        assert isinstance(game, WerewolfGame)
        seats = [p for p in game.possible_agents if self.seat_role in ("any", game.roles[p])]
        return seats[int(rng.integers(len(seats)))]

    def describe(self, game: MultiAgentEnv[Any], seat: str) -> str:
        assert isinstance(game, WerewolfGame)
        return f"You are {seat}, a {game.roles[seat]} (team {team_of(game.roles[seat])})."

    def opponent_move(self, game: MultiAgentEnv[Any], agent: str, rng: np.random.Generator) -> Move:
        assert isinstance(game, WerewolfGame)
        return POLICIES[self.opponents](view_of(game, agent), rng)

    def move_from_call(self, game: MultiAgentEnv[Any], name: str, arguments: dict[str, Any]) -> Move | str:
        kind = _KIND_OF[name]
        key = "text" if kind == "speak" else "player"
        value = arguments.get(key)
        if not isinstance(value, str):
            return f"{name} takes one argument, {key} (a string)."
        if kind == "speak":
            return Move(kind="speak", text=value)
        return Move(kind=kind, target=value.strip())  # type: ignore[arg-type]

    def expert_move_text(self, game: MultiAgentEnv[Any], seat: str, rng: np.random.Generator) -> str:
        assert isinstance(game, WerewolfGame)
        return expert_action(game, seat, rng, self.action_format)


def self_play_table(
    text_seats: Sequence[str], seed: int, others: str = "strong", **env_kwargs: Any
) -> SelfPlayTable:
    """A Werewolf game (dealt by ``seed``) whose ``text_seats`` are answered with text, the rest played by the
    scripted ``others``: the env side of self-play (``toolgym.envs.multiagent.selfplay``)."""
    if others not in POLICIES:
        raise ConfigError(f"others must be one of {sorted(POLICIES)}, got {others!r}")
    rules = WerewolfEnv(opponents=others, **env_kwargs)
    game = rules.new_game()
    game.reset(seed=seed)

    def scripted(game: MultiAgentEnv[Any], agent: str, rng: np.random.Generator) -> Move:
        return rules.opponent_move(game, agent, rng)

    return SelfPlayTable(rules, game, text_seats, scripted, seed=seed + 1)
