"""Counterfactual regret minimisation: vanilla CFR on a game tree, outcome-sampling Monte-Carlo CFR on a
game that can only be played forward (the abstracted Werewolf game), and exact exploitability of a
two-player zero-sum tree game (the solver's test: Kuhn poker, ``kuhn.py``).

For player i, information set I and action a, with σ^t the strategy at iteration t and π the reach
probabilities (π_i: i's own actions, π_{-i}: chance's and the others'):

    R^T(I, a) = Σ_t π_{-i}^{σ^t}(I) (v_i(σ^t_{I→a}, I) − v_i(σ^t, I))       counterfactual regret
    σ^{T+1}(I, a) = R^T_+(I, a) / Σ_b R^T_+(I, b)   (uniform when every R_+ is 0)   regret matching
    σ̄^T(I, a) ∝ Σ_t π_i^{σ^t}(I) σ^t(I, a)                                   the average strategy

σ̄ converges to a Nash equilibrium in two-player zero-sum games of perfect recall (Zinkevich et al. 2007).
Outcome sampling (Lanctot et al. 2009) samples one terminal history z per iteration, the traverser's actions
from σ' = ε·uniform + (1−ε)·σ and everyone else's from σ, and updates the traverser's regrets along z with
the importance-weighted sampled values: with W = u_i(z) / π_i^{σ'}(z) and the traverser's tail reach
π_i^σ(z | h·a) after the sampled action a at h ∈ I,

    R(I, a) += W π_i^σ(z|h·a) (1 − σ(a|I)),      R(I, b) −= W π_i^σ(z|h·a) σ(a|I)  for b ≠ a,

and the average strategy gets σ(I, ·) weighted by π_i^σ(h) / (π_i^{σ'}(h) π_{-i}^σ(h)), the inverse of the
probability that h was sampled (stochastically weighted averaging). Chance is left out of that weight: it is
the same for every iteration that reaches h, and unknown where chance is a scripted player's generator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class TreeGame(Protocol):
    """A finite two-player zero-sum game tree; histories are hashable values, ``utility`` is player 0's."""

    def root(self) -> Any: ...
    def terminal(self, h: Any) -> bool: ...
    def utility(self, h: Any) -> float: ...
    def chance(self, h: Any) -> Sequence[tuple[Any, float]] | None: ...  # (action, probability) or None
    def player(self, h: Any) -> int: ...
    def info(self, h: Any) -> Hashable: ...
    def actions(self, h: Any) -> Sequence[Any]: ...
    def next(self, h: Any, a: Any) -> Any: ...


class Episode(Protocol):
    """One play of a game that only runs forward (its chance events drawn inside)."""

    def decision(self) -> tuple[int, Hashable, int] | None:
        """(acting side 0/1, information set, number of actions), or None when the game is over."""

    def act(self, action: int) -> None: ...
    def utility(self, side: int) -> float: ...


@dataclass
class RegretTable:
    """Cumulative regrets and average-strategy sums per information set."""

    regrets: dict[Hashable, np.ndarray] = field(default_factory=dict)
    sums: dict[Hashable, np.ndarray] = field(default_factory=dict)
    visits: dict[Hashable, int] = field(default_factory=lambda: defaultdict(int))

    def _ensure(self, key: Hashable, n: int) -> None:
        if key not in self.regrets:
            self.regrets[key] = np.zeros(n)
            self.sums[key] = np.zeros(n)

    def current(self, key: Hashable, n: int) -> np.ndarray:
        """Regret matching: σ(I) ∝ R_+(I), uniform when no regret is positive."""
        self._ensure(key, n)
        pos = np.maximum(self.regrets[key], 0.0)
        total = pos.sum()
        return pos / total if total > 0 else np.full(n, 1.0 / n)

    def average(self, key: Hashable, n: int | None = None) -> np.ndarray:
        """σ̄(I): the normalised strategy sums (uniform when I was never reached)."""
        if key not in self.sums:
            if n is None:
                raise KeyError(key)
            return np.full(n, 1.0 / n)
        s = self.sums[key]
        return s / s.sum() if s.sum() > 0 else np.full(len(s), 1.0 / len(s))

    def reached(self, key: Hashable) -> bool:
        """Whether σ̄(I) was averaged at all: a set seen only as another side's decision (regret matching
        creates its row) or reached only with own reach 0 has no average, and σ̄ there is uniform by default."""
        return key in self.sums and bool(self.sums[key].sum() > 0)

    def policy(self) -> dict[Hashable, list[float]]:
        """σ̄ of every reached information set (the others are uniform: leave them out)."""
        return {k: self.average(k).tolist() for k in self.sums if self.reached(k)}


