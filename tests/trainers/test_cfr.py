"""The CFR solver on Kuhn poker: exploitability falls to ~0 and the value is the known -1/18."""

from __future__ import annotations

import numpy as np
import pytest

from toolgym.trainers.lspo.cfr import best_response_value, cfr, exploitability, outcome_sampling
from toolgym.trainers.lspo.kuhn import GAME_VALUE, Kuhn, KuhnEpisode


def test_uniform_strategy_is_exploitable() -> None:
    assert exploitability(Kuhn(), {}) > 0.4  # the uniform strategy, hand-checked in the literature: 0.458


def test_vanilla_cfr_converges_on_kuhn() -> None:
    game = Kuhn()
    table = cfr(game, 4000)
    sigma = table.policy()
    assert exploitability(game, sigma) < 0.005  # ~1/sqrt(T): 0.0107 at 500, 0.0053 at 2000, 0.0037 at 4000
    # the value of the average strategy profile is the game's value; player 0's best response gains ~0
    assert best_response_value(game, sigma, 0) == pytest.approx(GAME_VALUE, abs=0.01)
    # a known equilibrium fact: player 1 holding the king always calls a bet
    assert table.average((2, "b"))[1] == pytest.approx(1.0, abs=0.01)


def test_outcome_sampling_converges_on_kuhn() -> None:
    # one sampled history per iteration: noisier than vanilla CFR (about 0.1 after 1e4, 0.07 after 1e5)
    early = outcome_sampling(KuhnEpisode, 1_000, np.random.default_rng(0))
    table = outcome_sampling(KuhnEpisode, 30_000, np.random.default_rng(0))
    assert exploitability(Kuhn(), table.policy()) < min(0.1, exploitability(Kuhn(), early.policy()))


def test_one_cfr_iteration_keeps_sigma_fixed() -> None:
    """σ^t is fixed within an iteration: from zero regrets every information set plays uniform in iteration 1,
    in each of its histories, so σ̄ after one iteration is uniform everywhere (updating regrets mid-iteration
    made the second history of an information set play a different strategy)."""
    table = cfr(Kuhn(), 1)
    assert len(table.sums) == 12
    for key in table.sums:
        assert table.average(key) == pytest.approx([0.5, 0.5])


class TwoMoves:
    """Side 0 decides twice (infosets "a" then "b"), side 1 never; side 0 gets +1 when its second move is 1."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.moves: list[int] = []

    def decision(self) -> tuple[int, str, int] | None:
        return (0, "ab"[len(self.moves)], 2) if len(self.moves) < 2 else None

    def act(self, action: int) -> None:
        self.moves.append(action)

    def utility(self, side: int) -> float:
        return float(self.moves[1] == 1) if side == 0 else -float(self.moves[1] == 1)


def test_outcome_sampling_updates_decisions_after_a_zero_probability_action() -> None:
    """Exploration samples actions σ gives 0; the traverser's later decisions still get their regrets (their
    counterfactual values do not depend on the traverser's own reach). Before the fix their tail reach was
    computed as 0/0 -> 0 and they learned nothing."""
    from toolgym.trainers.lspo.cfr import RegretTable

    table = RegretTable()
    table.current("a", 2)
    table.regrets["a"][:] = [1.0, 0.0]  # σ(a) = [1, 0]: action 1 at "a" has probability 0
    rng = np.random.default_rng(0)
    for _ in range(200):
        table = outcome_sampling(
            TwoMoves, 1, rng, epsilon=1.0, table=table
        )  # uniform sampling: "a"=1 happens
    assert table.regrets["b"][1] > 0 > table.regrets["b"][0]
    assert table.current("b", 2)[1] == 1.0
    # one iteration by hand: both moves sampled 1 (probability 1/4 each step with ε = 1), u = 1, σ(b) uniform
    while True:
        t = RegretTable()
        t.current("a", 2)
        t.regrets["a"][:] = [1.0, 0.0]
        t = outcome_sampling(TwoMoves, 1, np.random.default_rng(int(rng.integers(2**31))), 1.0, t)
        if t.regrets["a"][1] != 0:  # "a" sampled 1 (σ = 0 there) and "b" sampled 1 (u = 1)
            break
    # W = u / π^{σ'}(z) = 1 / (1/2 * 1/2) = 4; "b": tail 1, σ(b)=[.5,.5]: +4 * 0.5 on 1, -4 * 0.5 on 0
    assert t.regrets["b"] == pytest.approx([-2.0, 2.0])
