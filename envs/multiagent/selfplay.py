"""Several text seats of one multi-agent game, for self-play: one policy (shared weights) answers every text
seat, each seat keeps its own chat transcript and its own return, and the other seats are scripted or frozen.

This is the env side of self-play that a trainer's rollout drives (nothing here generates text):

    table = SelfPlayTable(WerewolfEnv(), game, text_seats=["P1", "P4"], others=scripted, seed=0)
    while (seat := table.next_seat()) is not None:
        table.act(seat, policy(table.messages(seat)))      # batch many tables' pending seats in practice
    table.returns()                                         # {"P1": 1.0, "P4": 0.0}: credit per seat
    table.messages("P1")                                    # its transcript, ending with the game's end

Each seat's transcript reads exactly as the single-agent seat env's episode would (same system prompt, same
rendering of the news, same parsing through ``SeatEnv.read_move``), so SFT data, self-play trajectories and
single-agent evaluation share one format. A turn that is no move, or a move the referee rejects, is a user
message saying why and ``illegal_penalty`` on that seat's return; the seat moves again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolgym.envs.base import cap_text
from toolgym.envs.multiagent.api import MultiAgentEnv
from toolgym.envs.multiagent.seat import SeatEnv, render_news
from toolgym.errors import ConfigError, EpisodeOverError

# a fixed seat's policy: (game, agent, generator) -> the game's move
FixedPolicy = Callable[[MultiAgentEnv[Any], str, np.random.Generator], Any]


@dataclass
class SeatRecord:
    messages: list[dict[str, Any]] = field(default_factory=list)
    shown: int = 0  # how many of the game's messages this seat has been shown
    penalty: float = 0.0  # parse and referee penalties so far
    turns: int = 0
    invalid: int = 0


class SelfPlayTable:
    """One game whose ``text_seats`` are answered with text (see the module docstring); ``rules`` is the
    single-agent seat env whose prompts, parsing and tools every text seat uses."""

    def __init__(
        self,
        rules: SeatEnv,
        game: MultiAgentEnv[Any],
        text_seats: Sequence[str],
        others: FixedPolicy,
        seed: int = 0,
        max_turns_per_seat: int = 60,
    ) -> None:
        unknown = set(text_seats) - set(game.possible_agents)
        if unknown or not text_seats:
            raise ConfigError(f"text_seats must be players of the game, got {list(text_seats)}")
        self.rules = rules
        self.game = game
        self.text_seats = list(text_seats)
        self.others = others
        self.rng = np.random.default_rng(seed)
        self.max_turns_per_seat = max_turns_per_seat
        self.records: dict[str, SeatRecord] = {}
        system = rules.system_prompt()
        for seat in self.text_seats:
            self.records[seat] = SeatRecord([{"role": "system", "content": system}])

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [t.spec.to_dict() for t in self.rules.tools()]

    def next_seat(self) -> str | None:
        """Let the fixed seats move; the text seat to answer next, or None when the game is over (or a seat
        ran out of turns: the game is then abandoned, no side wins)."""
        while not self.game.done:
            agent = self.game.agent_selection
            if agent not in self.records:
                self.game.step(self.others(self.game, agent, self.rng))
                continue
            if self.records[agent].turns >= self.max_turns_per_seat:
                return None
            return agent
        return None

    def messages(self, seat: str) -> list[dict[str, Any]]:
        """The seat's chat so far, ending with what it must answer now."""
        record = self.records[seat]
        news, record.shown = render_news(self.game, seat, record.shown)
        if len(record.messages) == 1:  # the seat's first turn: who it is, then the game so far
            record.messages.append(self._user(f"{self.rules.describe(self.game, seat)}\n{news}"))
        elif news and record.messages[-1]["role"] == "assistant":
            record.messages.append(self._user(news))
        return record.messages

    def _user(self, text: str) -> dict[str, Any]:
        """A seat's observation, capped as the seat env's own are (``max_observation_chars``): a referee's
        message may quote a move's argument (a player name) of any length."""
        return {"role": "user", "content": cap_text(text, self.rules.max_observation_chars)}

    def act(self, seat: str, action: Any) -> None:
        """The seat's turn (text or an assistant message)."""
        if self.game.done or self.game.agent_selection != seat:
            raise EpisodeOverError(f"it is not {seat}'s turn")
        self.messages(seat)  # the news up to now belongs before this answer
        record = self.records[seat]
        move, message = self.rules.read_move(self.game, action)
        record.messages.append(message.to_dict())
        record.turns += 1
        if isinstance(move, str):
            record.invalid += 1
            record.penalty += self.rules.illegal_penalty
            record.messages.append(self._user(f"{move} Your move: {self.game.prompt_for(seat)}"))
            return
        before = dict(getattr(self.game, "illegal", {}))
        self.game.step(move)
        if getattr(self.game, "illegal", {}) != before:
            record.invalid += 1  # the referee's penalty is already in the game's rewards

    @property
    def done(self) -> bool:
        return self.next_seat() is None

    def returns(self) -> dict[str, float]:
        """Each text seat's return: the game's reward (a win, the referee's penalties) plus parse penalties."""
        return {s: float(self.game.rewards[s]) + r.penalty for s, r in self.records.items()}
