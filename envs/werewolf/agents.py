"""Scripted Werewolf players of three strengths, each a function of what its player may know.

A policy sees an ``AgentView``: its own role, the public state, and the messages visible to its player (read
back from the game's log, the same text an LLM seat reads), never the hidden roles. Claims in speeches are
read with the phrases the scripted players use ("I am the seer.", "P3 is a werewolf.", "P4 is innocent.",
"I suspect P5."), so an LLM that speaks them is understood too.

- ``random``: uniformly random legal moves, an empty speech.
- ``basic``: a seer that reveals a werewolf it found, villagers that vote for players the seer accused,
  werewolves that never accuse each other; otherwise random.
- ``strong`` (the expert): all of ``basic``, plus coordination without talk: every player breaks ties by
  seat, so a side's votes land together. The seer reveals everything from day 1 on; the doctor protects a
  claimed seer; villagers trust a seer claim, doubt a later counter-claim and whoever doubts the seer, and
  read the revealed votes; werewolves kill a claimed seer first, follow the first wolf's night proposal,
  say nothing that stands out and vote for the village's own top suspect among the villagers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from toolgym.envs.multiagent.api import REFEREE
from toolgym.envs.werewolf.rules import Move, WerewolfGame

Policy = Callable[["AgentView", np.random.Generator], Move]

_INSPECTED = re.compile(r"^(P\d+) is (a werewolf|not a werewolf)\.$")
_REVEALED = re.compile(r"(P\d+) was a (\w+)\.")
_ACCUSE = re.compile(r"\b(P\d+) is a werewolf\b", re.I)
_CLEAR = re.compile(r"\b(P\d+) is (?:innocent|not a werewolf)\b", re.I)
_SUSPECT = re.compile(r"\bI suspect (P\d+)\b", re.I)
_PROPOSE = re.compile(r"I propose to kill (P\d+)")
_VOTE = re.compile(r"(P\d+)->(P\d+)")
_SEER_CLAIM = re.compile(r"\bI am the seer\b", re.I)


@dataclass
class AgentView:
    me: str
    role: str
    phase: str
    day: int
    alive: list[str]
    legal: list[str]
    wolves: list[str] = field(default_factory=list)  # known werewolves: teammates, or the seer's finds
    cleared: list[str] = field(default_factory=list)  # the seer's players found not werewolves
    revealed: dict[str, str] = field(default_factory=dict)  # dead player -> role
    speeches: list[tuple[int, str, str]] = field(default_factory=list)  # (day, speaker, text)
    proposals: list[str] = field(default_factory=list)  # the wolves' victims proposed tonight
    votes: list[tuple[str, str]] = field(default_factory=list)  # (voter, target) of every day so far

    def claimants(self) -> list[str]:
        """Players who claimed seer, in the order they first did."""
        seen: list[str] = []
        for _, who, text in self.speeches:
            if _SEER_CLAIM.search(text) and who not in seen:
                seen.append(who)
        return seen

    def claims_of(self, speaker: str) -> tuple[set[str], set[str]]:
        accused: set[str] = set()
        cleared: set[str] = set()
        for _, who, text in self.speeches:
            if who == speaker:
                accused.update(_ACCUSE.findall(text))
                cleared.update(_CLEAR.findall(text))
        return accused, cleared


def view_of(game: WerewolfGame, me: str) -> AgentView:
    view = AgentView(me, game.roles[me], game.phase, game.day, list(game.alive), game.legal_targets(me))
    day = 0
    for m in game.history(me):
        if m.sender == REFEREE:
            if m.text.startswith("Night "):
                day, view.proposals = int(m.text.split()[1].rstrip(".")), []
            if m.audience is not None and (hit := _INSPECTED.match(m.text)):
                (view.wolves if hit.group(2) == "a werewolf" else view.cleared).append(hit.group(1))
            view.revealed.update(dict(_REVEALED.findall(m.text)))
            if m.text.startswith("Votes: "):
                view.votes.extend(_VOTE.findall(m.text))
        elif m.audience is None:
            view.speeches.append((day, m.sender, m.text))
        elif hit := _PROPOSE.match(m.text):
            view.proposals.append(hit.group(1))
    if view.role == "werewolf":
        view.wolves = [p for p in game.possible_agents if game.roles[p] == "werewolf"]  # dealt knowledge
    return view


def _pick(options: list[str], rng: np.random.Generator) -> str:
    return options[int(rng.integers(len(options)))]


def random_policy(view: AgentView, rng: np.random.Generator) -> Move:
    if view.phase == "discussion":
        return Move(kind="speak", text="I have nothing to say.")
    kind = (
        {"werewolf": "kill", "seer": "inspect", "doctor": "protect"}[view.role]
        if view.phase == "night"
        else "vote"
    )
    return Move(kind=kind, target=_pick(view.legal, rng))  # type: ignore[arg-type]


def _suspicion(view: AgentView, strong: bool) -> dict[str, float]:
    """How much the player suspects each living other player (village side's reasoning)."""
    score = dict.fromkeys((p for p in view.alive if p != view.me), 0.0)
    for p in view.wolves:
        if p in score:
            score[p] += 100.0
    for p in view.cleared:
        if p in score:
            score[p] -= 100.0
    claimants = view.claimants()
    # a dead claimant revealed as seer told the truth; the first living claimant is trusted over later ones
    trusted = [c for c in claimants if view.revealed.get(c) == "seer"]
    if not trusted:
        trusted = [c for c in claimants if c not in view.revealed][:1]
    for c in trusted:
        if c in score and view.role != "seer":
            score[c] -= 10.0  # the village keeps its seer
        accused, cleared = view.claims_of(c)
        for p in accused & score.keys():
            score[p] += 10.0
        for p in cleared & score.keys():
            score[p] -= 10.0
    if strong:
        for c in claimants:
            if c not in trusted and c in score and view.role != "seer":
                score[c] += 5.0  # a counter-claim: one of two seers lies
        for d, who, text in view.speeches:
            for p in _SUSPECT.findall(text):
                if d == view.day and p in score:
                    score[p] += 0.5
                if p in trusted and who in score:
                    score[who] += 2.0  # doubting the seer is what a werewolf does
        for voter, target in view.votes:  # who voted for a revealed villager, or against a werewolf
            if voter in score and target in view.revealed:
                score[voter] += -1.0 if view.revealed[target] == "werewolf" else 1.0
            if voter in score and any(target == c or target in view.claims_of(c)[1] for c in trusted):
                score[voter] += 3.0  # a vote against the seer or a player it cleared
    return score


def _village(view: AgentView, rng: np.random.Generator, strong: bool) -> Move:
    if view.phase == "night":
        if view.role == "seer":
            unknown = [p for p in view.legal if p not in view.wolves and p not in view.cleared] or view.legal
            if strong:  # inspect the most suspicious of the unknown
                score = _suspicion(view, True)
                top = max(score[p] for p in unknown)
                unknown = [p for p in unknown if score[p] == top]
            return Move(kind="inspect", target=_pick(unknown, rng))
        claimed = [c for c in view.claimants() if c in view.legal and c != view.me]
        if strong and claimed:
            return Move(kind="protect", target=claimed[0])
        if strong and view.me in view.legal:
            return Move(kind="protect", target=view.me)
        return Move(kind="protect", target=_pick(view.legal, rng))
    score = _suspicion(view, strong)
    if view.phase == "discussion":
        if view.role == "seer" and (view.wolves or (strong and view.cleared)):
            found = [f"{p} is a werewolf." for p in view.wolves] + [f"{p} is innocent." for p in view.cleared]
            return Move(kind="speak", text="I am the seer. " + " ".join(found))
        top = max(score.values())
        if top > 0:
            return Move(kind="speak", text=f"I suspect {min(p for p, s in score.items() if s == top)}.")
        return Move(kind="speak", text="I have no information yet.")
    top = max(score[p] for p in view.legal)
    best = [p for p in view.legal if score[p] == top]
    return Move(kind="vote", target=best[0] if strong else _pick(best, rng))


def _wolf(view: AgentView, rng: np.random.Generator, strong: bool) -> Move:
    villagers = [p for p in view.alive if p not in view.wolves]
    claimants = [c for c in view.claimants() if c in villagers]
    if view.phase == "night":
        if strong and view.proposals:
            return Move(kind="kill", target=view.proposals[0])
        targets = [c for c in claimants if c in view.legal] if strong else []
        return Move(kind="kill", target=(targets or [_pick(view.legal, rng)])[0])
    legal = [p for p in view.legal if p in villagers]
    if not strong:
        if view.phase == "discussion":
            return Move(kind="speak", text=f"I suspect {(claimants or [_pick(villagers, rng)])[0]}.")
        return Move(kind="vote", target=_pick(legal, rng))
    # strong: blend in. Reason as a villager would (without the wolves' knowledge) and add weight to the
    # village's own top suspect among the non-wolves; every wolf computes the same, so their votes land together
    mask = AgentView(
        view.me,
        "villager",
        view.phase,
        view.day,
        view.alive,
        view.legal,
        [],
        [],
        view.revealed,
        view.speeches,
        [],
        view.votes,
    )
    score = _suspicion(mask, True)
    if view.phase == "discussion":
        return Move(kind="speak", text="I have no information yet.")
    top = max(score[p] for p in legal)
    return Move(kind="vote", target=next(p for p in legal if score[p] == top))


def basic_policy(view: AgentView, rng: np.random.Generator) -> Move:
    return _wolf(view, rng, False) if view.role == "werewolf" else _village(view, rng, False)


def strong_policy(view: AgentView, rng: np.random.Generator) -> Move:
    return _wolf(view, rng, True) if view.role == "werewolf" else _village(view, rng, True)


POLICIES: dict[str, Policy] = {"random": random_policy, "basic": basic_policy, "strong": strong_policy}


def play_out(
    game: WerewolfGame, seats: dict[str, str], rng: np.random.Generator, max_moves: int = 2000
) -> int:
    """Play the game to its end, each player with the policy named in ``seats`` (player -> strength);
    returns the number of moves played."""
    for moves in range(max_moves):
        if game.phase == "over":
            return moves
        agent = game.agent_selection
        game.step(POLICIES[seats[agent]](view_of(game, agent), rng))
    raise RuntimeError("a scripted game did not end")


def suspects(view: AgentView) -> list[str]:
    """The living other players from most to least suspected, as the strong player reasons: a village player
    by its own suspicion (a seer's finds first); a werewolf by the village's reasoning among non-wolves (the
    player it would push the village toward). Ties break by seat. LSPO fills a latent strategy's named
    players from this ranking (``toolgym.trainers.lspo.game``)."""
    if view.role == "werewolf":
        mask = AgentView(
            view.me, "villager", view.phase, view.day, view.alive, view.legal, [], [], view.revealed,
            view.speeches, [], view.votes,
        )  # fmt: skip
        score = {p: s for p, s in _suspicion(mask, True).items() if p not in view.wolves}
    else:
        score = _suspicion(view, True)
    return sorted(score, key=lambda p: (-score[p], int(p[1:])))
