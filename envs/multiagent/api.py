"""The multi-agent env API: PettingZoo's AEC (agent-environment cycle) shape, for text games.

Why AEC and not PettingZoo's parallel API or GEM's multi-agent env: the games here (Werewolf) are turn-based
with a speaking order, and toolgym's runner generates one model turn at a time. AEC names the one agent that
acts next (``agent_selection``), so turn order is part of the API and one policy (or one LLM seat) answers
exactly one request per step; a phase where actions are simultaneous (votes, night actions) is still asked
one agent at a time and revealed together by the game. The parallel API would force every phase into a
joint action and make a speaking order awkward; GEM's multi-agent env is a thin dict-of-agents step with
no turn order. PettingZoo itself is not a dependency (the API is a handful of methods and its package pulls
in gymnasium pins of its own); the names follow it so a PettingZoo user reads this at once:
``possible_agents``, ``agents``, ``agent_selection``, ``reset(seed=)``, ``observe(agent)``, ``step(action)``,
``last()``, ``agent_iter()``, and the per-agent dicts ``rewards``, ``terminations``, ``truncations``,
``infos``.

Departures from PettingZoo, on purpose: an agent that is out of the game (a dead Werewolf player) is never
selected again and needs no ``None`` step; ``observe(agent)`` returns the messages that agent has not yet
acted on (text games are read incrementally, like a ToolEnv step's observation), and ``history(agent)`` all
of them. Messages are public (``audience=None``) or private to a set of agents. An illegal action is the
referee's business: ``step`` never raises for it; the same agent stays selected, receives the rejection as
a private message and a penalty in ``rewards``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from toolgym.errors import EpisodeOverError

ActionT = TypeVar("ActionT")

REFEREE = "referee"


@dataclass(frozen=True)
class GameMessage:
    """One line of the game: who said it, who may read it (None: everyone), and the text."""

    sender: str
    text: str
    audience: tuple[str, ...] | None = None

    def visible_to(self, agent: str) -> bool:
        return self.audience is None or agent in self.audience

    def render(self) -> str:
        where = "" if self.audience is None else " (private)"
        return f"{self.sender}{where}: {self.text}"


@dataclass
class MessageLog:
    """Every message of a game, and per agent the index up to which it has acted on them."""

    messages: list[GameMessage] = field(default_factory=list)
    cursors: dict[str, int] = field(default_factory=dict)

    def post(self, sender: str, text: str, audience: tuple[str, ...] | None = None) -> None:
        self.messages.append(GameMessage(sender, text, audience))

    def unread(self, agent: str) -> list[GameMessage]:
        start = self.cursors.get(agent, 0)
        return [m for m in self.messages[start:] if m.visible_to(agent)]

    def seen_by(self, agent: str) -> list[GameMessage]:
        return [m for m in self.messages if m.visible_to(agent)]

    def mark_read(self, agent: str) -> None:
        self.cursors[agent] = len(self.messages)


class MultiAgentEnv(ABC, Generic[ActionT]):
    """A turn-based multi-agent game (AEC). A subclass implements ``reset``, ``step`` and ``prompt_for``
    and keeps ``agent_selection``, the per-agent dicts and ``log`` up to date."""

    possible_agents: list[str]
    agents: list[str]  # the agents still in the game
    agent_selection: str
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]
    log: MessageLog

    @abstractmethod
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start a game; ``seed`` fixes everything random in it."""

    @abstractmethod
    def step(self, action: ActionT) -> None:
        """Apply ``agent_selection``'s action (the referee rejects an illegal one: never raises for it) and
        select the next agent."""

    @abstractmethod
    def prompt_for(self, agent: str) -> str:
        """What the agent is asked to do now (its legal actions), as text."""

    @property
    def done(self) -> bool:
        return all(
            self.terminations.get(a, False) or self.truncations.get(a, False) for a in self.possible_agents
        )

    def observe(self, agent: str) -> list[GameMessage]:
        """The messages ``agent`` may read that arrived since it last acted."""
        return self.log.unread(agent)

    def history(self, agent: str) -> list[GameMessage]:
        return self.log.seen_by(agent)

    def last(self) -> tuple[list[GameMessage], float, bool, bool, dict[str, Any]]:
        """The selected agent's observation, its reward so far, whether it is done, and its info."""
        agent = self.agent_selection
        return (
            self.observe(agent),
            self.rewards[agent],
            self.terminations[agent],
            self.truncations[agent],
            self.infos[agent],
        )

    def agent_iter(self, max_iter: int = 10_000) -> Iterator[str]:
        """The agent to act next, until the game ends (or ``max_iter`` turns)."""
        for _ in range(max_iter):
            if self.done:
                return
            yield self.agent_selection
        if not self.done:
            raise EpisodeOverError(f"the game did not end within {max_iter} turns")
