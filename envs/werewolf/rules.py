"""Werewolf's rules and referee: a seeded, deterministic multi-agent game (``WerewolfGame``, AEC API).

Players P1..Pn (5-7). Roles: werewolves (1 with 5 players, else 2), one seer, one doctor, villagers. A dead
player's role is revealed. The game starts at night:

- Night: each living werewolf proposes a victim (the wolves see each other's proposals); the seer inspects
  one player and privately learns whether it is a werewolf; the doctor protects one player (not the same
  one two nights in a row). At dawn the victim (most proposals; a tie goes to the earliest) dies unless
  protected.
- Day: ``discussion_rounds`` rounds of public speech in seat order, then a vote; votes are revealed together
  and the player with the most votes is eliminated (a tie eliminates nobody).
- The village wins when no werewolf lives; the werewolves win when they are at least half of the living.
  After ``max_days`` days without a winner the game is a draw (neither side wins).

The referee rejects an illegal move (wrong kind for the phase, a dead or unknown target, the doctor's
repeat): the same player stays to move, gets the reason privately, and ``illegal_penalty`` in its reward.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from toolgym.envs.multiagent.api import REFEREE, MessageLog, MultiAgentEnv
from toolgym.errors import ConfigError, EpisodeOverError

Role = Literal["werewolf", "seer", "doctor", "villager"]
Phase = Literal["night", "discussion", "vote", "over"]
MoveKind = Literal["kill", "inspect", "protect", "speak", "vote"]
NIGHT_MOVES: dict[str, MoveKind] = {"werewolf": "kill", "seer": "inspect", "doctor": "protect"}
MAX_SPEECH_CHARS = 600


class Move(BaseModel):
    """One player's move: a night action or a vote names a ``target``; a speech carries ``text``."""

    model_config = ConfigDict(frozen=True)

    kind: MoveKind
    target: str | None = None
    text: str = ""


def team_of(role: str) -> str:
    return "werewolves" if role == "werewolf" else "village"


def deal_roles(n_players: int) -> list[Role]:
    if not 5 <= n_players <= 7:
        raise ConfigError(f"n_players must be 5, 6 or 7, got {n_players}")
    wolves = 1 if n_players == 5 else 2
    werewolves: list[Role] = ["werewolf"] * wolves
    villagers: list[Role] = ["villager"] * (n_players - wolves - 2)
    return [*werewolves, "seer", "doctor", *villagers]


