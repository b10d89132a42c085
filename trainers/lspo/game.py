"""The abstracted Werewolf game on a latent space, and the information sets shared with real games.

In the abstracted game every discussion turn is a decision over the speaker's role clusters (its latent
strategies); every other move (night actions, votes) is the ``strong`` scripted player's, which reads the
speeches. A latent strategy is played as its cluster's template with the player names filled from the
speaker's own suspicion ranking (``realise``): "PX is a werewolf" names its top suspect (for a seer, the
werewolf it found), "PX is innocent" its least suspected. So the game is simulated by ``WerewolfGame``
itself, with no LLM in the loop. Two sides, zero-sum: the village (side 0) and the werewolves (side 1) get
+1 for a win, −1 for a loss, 0 for a draw.

Information set of a speaker: (role, day, what it knows privately, the public latent ids of the speeches
heard so far today, last ``memory``), ``info_key``; the same function keys real games' discussion turns
(the LLM's candidates), so the solver's σ̄ applies to them. A seer's private knowledge is whether it found a
werewolf, found only innocents, or nothing yet; the other roles' is nothing beyond the role (a werewolf's
teammates are dealt knowledge the scripted moves use).
"""

from __future__ import annotations

import re
from collections.abc import Hashable

import numpy as np

from toolgym.envs.multiagent.api import REFEREE
from toolgym.envs.werewolf.agents import POLICIES, AgentView, suspects, view_of
from toolgym.envs.werewolf.rules import Move, WerewolfGame
from toolgym.trainers.lspo.space import LatentSpace

_SLOT = re.compile(r"PX(\s+is\s+(?:innocent|not a werewolf))?", re.I)


def realise(template: str, view: AgentView) -> str:
    """A template with its ``PX`` slots filled from the speaker's suspicion ranking (see the module docstring).

    >>> v = AgentView("P1", "seer", "discussion", 1, ["P1", "P2", "P3"], [], wolves=["P3"], cleared=["P2"])
    >>> realise("I am the seer. PX is a werewolf. PX is innocent.", v)
    'I am the seer. P3 is a werewolf. P2 is innocent.'
    """
    ranked = suspects(view) or [view.me]
    top, bottom = list(ranked), list(reversed(ranked))

    def fill(m: re.Match[str]) -> str:
        pool = bottom if m.group(1) else top
        name = pool.pop(0) if len(pool) > 1 else pool[0]
        return name + (m.group(1) or "")

    return _SLOT.sub(fill, template)


def side_of(role: str) -> int:
    return 1 if role == "werewolf" else 0


def today_speeches(game: WerewolfGame, me: str) -> list[tuple[str, str]]:
    """(speaker, text) of today's public speeches so far, as ``me`` saw them."""
    out: list[tuple[str, str]] = []
    for m in game.history(me):
        if m.sender == REFEREE and " discussion." in m.text and m.text.startswith("Day "):
            out = []
        elif m.sender != REFEREE and m.audience is None:
            out.append((m.sender, m.text))
    return out


def info_parts(game: WerewolfGame, me: str) -> tuple[str, int, str, tuple[str, ...]]:
    """What the information set is made of, before the latent space maps the speeches: (role, day, private
    knowledge, the texts of today's speeches heard so far)."""
    view = view_of(game, me)
    private = "-"
    if view.role == "seer":
        found = [w for w in view.wolves if w in view.alive]
        private = "found" if found else ("clear" if view.cleared else "none")
    heard = tuple(t for who, t in today_speeches(game, me) if who != me)
    return (view.role, view.day, private, heard)


def key_of(parts: tuple[str, int, str, tuple[str, ...]], space: LatentSpace, memory: int = 3) -> Hashable:
    """The information set: role, day (3 and later are one), private knowledge, the public latent ids of the
    last ``memory`` speeches heard today."""
    role, day, private, heard = parts
    return (role, min(day, 3), private, tuple(space.public_latent(t) for t in heard)[-memory:])


def info_key(game: WerewolfGame, me: str, space: LatentSpace, memory: int = 3) -> Hashable:
    return key_of(info_parts(game, me), space, memory)


class LatentWerewolf:
    """One abstracted game (an ``Episode`` of ``cfr.outcome_sampling``), dealt from ``rng``."""

    def __init__(
        self, space: LatentSpace, rng: np.random.Generator, n_players: int = 7, max_days: int = 4
    ) -> None:
        self.space = space
        self.rng = np.random.default_rng(int(rng.integers(2**31)))
        self.game = WerewolfGame(n_players=n_players, max_days=max_days)
        self.game.reset(seed=int(rng.integers(2**31)))
        self.scripted = POLICIES["strong"]

    def decision(self) -> tuple[int, Hashable, int] | None:
        g = self.game
        while g.phase != "over":
            agent = g.agent_selection
            if g.phase == "discussion" and g.roles[agent] in self.space.roles:
                role = g.roles[agent]
                return side_of(role), info_key(g, agent, self.space), len(self.space.roles[role])
            g.step(self.scripted(view_of(g, agent), self.rng))
        return None

    def act(self, action: int) -> None:
        g = self.game
        agent = g.agent_selection
        template = self.space.roles[g.roles[agent]][action].template
        g.step(Move(kind="speak", text=realise(template, view_of(g, agent))))

    def utility(self, side: int) -> float:
        winner = self.game.winner
        if winner in (None, "draw"):
            return 0.0
        won = (winner == "werewolves") == (side == 1)
        return 1.0 if won else -1.0


def play_latent(
    space: LatentSpace, strategies: dict[int, dict[Hashable, list[float]]], games: int, seed: int
) -> dict[str, float]:
    """Each side plays its σ̄ (side -> info -> probs; an unknown information set or a side absent: uniform);
    the village's and the werewolves' win rates over ``games`` abstracted games."""
    rng = np.random.default_rng(seed)
    wins = {"village": 0, "werewolves": 0}
    for _ in range(games):
        ep = LatentWerewolf(space, rng)
        while (d := ep.decision()) is not None:
            side, key, n = d
            probs = np.asarray(strategies.get(side, {}).get(key, [1.0 / n] * n), dtype=float)
            ep.act(int(rng.choice(n, p=probs / probs.sum())))
        if ep.game.winner in wins:
            wins[str(ep.game.winner)] += 1
    return {k: v / games for k, v in wins.items()}
