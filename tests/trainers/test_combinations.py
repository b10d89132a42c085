"""Every estimator x shared mode x filter on random branched trees with env nodes, without a model: the
invariants every combination must keep (finite numbers, who trains which node, segment credit)."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from toolgym.trainers.advantages import turn_to_nodes
from toolgym.trainers.grpo import GRPO_ESTIMATORS, GRPOConfig, credit
from toolgym.trainers.tree import RolloutTree, Row, segment_heads


def random_forest(seed: int, trees: int = 3) -> list[RolloutTree]:
    """Trees of 2-4 chains of 1-3 turns (env nodes between turns), forks at env nodes and inside turns,
    state keys from a small alphabet, random step rewards, outcomes, void/truncated/env_error flags."""
    rng = random.Random(seed)
    forest = []
    for ti in range(trees):
        t = RolloutTree(f"q{ti}", [1, 2], state_key="p")

        def grow(parent: int, turn: int, t: RolloutTree = t) -> None:
            node = t.add(parent, "model", [rng.randrange(3, 99) for _ in range(rng.randint(2, 4))], turn=turn,
                         state_key=rng.choice("abc"), step_reward=rng.choice([0.0, 0.5, 1.0]))  # fmt: skip
            if turn < rng.randint(0, 2):
                env = t.add(node, rng.choice(["env", "tool"]), [7], turn=turn, state_key=rng.choice("abc"))
                for _ in range(rng.choice([1, 1, 2])):
                    grow(env, turn + 1, t)
            else:
                t.set_reward(node, rng.choice([0.0, 1.0]))
                t.nodes[node].info["episode"] = {
                    "success": rng.random() < 0.5, "void": rng.random() < 0.2, "truncated": rng.random() < 0.2,
                    "truncation": "env_error" if rng.random() < 0.1 else None,
                }  # fmt: skip

        for _ in range(rng.randint(2, 4)):
            grow(t.root, 0)
        # a fork inside a finished turn (TreeRL-style): split a model node and add a sibling leaf
        model = [n.id for n in t.nodes if n.kind == "model" and len(n.token_ids) > 1]
        cut = t.split(rng.choice(model), 1)
        leaf = t.add(cut, "model", [5], turn=t.nodes[cut].turn, branch_reason="token")
        t.set_reward(leaf, rng.choice([0.0, 1.0]))
        t.nodes[leaf].info["episode"] = {"success": False}
        forest.append(t)
    return forest


FILTERS: list[dict[str, Any]] = [
    {},
    {"filter_void": True},
    {"mask_truncated_completions": True},
    {"remove_clip": True},
    {"acc_filter_low": 0.2, "acc_filter_high": 0.8},
    {"filter_zero_variance": False, "filter_void": True, "mask_truncated_completions": True},
]


def igpo_scorer(forest: list[RolloutTree], rows: list[Row]) -> Any:
    """Stand-in for the model: one advantage per turn, from the node ids (deterministic)."""
    from toolgym.trainers.tree import row_turns

    return turn_to_nodes(
        forest, rows, [[(t.nodes[0] % 5) - 2.0 for t in row_turns(forest[r.tree], r)] for r in rows]
    )


@pytest.mark.parametrize(
    "estimator,shared,filters",
    list(itertools.product(GRPO_ESTIMATORS, ["repeat", "once"], range(len(FILTERS)))),
)
def test_every_estimator_shared_mode_and_filter(estimator: str, shared: str, filters: int) -> None:
    for seed in range(3):
        forest = random_forest(seed)
        cfg = GRPOConfig(estimator=estimator, shared=shared, branching="turn_entropy", **FILTERS[filters])
        cfg.validate()
        c = credit(cfg, forest, igpo_scorer)
        rows = c.rows
        assert len(rows) == len(c.advantages) == len(c.keep) == len(c.rewards)
        leaves = {(r.tree, r.leaf) for r in rows}
        for ti, t in enumerate(forest):  # env_error (and, with remove_clip, truncated) leaves have no row
            for leaf in t.leaves():
                ep = t.nodes[leaf].info.get("episode", {})
                gone = ep.get("truncation") == "env_error" or (cfg.remove_clip and ep.get("truncated"))
                assert ((ti, leaf) in leaves) != bool(gone)
        trained: dict[tuple[int, int], int] = {}
        for r, a, k in zip(rows, c.advantages, c.keep, strict=True):
            assert len(a) == len(r.token_ids) and all(math.isfinite(x) for x in a)
            assert all(x == 0.0 for x, m in zip(a, r.loss_mask, strict=True) if not m)
            for n, m in zip(r.node_ids, r.loss_mask, strict=True):
                if m:
                    assert forest[r.tree].nodes[n].trainable
            for n in dict.fromkeys(n for n, m in zip(r.node_ids, r.loss_mask, strict=True) if m):
                trained[(r.tree, n)] = trained.get((r.tree, n), 0) + 1
            if shared == "repeat" and k:  # a kept row trains every model node on its path
                assert all(
                    r.loss_mask[i] for i, n in enumerate(r.node_ids) if forest[r.tree].nodes[n].trainable
                )
        holders: dict[tuple[int, int], int] = {}
        for r, k in zip(rows, c.keep, strict=True):
            for n in r.nodes:
                if k and forest[r.tree].nodes[n].trainable:
                    holders[(r.tree, n)] = holders.get((r.tree, n), 0) + 1
        if shared == "once":  # every node with a kept holder is trained exactly once, by a kept row
            assert trained == dict.fromkeys(holders, 1)
        else:
            assert trained == holders
        if estimator in ("tree", "spo_std", "treerl"):  # one advantage per segment within a row
            for ti, t in enumerate(forest):
                heads = segment_heads(t, {r.leaf for r in rows if r.tree == ti})
                for r, a in zip(rows, c.advantages, strict=True):
                    if r.tree != ti:
                        continue
                    per_seg: dict[int, set[float]] = {}
                    for n, m, x in zip(r.node_ids, r.loss_mask, a, strict=True):
                        if m:
                            per_seg.setdefault(heads[n], set()).add(round(x, 9))
                    assert all(len(v) == 1 for v in per_seg.values())
