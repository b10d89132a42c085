"""Self-play's ``rollout/env_errors`` and ``rollout/server_errors`` count the learner paths a lost turn ended,
``TreeRollout``'s unit: exactly the ``env_error`` leaves of the forest (was: every learner seat of a lost
table, also those never asked for a turn there, which have no path)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.trainers.conftest import fail_turn_once, tiny_model, tiny_tokenizer
from toolgym.trainers.rollout import RolloutConfig, RolloutTask
from toolgym.trainers.selfplay import SelfPlayRollout
from toolgym.trainers.tree import env_error, flatten

ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}


def _engine_policy(slots: int = 16) -> Any:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 8192
    return EnginePolicy(model, tok, slots=slots, capacity=8192)


def _lost_leaves(forest: list[Any]) -> list[tuple[Any, int]]:
    return [(t, leaf) for t in forest for leaf in t.leaves() if env_error(t, leaf)]


@pytest.mark.parametrize(("which", "at"), [("learner", 1), ("learner", 9), ("frozen", 1), ("frozen", 4)])
def test_errors_count_the_env_error_leaves(which: str, at: int) -> None:
    """Wherever the lost turn falls (a learner's first turn, a frozen seat's turn before or after the learners
    played), the counters are the lost table's env_error leaves: its learner seats never asked for a turn are
    not counted."""
    live = _engine_policy()
    cfg = RolloutConfig(budget=2, max_new_tokens=4, max_total_tokens=3000)
    options = {"learner_seats": 2, "frozen_seats": 1, "others": "basic", "max_turns_per_seat": 3}
    roller = SelfPlayRollout(live, cfg, SMALL, options)
    try:
        seen = fail_turn_once((roller.frozen if which == "frozen" else live).engine, at)
        forest, stats = roller.run([RolloutTask(ENV, 0), RolloutTask(ENV, 1)], seed=0)
        assert seen["seq"] is not None  # the fault happened
        lost = _lost_leaves(forest)
        assert stats.env_errors == stats.server_errors == len(lost) < 2  # the table has 2 learner seats
        rows = flatten(forest)
        assert len(rows) == sum(len(t.leaves()) for t in forest) - len(lost)  # a lost path has no row
    finally:
        roller.close()


def test_a_learner_turn_lost_on_its_first_turn_is_one_path() -> None:
    """The lost turn is a learner seat's first: that path ends (an empty last turn, no row), counted once, as
    ``TreeRollout`` counts a lost first turn; the table's other learner seat, not asked yet, is not counted
    (was: 2, and no leaf at all)."""
    live = _engine_policy()
    cfg = RolloutConfig(budget=1, max_new_tokens=4, max_total_tokens=3000)
    options = {"learner_seats": 2, "others": "basic", "max_turns_per_seat": 3}
    roller = SelfPlayRollout(live, cfg, SMALL, options)
    try:
        fail_turn_once(live.engine, at=1)
        forest, stats = roller.run([RolloutTask(ENV, 0)], seed=0)
        lost = _lost_leaves(forest)
        assert stats.env_errors == stats.server_errors == len(lost) == 1
        tree, leaf = lost[0]
        node = tree.nodes[leaf]
        assert node.kind == "model" and node.token_ids == [] and node.info["episode"]["turns"] == 0
        assert "injected" in node.info["infra_error"] and node.reward == 0.0
        assert flatten(forest) == []  # one table, lost on its first turn: nothing to train on
    finally:
        roller.close()
