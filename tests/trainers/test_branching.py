"""Branching policies produce the tree shapes they claim, on a deterministic fake policy and env.

Fake episode: model turn k has 3 tokens; turns 0..TURNS-2 end in a tool call (a 1-token tool node
follows), the last turn answers. A turn's per-token entropy is `first` for turn 0 and `later` after.
"""

from __future__ import annotations

import numpy as np
import pytest

from toolgym.errors import ConfigError
from toolgym.trainers.branching import (
    BranchingScore,
    BranchPolicy,
    Fork,
    NoBranching,
    TokenEntropyTopK,
    TurnBoundaryEntropy,
    aepo_global_samples,
    apply_forks,
    make_branch_policy,
    round_entropy,
)
from toolgym.trainers.tree import RolloutTree, flatten

TURNS = 3


def gen(tree: RolloutTree, parent: int, reason: str, first: float, later: float) -> int:
    p = tree.nodes[parent]
    turn = 0 if p.kind == "prompt" else p.turn + (1 if p.kind == "tool" else 0)
    h = first if turn == 0 else later
    return tree.add(parent, "model", [10 * turn + 1] * 3, turn=turn, entropies=[h] * 3,
                    logprobs=[-0.1, -0.2, -0.3], branch_reason=reason)  # fmt: skip


def grow(
    policy: BranchPolicy, budget: int, first: float = 1.0, later: float = 2.0, seed: int = 0
) -> RolloutTree:
    """The engine's loop in miniature: rounds of turns, forks after each round, forks at the end."""
    rng = np.random.default_rng(seed)
    tree = RolloutTree("q", [0])
    pending = [gen(tree, tree.root, "global", first, later) for _ in range(policy.global_samples(budget))]
    finished = 0
    while pending:
        forks = policy.on_turns(tree, pending, budget - finished - len(pending), rng)
        for parent, count, reason in apply_forks(tree, forks):
            pending += [gen(tree, parent, reason, first, later) for _ in range(count)]
        nxt = []
        for n in pending:
            if tree.nodes[n].turn == TURNS - 1:
                tree.set_reward(n, 1.0)
                finished += 1
            else:
                nxt.append(
                    gen(tree, tree.add(n, "tool", [99], turn=tree.nodes[n].turn), "global", first, later)
                )
        pending = nxt
    it = 0
    while forks := policy.on_complete(tree, it, budget - len(tree.leaves()), rng):
        for parent, count, reason in apply_forks(tree, forks):
            for _ in range(count):
                tree.set_reward(
                    tree.add(parent, "model", [7], turn=tree.nodes[parent].turn, branch_reason=reason), 0.0
                )
        it += 1
    return tree


def test_no_branching_is_depth_one() -> None:
    t = grow(NoBranching(), 4)
    assert len(t.leaves()) == 4 and len(t.nodes[t.root].children) == 4
    assert t.branch_count() == 0
    assert all(len(t.path(leaf)) == 1 + 2 * TURNS - 1 for leaf in t.leaves())


def test_arpo_forks_after_each_tool_result_until_the_budget() -> None:
    # entropy rises from 1 to 2 after the first turn: with weight 10, p = U + 10 >= tau always
    pol = TurnBoundaryEntropy(initial=2, beam_size=2, entropy_weight=10.0, consecutive_penalty=0.0)
    t = grow(pol, budget=4)
    assert len(t.leaves()) == 4
    # both global samples forked at their first tool node: prompt -> 2 chains, each tool node has 2 children
    tools = [n for n in t.nodes if n.kind == "tool" and n.turn == 0]
    assert [len(n.children) for n in tools] == [2, 2]
    assert t.branch_count() == 2 and len(t.nodes) == 1 + 2 * (2 + 2 * 3)
    # budget 8: the second tool boundary forks too (4 more leaves)
    t8 = grow(pol, budget=8)
    assert len(t8.leaves()) == 8 and t8.branch_count() == 6


def test_aepo_consecutive_penalty_stops_branching() -> None:
    pol = TurnBoundaryEntropy(initial=2, beam_size=2, entropy_weight=10.0, consecutive_penalty=1.0)
    t = grow(pol, budget=8)  # the second round follows a branching round: multiplier 1 - 1*1 = 0
    assert len(t.leaves()) == 4 and t.meta["consecutive"] == 0


def test_entropy_drop_does_not_fork() -> None:
    pol = TurnBoundaryEntropy(initial=2, entropy_weight=10.0)
    assert len(grow(pol, budget=8, first=2.0, later=1.0).leaves()) == 2


def test_no_stale_initial_entropy_across_batches() -> None:
    """ARPO's code kept H_initial from the first batch; here each tree reads its own first turn."""
    pol = TurnBoundaryEntropy(initial=2, entropy_weight=10.0, consecutive_penalty=0.0)
    assert len(grow(pol, budget=8, first=1.0, later=2.0).leaves()) == 8  # batch 1: entropy rises
    assert len(grow(pol, budget=8, first=3.0, later=2.0).leaves()) == 2  # batch 2: it falls, no fork


