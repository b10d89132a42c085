"""Kuhn poker: the CFR solver's known test game (its equilibrium value for player 0 is -1/18).

Three cards (J=0, Q=1, K=2), one to each player, ante 1; player 0 acts first: check (p) or bet (b); a bet is
called (b) or folded (p). Histories are (cards, actions) with the actions as a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations
from typing import Any

import numpy as np

GAME_VALUE = -1.0 / 18.0
_DEALS = list(permutations(range(3), 2))
_TERMINAL = ("pp", "bb", "bp", "pbp", "pbb")


class Kuhn:
    def root(self) -> Any:
        return (None, "")

    def chance(self, h: Any) -> Sequence[tuple[Any, float]] | None:
        return [(d, 1 / 6) for d in _DEALS] if h[0] is None else None

    def terminal(self, h: Any) -> bool:
        return h[1] in _TERMINAL

    def utility(self, h: Any) -> float:
        (c0, c1), a = h
        if a in ("bp",):
            return 1.0  # player 1 folded
        if a == "pbp":
            return -1.0  # player 0 folded
        stake = 2.0 if "b" in a else 1.0
        return stake if c0 > c1 else -stake

    def player(self, h: Any) -> int:
        return len(h[1]) % 2

    def info(self, h: Any) -> Any:
        return (h[0][self.player(h)], h[1])

    def actions(self, h: Any) -> Sequence[str]:
        return ("p", "b")

    def next(self, h: Any, a: Any) -> Any:
        return (a, "") if h[0] is None else (h[0], h[1] + a)


class KuhnEpisode:
    """Kuhn poker played forward (for outcome sampling): the deal is drawn at the start."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.game = Kuhn()
        self.h = (_DEALS[int(rng.integers(len(_DEALS)))], "")

    def decision(self) -> tuple[int, Any, int] | None:
        if self.game.terminal(self.h):
            return None
        return self.game.player(self.h), self.game.info(self.h), 2

    def act(self, action: int) -> None:
        self.h = self.game.next(self.h, "pb"[action])

    def utility(self, side: int) -> float:
        u = self.game.utility(self.h)
        return u if side == 0 else -u
