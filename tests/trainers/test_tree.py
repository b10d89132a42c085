from __future__ import annotations

import pytest

from toolgym.trainers.tree import RolloutTree, flatten, leaf_rewards, row_turns


def test_flatten_repeat(tree3: RolloutTree) -> None:
    rows = flatten([tree3])
    assert [r.leaf for r in rows] == [3, 4, 5]
    assert rows[0].token_ids == [1, 2, 3, 4, 5, 6]
    assert rows[0].loss_mask == [0, 0, 1, 1, 0, 1]
    assert rows[1].token_ids == [1, 2, 3, 4, 5, 7, 8]
    assert rows[1].loss_mask == [0, 0, 1, 1, 0, 1, 1]
    assert rows[1].node_ids == [0, 0, 1, 1, 2, 4, 4]
    assert rows[1].turn_ids == [-1, -1, 0, 0, 0, 1, 1]
    assert rows[1].logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.4, -0.5]
    assert rows[2].token_ids == [1, 2, 9] and rows[2].loss_mask == [0, 0, 1]
    assert leaf_rewards([tree3], rows) == [1.0, 0.0, 1.0]


def test_flatten_once_trains_shared_prefix_once(tree3: RolloutTree) -> None:
    rows = flatten([tree3], shared="once")
    assert rows[0].loss_mask == [0, 0, 1, 1, 0, 1]
    assert rows[1].loss_mask == [0, 0, 0, 0, 0, 1, 1]  # A already trained in row 0
    assert rows[2].loss_mask == [0, 0, 1]


def test_row_turns(tree3: RolloutTree) -> None:
    rows = flatten([tree3])
    turns = row_turns(tree3, rows[0])
    assert [(t.index, t.state_key, t.step_reward, t.nodes) for t in turns] == [
        (0, "s0", 0.0, (1,)),
        (1, "s1", 1.0, (3,)),
    ]


def test_split_keeps_paths_and_moves_rewards() -> None:
    t = RolloutTree("q", [1])
    a = t.add(t.root, "model", [2, 3, 4], turn=0, logprobs=[-1.0, -2.0, -3.0], step_reward=0.5)
    t.set_reward(a, 1.0)
    assert t.split(a, 1) == a
    tail = t.nodes[a].children[0]
    assert t.nodes[a].token_ids == [2] and t.nodes[tail].token_ids == [3, 4]
    assert t.nodes[tail].logprobs == [-2.0, -3.0] and t.nodes[tail].reward == 1.0
    assert t.nodes[tail].step_reward == 0.5 and t.nodes[a].step_reward == 0.0
    b = t.add(a, "model", [9], turn=0, branch_reason="token")
    assert t.leaves() == [tail, b]
    assert t.prefix_ids(b) == [1, 2, 9] and t.prefix_ids(a, 1) == [1, 2]
    assert t.branch_count() == 1
    assert [r.token_ids for r in flatten([t])] == [[1, 2, 3, 4], [1, 2, 9]]
    with pytest.raises(ValueError):
        t.split(a, 5)


def test_missing_reward_is_reported() -> None:
    t = RolloutTree("q", [1])
    t.add(t.root, "model", [2], turn=0)
    with pytest.raises(ValueError, match="has no reward"):
        leaf_rewards([t], flatten([t]))


def test_logprob_length_checked() -> None:
    t = RolloutTree("q", [1])
    with pytest.raises(ValueError, match="logprobs"):
        t.add(t.root, "model", [2, 3], logprobs=[-1.0])