def test_turn_entropy_is_reproducible_by_seed() -> None:
    pol = TurnBoundaryEntropy(initial=4, entropy_weight=0.0)  # pure U(0,1) vs tau
    shapes = [len(grow(pol, 16, seed=s).nodes) for s in (1, 1, 2)]
    assert shapes[0] == shapes[1]


def test_treerl_forks_at_the_most_surprising_tokens() -> None:
    t = RolloutTree("q", [0])
    a = t.add(t.root, "model", [1, 2, 3, 4], turn=0, logprobs=[-9.0, -0.1, -2.0, -0.5])
    b = t.add(t.root, "model", [5, 6, 7], turn=0, logprobs=[-0.1, -1.0, -0.2])
    t.set_reward(a, 1.0)
    t.set_reward(b, 0.0)
    forks = TokenEntropyTopK(n_forks=2, n_children=2).on_complete(t, 0, room=10, rng=np.random.default_rng(0))
    assert forks == [
        Fork(a, 2, 2, "token"),
        Fork(b, 1, 2, "token"),
    ]  # -2.0 and -1.0 (a's first token excluded)
    assert TokenEntropyTopK().on_complete(t, 1, 10, np.random.default_rng(0)) == []  # one iteration
    # with the fake engine: 2 chains + 2 forks x 2 children = 6 leaves
    tree = grow(TokenEntropyTopK(initial=2, n_forks=2, n_children=2), budget=10)
    assert len(tree.leaves()) == 6 and tree.branch_count() == 4
    # budget caps the children
    assert len(grow(TokenEntropyTopK(initial=2, n_forks=2, n_children=2), budget=5).leaves()) == 5


def test_apply_forks_cuts_one_node_twice() -> None:
    t = RolloutTree("q", [0])
    a = t.add(t.root, "model", [1, 2, 3, 4], turn=0)
    t.set_reward(a, 1.0)
    parents = apply_forks(t, [Fork(a, 1, 1, "token"), Fork(a, 3, 1, "token")])
    assert [t.nodes[p].token_ids for p, _, _ in parents] == [[1], [2, 3]]
    assert [t.prefix_ids(p) for p, _, _ in parents] == [[0, 1], [0, 1, 2, 3]]
    for p, _, r in parents:
        t.set_reward(t.add(p, "model", [8], turn=0, branch_reason=r), 0.0)
    assert sorted(r.token_ids for r in flatten([t])) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 8], [0, 1, 8]]


def test_branching_score_uses_entropy_and_likelihood_gain() -> None:
    t = RolloutTree("q", [0])
    a = t.add(t.root, "model", [1, 2, 3, 4], turn=0, entropies=[0.1, 0.9, 0.5, 0.2])
    b = t.add(t.root, "model", [5, 6, 7, 8], turn=0, entropies=[0.1, 0.8, 0.8, 0.1],
              info={"log_ratio": [0.0, 0.0, 0.0, float(np.log(3.0))]})  # fmt: skip
    pol = BranchingScore(n_forks=2, n_children=1, gamma=0.9)
    assert pol.gain(t, b, 1) == pytest.approx((1 + 0.9 * 3) / 1.9)
    assert pol.gain(t, b, 2) == pytest.approx(3.0) and pol.gain(t, a, 1) == 1.0
    # Norm(H) over a1..a3, b1..b3 = [1, .5, .125, .875, .875, 0]; Norm(Omega) = [0, 0, 0, .47, 1, 0]
    forks = pol.on_complete(t, 0, room=5, rng=np.random.default_rng(0))
    assert forks == [Fork(b, 2, 1, "score"), Fork(b, 1, 1, "score")]
    # without likelihood information it falls back to entropy alone
    t.nodes[b].info = {}
    assert pol.on_complete(t, 0, 5, np.random.default_rng(0))[0] == Fork(a, 1, 1, "score")


def test_helpers_and_registry() -> None:
    assert aepo_global_samples(12, 1.0, 1.0) == 7  # int(12 * 0.5) + 1
    assert aepo_global_samples(12, 10.0, 0.0) == 12 and aepo_global_samples(12, 0.0, 10.0) == 1
    t = RolloutTree("q", [0])
    n = t.add(t.root, "model", [1] * 30, entropies=[1.0] * 20 + [5.0] * 10)
    assert round_entropy(t, n) == 1.0 and round_entropy(t, n, k=30) == pytest.approx(70 / 30)
    assert isinstance(make_branch_policy("turn_entropy", initial=3), TurnBoundaryEntropy)
    with pytest.raises(ConfigError, match="choose one of"):
        make_branch_policy("beam")
    with pytest.raises(ConfigError, match="has no option"):
        make_branch_policy("turn_entropy", entropy_wieght=0.2)
