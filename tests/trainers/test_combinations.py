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


def random_forest(seed: int, trees: int = 3, branched: bool = True) -> list[RolloutTree]:
    """Trees of 2-4 chains of 1-3 turns (env nodes between turns), forks at env nodes and inside turns,
    state keys from a small alphabet, random step rewards, outcomes, void/truncated/env_error flags.
    `branched` False: independent chains only (GRPO's sampling, `branching="none"`)."""
    rng = random.Random(seed)
    forest = []
    for ti in range(trees):
        t = RolloutTree(f"q{ti}", [1, 2], state_key="p")

        def grow(parent: int, turn: int, t: RolloutTree = t) -> None:
            node = t.add(parent, "model", [rng.randrange(3, 99) for _ in range(rng.randint(2, 4))], turn=turn,
                         state_key=rng.choice("abc"), step_reward=rng.choice([0.0, 0.5, 1.0]))  # fmt: skip
            if turn < rng.randint(0, 2):
                env = t.add(node, rng.choice(["env", "tool"]), [7], turn=turn, state_key=rng.choice("abc"))
                for _ in range(rng.choice([1, 1, 2]) if branched else 1):
                    grow(env, turn + 1, t)
            else:
                t.set_reward(node, rng.choice([0.0, 1.0]))
                t.nodes[node].info["episode"] = {
                    "success": rng.random() < 0.5, "void": rng.random() < 0.2, "truncated": rng.random() < 0.2,
                    "truncation": "env_error" if rng.random() < 0.1 else None, "tokens": rng.choice([10, 95, 100]),
                }  # fmt: skip

        for _ in range(rng.randint(2, 4)):
            grow(t.root, 0)
        if branched:  # a fork inside a finished turn (TreeRL-style): split a model node, add a sibling leaf
            model = [n.id for n in t.nodes if n.kind == "model" and len(n.token_ids) > 1]
            cut = t.split(rng.choice(model), 1)
            leaf = t.add(cut, "model", [5], turn=t.nodes[cut].turn, branch_reason="token")
            t.set_reward(leaf, rng.choice([0.0, 1.0]))
            t.nodes[leaf].info["episode"] = {"success": False}
        t.meta.update(env_id="e", seed=ti)
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


# ----- every combination against the reference written from the docs (tests/trainers/reference.py) --------
def replayed(forest: list[RolloutTree], seed: int) -> list[RolloutTree]:
    """Tree 0 fails everywhere and gets a buffered success of its task (ARPO replay, trainers/replay.py)."""
    import copy

    from toolgym.trainers.replay import SuccessBuffer

    donor = copy.deepcopy(forest[0])
    for i, leaf in enumerate(donor.leaves()):  # one success, the first leaf (no env fault)
        donor.nodes[leaf].info["episode"] = {"success": i == 0, "episode_reward": float(i == 0), "tokens": 10}
    buffer = SuccessBuffer(8, seed)
    assert buffer.add([donor]) == 1
    for leaf in forest[0].leaves():
        forest[0].nodes[leaf].info["episode"] = {**forest[0].nodes[leaf].info["episode"], "success": False}
        forest[0].set_reward(leaf, 0.0)
    out = buffer.inject(forest)
    assert [out[0].nodes[lf].reward for lf in out[0].leaves() if out[0].nodes[lf].info.get("replayed")] == [
        1.0
    ]
    return out


def shaped(forest: list[RolloutTree], seed: int) -> dict[str, Any]:
    """KL in reward on every leaf (replayed ones too) and the overlong options that act on 95/100 tokens."""
    from toolgym.trainers.grpo import KL_SHAPING

    rng = random.Random(seed)
    for t in forest:
        for leaf in t.leaves():
            t.nodes[leaf].info[KL_SHAPING] = -0.01 * rng.random()
    return dict(
        kl_coef=0.01, kl_in_reward=True, max_total_tokens=100, overlong_buffer=10, overlong_factor=0.3
    )


def combo_forest(
    seed: int, branched: bool, replay: bool, shaping: bool
) -> tuple[list[RolloutTree], dict[str, Any]]:
    forest = random_forest(seed, branched=branched)
    if replay:
        forest = replayed(forest, seed)
    return forest, (shaped(forest, seed) if shaping else {})


def reference_credit(cfg: GRPOConfig, forest: list[RolloutTree]) -> tuple[Any, Any]:
    from tests.trainers import reference
    from toolgym.trainers.tree import flatten

    c = credit(cfg, forest, igpo_scorer)
    rows = flatten(forest, "repeat", drop_truncated=cfg.remove_clip)
    own = cfg.estimator in reference.OWN
    node_adv = reference.outcome_node_adv(cfg.estimator, forest, rows) if own else c.node_adv
    return c, reference.credit(cfg, forest, rows, node_adv)


