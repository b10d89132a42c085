"""Shared small trees for the trainer tests (numbers written out in the tests)."""

from __future__ import annotations

import pytest

from toolgym.trainers.tree import RolloutTree


def three_leaf_tree() -> RolloutTree:
    """P[1,2] -> A[3,4] (turn 0, s0) -> T[5] (tool) -> B[6] (turn 1, s1, r=1) | C[7,8] (turn 1, s1, r=0)
    P -> D[9] (turn 0, s0, step reward 1, r=1). Ids: P0 A1 T2 B3 C4 D5; leaves B, C, D with R = 1, 0, 1."""
    t = RolloutTree("q0", [1, 2])
    a = t.add(t.root, "model", [3, 4], turn=0, state_key="s0", logprobs=[-0.1, -0.2])
    tool = t.add(a, "tool", [5], turn=0)
    b = t.add(tool, "model", [6], turn=1, state_key="s1", step_reward=1.0, logprobs=[-0.3])
    c = t.add(tool, "model", [7, 8], turn=1, state_key="s1", logprobs=[-0.4, -0.5])
    d = t.add(t.root, "model", [9], turn=0, state_key="s0", step_reward=1.0, logprobs=[-0.6])
    for leaf, r in ((b, 1.0), (c, 0.0), (d, 1.0)):
        t.set_reward(leaf, r)
    return t


@pytest.fixture
def tree3() -> RolloutTree:
    return three_leaf_tree()