# ----- vanilla CFR on a tree -------------------------------------------------------------------------------
def cfr(game: TreeGame, iterations: int) -> RegretTable:
    """Vanilla CFR (simultaneous updates of both players); returns the table (``average`` is σ̄)."""
    table = RegretTable()
    # σ^t is fixed for the whole of iteration t: an information set reached through several histories (Kuhn:
    # one per opponent card) must see the same σ^t in each, so the regrets of an iteration are added at its end
    strategy: dict[Hashable, np.ndarray] = {}
    delta: dict[Hashable, np.ndarray] = {}

    def walk(h: Any, reach: np.ndarray) -> np.ndarray:
        """Expected utilities (player 0, player 1) of h under σ^t; updates regrets on the way back."""
        if game.terminal(h):
            u = game.utility(h)
            return np.array([u, -u])
        outcomes = game.chance(h)
        if outcomes is not None:
            return sum(
                (p * walk(game.next(h, a), reach * np.array([p, p])) for a, p in outcomes), np.zeros(2)
            )
        i, key, acts = game.player(h), game.info(h), list(game.actions(h))
        if key not in strategy:
            strategy[key] = table.current(key, len(acts))
            delta[key] = np.zeros(len(acts))
        sigma = strategy[key]
        values = np.zeros((len(acts), 2))
        for j, a in enumerate(acts):
            r = reach.copy()
            r[i] *= sigma[j]
            values[j] = walk(game.next(h, a), r)
        v = sigma @ values
        other = reach[1 - i]  # π_{-i}: chance is folded into both entries of reach
        delta[key] += other * (values[:, i] - v[i])
        table.sums[key] += reach[i] * sigma
        return v

    for _ in range(iterations):
        strategy.clear()
        delta.clear()
        walk(game.root(), np.ones(2))
        for key, d in delta.items():
            table.regrets[key] += d
    return table


def best_response_value(game: TreeGame, strategy: dict[Hashable, Sequence[float]], br: int) -> float:
    """The value to player ``br`` of a best response to the other player's ``strategy`` (info -> probs)."""
    at_info: dict[Hashable, list[tuple[Any, float]]] = defaultdict(list)

    def collect(h: Any, reach: float) -> None:
        if game.terminal(h):
            return
        outcomes = game.chance(h)
        if outcomes is not None:
            for a, p in outcomes:
                collect(game.next(h, a), reach * p)
            return
        acts = list(game.actions(h))
        if game.player(h) == br:
            at_info[game.info(h)].append((h, reach))
            for a in acts:
                collect(game.next(h, a), reach)
        else:
            probs = strategy.get(game.info(h), [1.0 / len(acts)] * len(acts))
            for a, p in zip(acts, probs, strict=True):
                collect(game.next(h, a), reach * p)

    choice: dict[Hashable, int] = {}

    def value(h: Any) -> float:
        if game.terminal(h):
            u = game.utility(h)
            return u if br == 0 else -u
        outcomes = game.chance(h)
        if outcomes is not None:
            return sum(p * value(game.next(h, a)) for a, p in outcomes)
        acts = list(game.actions(h))
        if game.player(h) == br:
            return value(game.next(h, acts[choose(game.info(h), acts)]))
        probs = strategy.get(game.info(h), [1.0 / len(acts)] * len(acts))
        return sum(p * value(game.next(h, a)) for a, p in zip(acts, probs, strict=True))

    def choose(key: Hashable, acts: list[Any]) -> int:
        if key not in choice:
            totals = [sum(r * value(game.next(h, a)) for h, r in at_info[key]) for a in acts]
            choice[key] = int(np.argmax(totals))
        return choice[key]

    collect(game.root(), 1.0)
    return value(game.root())


def exploitability(game: TreeGame, strategy: dict[Hashable, Sequence[float]]) -> float:
    """(BR_0(σ_1) + BR_1(σ_0)) / 2: 0 exactly at a Nash equilibrium of a two-player zero-sum game."""
    return (best_response_value(game, strategy, 0) + best_response_value(game, strategy, 1)) / 2


# ----- outcome-sampling MCCFR ------------------------------------------------------------------------------
def outcome_sampling(
    new_episode: Any,
    iterations: int,
    rng: np.random.Generator,
    epsilon: float = 0.6,
    table: RegretTable | None = None,
) -> RegretTable:
    """Outcome-sampling MCCFR (module docstring): ``new_episode(rng)`` deals a fresh ``Episode``; the two sides
    traverse in turn (even iterations side 0). A side is a player or a team (every member's decisions are the
    side's; information sets stay per member)."""
    table = table or RegretTable()
    for t in range(iterations):
        side = t % 2
        ep: Episode = new_episode(rng)
        # per traverser decision: (key, sampled action, σ(I), own reach under σ before it)
        trail: list[tuple[Hashable, int, np.ndarray, float]] = []
        own_sigma, own_sample, others = 1.0, 1.0, 1.0  # π_i^σ, π_i^{σ'} and π_{-i}^σ (chance left out) so far
        while (d := ep.decision()) is not None:
            who, key, n = d
            sigma = table.current(key, n)
            table.visits[key] += 1
            if who == side:
                sample = epsilon / n + (1 - epsilon) * sigma
                a = int(rng.choice(n, p=sample))
                table.sums[key] += own_sigma / (own_sample * others) * sigma
                trail.append((key, a, sigma, own_sigma))
                own_sigma *= sigma[a]
                own_sample *= sample[a]
            else:
                a = int(rng.choice(n, p=sigma))
                others *= sigma[a]
            ep.act(a)
        w = ep.utility(side) / own_sample
        tail = 1.0  # π_i^σ(z | h·a): the product of σ over the traverser's later decisions, built backwards
        # (not own_sigma / π_i^σ(h·a): that is 0/0 after an action σ gives probability 0, which exploration
        # samples, and the later decisions' regrets do not depend on how the traverser got there)
        for key, a, sigma, _ in reversed(trail):
            delta = -w * tail * sigma[a] * np.ones(len(sigma))
            delta[a] = w * tail * (1 - sigma[a])
            table.regrets[key] += delta
            tail *= sigma[a]
    return table