CREDIT_COMBOS = list(
    itertools.product(
        GRPO_ESTIMATORS, [False, True], ["repeat", "once"], range(len(FILTERS)), [False, True], [False, True]
    )
)


@pytest.mark.parametrize("estimator", GRPO_ESTIMATORS)
def test_credit_agrees_with_the_reference_in_every_combination(estimator: str) -> None:
    """estimator x branching x shared mode x filters x replay x shaping (all 96 per estimator, two forests
    each): keep flags, loss masks and token advantages as the reference computes them from the docs."""
    for est, branched, shared, filters, replay, shaping in CREDIT_COMBOS:
        if est != estimator:
            continue
        for seed in range(2):
            forest, opts = combo_forest(seed, branched, replay, shaping)
            cfg = GRPOConfig(estimator=est, shared=shared, branching="turn_entropy" if branched else "none",
                             **FILTERS[filters], **opts)  # fmt: skip
            c, (keep, masks, toks) = reference_credit(cfg, forest)
            where = (est, branched, shared, filters, replay, shaping, seed)
            assert c.keep == keep, where
            assert [r.loss_mask for r in c.rows] == masks, where
            for a, b in zip(c.advantages, toks, strict=True):
                assert a == pytest.approx(b, rel=1e-5, abs=1e-6), where


UPDATE_COMBOS = list(
    itertools.product(
        GRPO_ESTIMATORS,
        [False, True],
        ["repeat", "once"],
        range(len(FILTERS)),
        [False, True],
        [False, True],
        [1, 2],
        [1, 3],
        ["token_mean", "seq_mean", "seq_mean_token_sum", "constant"],
    )
)
# the full product (16,896) takes ~15 CPU minutes: a fixed sample of it, every estimator, shared mode,
# filter, EPO, epochs, minibatches and aggregation value appearing many times
UPDATE_SAMPLE = random.Random(30).sample(UPDATE_COMBOS, 160)


@pytest.mark.parametrize("combo", range(0, len(UPDATE_SAMPLE), 20))
def test_update_agrees_with_the_reference(combo: int) -> None:
    """estimator x branching x shared mode x filters x replay x EPO x epochs x minibatches x aggregation: the
    table model's weights after `grpo.optimize` equal the reference's (reference.update)."""
    import torch

    from tests.trainers import reference
    from tests.trainers.table import Table, table_forward
    from toolgym.trainers.addons import AddonState
    from toolgym.trainers.batch import collate
    from toolgym.trainers.grpo import optimize

    for est, branched, shared, filters, replay, epo, epochs, minibatches, agg in UPDATE_SAMPLE[
        combo : combo + 20
    ]:
        forest, opts = combo_forest(combo, branched, replay, shaping=combo % 40 == 0)
        cfg = GRPOConfig(
            estimator=est, shared=shared, branching="turn_entropy" if branched else "none", **FILTERS[filters],
            **{"max_total_tokens": 16, **opts}, epo=epo, epo_alpha=0.1, epo_kappa_low=0.9, epo_kappa_high=1.1,
            epo_weight_start=2.0, epochs=epochs, minibatches=minibatches, agg=agg, micro_batch_rows=2, grad_clip=0.0,
        )  # fmt: skip
        c = credit(cfg, forest, igpo_scorer)
        cut = [bool(forest[r.tree].nodes[r.leaf].info["episode"].get("truncated")) for r in c.rows]
        batch = collate(c.rows, c.advantages, c.rewards, c.keep, 0, cut, c.turn_masks)
        ids = batch.input_ids.clone()
        ids[:, 0] = torch.arange(len(c.rows))  # the table's row id
        batch = batch._replace(input_ids=ids)
        model = Table(len(c.rows), ids.shape[1], scale=0.7, seed=combo)
        theta0 = model.theta.detach().clone()
        addons = AddonState(cfg)
        if addons.band is not None:
            addons.band.update(0.5)  # a history: the band is [0.45, 0.55] (token entropies up to ln 2)
        optimize(cfg, 1, batch, model, model, torch.optim.SGD(model.parameters(), lr=1.0), addons=addons,
                 fwd=table_forward)  # fmt: skip
        want = reference.update(cfg, batch, theta0, 1, [0.5] if epo else None)
        where = (est, branched, shared, filters, replay, epo, epochs, minibatches, agg)
        assert torch.allclose(model.theta.detach(), want, rtol=1e-4, atol=1e-6), where