@dataclass
class WerewolfGame(MultiAgentEnv[Move]):
    """The game state and its referee; plain data, so a deep copy forks it."""

    n_players: int = 7
    discussion_rounds: int = 1
    max_days: int = 7
    illegal_penalty: float = -0.1
    roles: dict[str, Role] = field(default_factory=dict)
    alive: list[str] = field(default_factory=list)
    day: int = 0
    phase: Phase = "night"
    queue: list[str] = field(default_factory=list)
    proposals: list[tuple[str, str]] = field(default_factory=list)  # (wolf, victim) in order
    protected: str | None = None
    last_protected: str | None = None
    inspected: str | None = None
    votes: dict[str, str] = field(default_factory=dict)
    winner: str | None = None  # "village", "werewolves" or "draw"
    illegal: dict[str, int] = field(default_factory=dict)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def __post_init__(self) -> None:
        deal_roles(self.n_players)  # validates n_players
        self.possible_agents = [f"P{i + 1}" for i in range(self.n_players)]
        self.log = MessageLog()
        self.agents: list[str] = []
        self.agent_selection = ""
        self.rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}

    # ----- the AEC API ------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        dealt = deal_roles(self.n_players)
        order = self.rng.permutation(self.n_players)
        self.roles = {p: dealt[int(i)] for p, i in zip(self.possible_agents, order, strict=True)}
        self.alive = list(self.possible_agents)
        self.agents = list(self.possible_agents)
        self.log = MessageLog()
        self.rewards = dict.fromkeys(self.possible_agents, 0.0)
        self.terminations = dict.fromkeys(self.possible_agents, False)
        self.truncations = dict.fromkeys(self.possible_agents, False)
        self.infos = {p: {"role": r, "team": team_of(r)} for p, r in self.roles.items()}
        self.illegal = dict.fromkeys(self.possible_agents, 0)
        self.day, self.winner, self.last_protected = 0, None, None
        players = ", ".join(self.possible_agents)
        self.log.post(REFEREE, f"A game of Werewolf with {self.n_players} players: {players}.")
        wolves = self.living("werewolf")
        for p, role in self.roles.items():
            text = f"You are {p}. Your role: {role} (team {team_of(role)})."
            if role == "werewolf" and len(wolves) > 1:
                text += f" The werewolves are {', '.join(wolves)}."
            self.log.post(REFEREE, text, (p,))
        self._start_night()

    def step(self, action: Move) -> None:
        agent = self.agent_selection
        if self.phase == "over":
            raise EpisodeOverError("the game is over: reset() first")
        reason = self.illegal_reason(agent, action)
        if reason is not None:
            self.illegal[agent] += 1
            self.rewards[agent] += self.illegal_penalty
            self.log.post(REFEREE, f"Illegal move: {reason} {self.prompt_for(agent)}", (agent,))
            return
        self.log.mark_read(agent)
        self.queue.pop(0)
        if action.kind == "kill":
            self.proposals.append((agent, str(action.target)))
            self.log.post(agent, f"I propose to kill {action.target}.", tuple(self.living("werewolf")))
        elif action.kind == "inspect":
            self.inspected = action.target
            verdict = "a werewolf" if self.roles[str(action.target)] == "werewolf" else "not a werewolf"
            self.log.post(REFEREE, f"{action.target} is {verdict}.", (agent,))
        elif action.kind == "protect":
            self.protected = action.target
            self.log.post(REFEREE, f"You protect {action.target} tonight.", (agent,))
        elif action.kind == "speak":
            text = " ".join(action.text.split())[:MAX_SPEECH_CHARS] or "(says nothing)"
            self.log.post(agent, text)
        else:
            self.votes[agent] = str(action.target)
        if not self.queue:
            self._end_phase()
        self._select()

    def prompt_for(self, agent: str) -> str:
        if self.phase == "over":
            return "The game is over."
        targets = ", ".join(self.legal_targets(agent))
        if self.phase == "night":
            kind = NIGHT_MOVES[self.roles[agent]]
            verb = {"kill": "to kill", "inspect": "to inspect", "protect": "to protect"}[kind]
            return f"Night {self.day}: choose a player {verb} with {kind}(player), one of: {targets}."
        if self.phase == "discussion":
            return f"Day {self.day}, discussion: speak to everyone (say(text), or plain text)."
        return f"Day {self.day}, vote: vote(player) to eliminate one of: {targets}."

    # ----- the referee ------------------------------------------------------------------------------------
    def legal_targets(self, agent: str) -> list[str]:
        if self.phase == "night":
            role = self.roles[agent]
            if role == "werewolf":
                return [p for p in self.alive if self.roles[p] != "werewolf"]
            if role == "seer":
                return [p for p in self.alive if p != agent]
            return [p for p in self.alive if p != self.last_protected]
        if self.phase == "vote":
            return [p for p in self.alive if p != agent]
        return []

    def expected_kind(self, agent: str) -> MoveKind:
        if self.phase == "night":
            return NIGHT_MOVES[self.roles[agent]]
        return "speak" if self.phase == "discussion" else "vote"

    def illegal_reason(self, agent: str, move: Move) -> str | None:
        expected = self.expected_kind(agent)
        if move.kind != expected:
            return f"it is not the time to {move.kind}; you must {expected}."
        if expected == "speak":
            return None
        if move.target not in self.legal_targets(agent):
            if move.target not in self.possible_agents:
                return f"{move.target!r} is not a player."
            if move.target not in self.alive:
                return f"{move.target} is dead."
            if expected == "protect":
                return f"you protected {move.target} last night."
            return f"you cannot {expected} {move.target}."
        return None

    # ----- phases -----------------------------------------------------------------------------------------
    def living(self, role: str | None = None) -> list[str]:
        return [p for p in self.alive if role is None or self.roles[p] == role]

    def _select(self) -> None:
        self.agent_selection = self.queue[0] if self.queue else ""

    def _start_night(self) -> None:
        self.day += 1
        self.phase = "night"
        self.proposals, self.protected, self.inspected = [], None, None
        self.queue = self.living("werewolf") + self.living("seer") + self.living("doctor")
        self.log.post(REFEREE, f"Night {self.day} falls.")
        self._select()

    def _start_day(self) -> None:
        self.phase = "discussion"
        start = (self.day - 1) % len(self.alive)  # the first speaker rotates each day
        order = self.alive[start:] + self.alive[:start]
        self.queue = order * self.discussion_rounds
        self.log.post(REFEREE, f"Day {self.day}: discussion. Living players: {', '.join(self.alive)}.")

    def _end_phase(self) -> None:
        if self.phase == "night":
            counts = Counter(victim for _, victim in self.proposals)
            top = max(counts.values()) if counts else 0
            victim = next((v for _, v in self.proposals if counts[v] == top), None)
            self.last_protected = self.protected
            if victim is None or victim == self.protected:
                self.log.post(REFEREE, "Dawn: nobody died last night.")
            else:
                self._kill(victim, "was killed in the night")
            if not self._check_winner():
                self._start_day()
        elif self.phase == "discussion":
            self.phase = "vote"
            self.votes = {}
            self.queue = list(self.alive)
            self.log.post(REFEREE, f"Day {self.day}: vote now.")
        elif self.phase == "vote":
            tally = Counter(self.votes.values())
            shown = ", ".join(f"{v}->{t}" for v, t in self.votes.items())
            self.log.post(REFEREE, f"Votes: {shown}.")
            top = max(tally.values())
            leaders = [p for p, c in tally.items() if c == top]
            if len(leaders) == 1:
                self._kill(leaders[0], f"was eliminated by the vote ({top} votes)")
            else:
                self.log.post(REFEREE, "The vote is tied: nobody is eliminated.")
            if not self._check_winner():
                if self.day >= self.max_days:
                    self._finish("draw")
                else:
                    self._start_night()

    def _kill(self, player: str, how: str) -> None:
        self.alive.remove(player)
        self.agents.remove(player)
        self.log.post(REFEREE, f"{player} {how}. {player} was a {self.roles[player]}.")

    def _check_winner(self) -> bool:
        wolves = len(self.living("werewolf"))
        if wolves == 0:
            self._finish("village")
        elif wolves * 2 >= len(self.alive):
            self._finish("werewolves")
        return self.winner is not None

    def _finish(self, winner: str) -> None:
        self.winner, self.phase, self.queue = winner, "over", []
        text = (
            "The game is a draw."
            if winner == "draw"
            else f"The {winner} {'wins' if winner == 'village' else 'win'}."
        )
        roles = ", ".join(f"{p}={r}" for p, r in self.roles.items())
        self.log.post(REFEREE, f"{text} Roles: {roles}.")
        for p, role in self.roles.items():
            self.rewards[p] += float(team_of(role) == winner)
            self.terminations[p] = winner != "draw"
            self.truncations[p] = winner == "draw"
        self.agents = []
