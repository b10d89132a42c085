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
    table = cfr(game, 2000)
    sigma = table.policy()
    assert exploitability(game, sigma) < 0.005
    # the value of the average strategy profile is the game's value; player 0's best response gains ~0
    assert best_response_value(game, sigma, 0) == pytest.approx(GAME_VALUE, abs=0.01)
    # a known equilibrium fact: player 1 holding the king always calls a bet
    assert table.average((2, "b"))[1] == pytest.approx(1.0, abs=0.01)


def test_outcome_sampling_converges_on_kuhn() -> None:
    # one sampled history per iteration: noisier than vanilla CFR (about 0.1 after 1e4, 0.07 after 1e5)
    early = outcome_sampling(KuhnEpisode, 1_000, np.random.default_rng(0))
    table = outcome_sampling(KuhnEpisode, 30_000, np.random.default_rng(0))
    assert exploitability(Kuhn(), table.policy()) < min(0.1, exploitability(Kuhn(), early.policy()))
