"""Tree estimators: credit per segment of a rollout tree (SPO, SPO with std, TreeRL) and TreePO's
sub-group baseline per row.

Departures from the papers (docs/trainer.md; numbered as in advantages.py, each is also marked where it
happens):
3. Tree estimators give one advantage per segment (the chain between two branch points, tool/env
   messages included; tree.py), as SPO and TreeRL do: `tree` is SPO's V(segment) - V(branch point) with
   V the mean over children (a node's subtrees count once each, however many leaves they hold),
   `spo_std` divides that by the population std of the sibling values (unverified: SPO's code was not
   read for which std), `treerl` is TreeRL's ((V(s) - V(p)) + V(s)) / sqrt(#leaves below s) on
   leave-one-out rewards. `treepo` is TreePO's sub-group baseline (one scalar per row).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Literal

import torch

from toolgym.trainers.advantages import NodeAdv, rloo
from toolgym.trainers.tree import RolloutTree, Row, segment_heads


def tree_values(
    tree: RolloutTree, leaf_values: dict[int, float], over: Literal["leaves", "children"] = "leaves"
) -> list[float]:
    """V(node) = mean of `leaf_values` over the leaves below it that have a value (`leaves`: TreeRL), or the
    mean of V over its children that have a value below them (`children`: SPO, ALGORITHMS.md 5.3; on an
    unbalanced tree a subtree counts once, however many leaves it holds). 0 where no leaf has a value.

    >>> t = RolloutTree("q", [1]); a = t.add(t.root, "model", [2]); b = t.add(t.root, "model", [3])
    >>> l1, l2 = t.add(a, "model", [4]), t.add(a, "model", [5])
    >>> [tree_values(t, {l1: 1.0, l2: 0.0, b: 0.0}, over)[0] for over in ("leaves", "children")]
    [0.3333333333333333, 0.25]
    """
    if over == "leaves":
        out = []
        for n in tree.nodes:
            ls = [leaf for leaf in tree.subtree_leaves(n.id) if leaf in leaf_values]
            out.append(sum(leaf_values[leaf] for leaf in ls) / len(ls) if ls else 0.0)
        return out
    value: dict[int, float] = {}  # nodes with a valued leaf below them
    stack: list[tuple[int, bool]] = [(tree.root, False)]
    while stack:  # post-order without recursion (paths can be long; split suffixes have larger ids)
        nid, done = stack.pop()
        if not done:
            stack.append((nid, True))
            stack += [(c, False) for c in tree.nodes[nid].children]
            continue
        if nid in leaf_values:
            value[nid] = leaf_values[nid]
        else:
            kids = [value[c] for c in tree.nodes[nid].children if c in value]
            if kids:
                value[nid] = sum(kids) / len(kids)
    return [value.get(n.id, 0.0) for n in tree.nodes]


TreeStyle = Literal["spo", "spo_std", "treerl"]


def tree_advantages(forest: list[RolloutTree], rows: list[Row], style: TreeStyle = "spo") -> NodeAdv:
    """Segment credit (departure 3), the same for every row holding the node.

    With s the segment of a node and p the branch point above it (tree.py `segment_heads`), V the mean over
    children (SPO) or over leaves (TreeRL) (`tree_values`): `spo`: V(s) - V(p); `spo_std`: (V(s) - V(p)) / (population std of V over p's children + 1e-8);
    `treerl`: leaves leave-one-out normalised first, then ((V(s) - V(p)) + V(s)) / sqrt(#leaves below s).
    Only leaves that have a row count (env_error leaves have none).
    """
    per_tree: dict[int, dict[int, float]] = {}
    for ti in sorted({r.tree for r in rows}):
        tree = forest[ti]
        leaves = [r.leaf for r in rows if r.tree == ti]
        raw = {leaf: tree.nodes[leaf].reward or 0.0 for leaf in leaves}
        if style == "treerl":
            raw = dict(zip(leaves, rloo(list(raw.values()), [0] * len(raw)), strict=True))
        v = tree_values(tree, raw, "leaves" if style == "treerl" else "children")
        heads = segment_heads(tree, set(leaves))
        n_leaves = {h: sum(leaf in raw for leaf in tree.subtree_leaves(h)) for h in set(heads.values())}
        adv: dict[int, float] = {}
        for nid, h in heads.items():
            p = tree.nodes[h].parent
            if p is None:
                continue
            a = v[h] - v[p]
            if style == "spo_std":
                sibs = torch.tensor([v[c] for c in tree.nodes[p].children if c in heads], dtype=torch.float64)
                a = a / (sibs.std(unbiased=False).item() + 1e-8)
            elif style == "treerl":
                a = (a + v[h]) / math.sqrt(n_leaves[h])
            adv[nid] = a
        per_tree[ti] = adv
    return [{n: per_tree[r.tree][n] for n in r.nodes if forest[r.tree].nodes[n].trainable} for r in rows]


def treepo(
    forest: list[RolloutTree], rows: list[Row], weight: Literal["average", "group_size"] = "average"
) -> list[float]:
    """TreePO's sub-group baseline, one scalar per row: for each depth d of the row's segment path
    (d = 0 the whole tree, d >= 1 the leaves below the d-th segment head), s_d = R - mean(subgroup_d),
    kept when the subgroup has two or more leaves (d = 0 always). `average`: mean of the kept s_d (the
    official script); `group_size`: sum_d s_d n_d / sum_d n_d (the code's default). TreePO then whitens
    the token advantages over the batch (the trainer's `treepo_whiten`)."""
    out: list[float] = []
    by_tree: dict[int, dict[int, float]] = defaultdict(dict)
    for r in rows:
        by_tree[r.tree][r.leaf] = forest[r.tree].nodes[r.leaf].reward or 0.0
    heads_of = {ti: segment_heads(forest[ti], set(ls)) for ti, ls in by_tree.items()}
    for r in rows:
        tree, rewards = forest[r.tree], by_tree[r.tree]
        seg_heads = list(dict.fromkeys(heads_of[r.tree][n] for n in r.nodes))  # root first
        terms: list[tuple[float, int]] = []
        for d, h in enumerate(seg_heads):
            sub = [rewards[leaf] for leaf in tree.subtree_leaves(h) if leaf in rewards]
            if d == 0 or len(sub) > 1:
                terms.append((rewards[r.leaf] - sum(sub) / len(sub), len(sub)))
        if weight == "group_size":
            out.append(sum(s * n for s, n in terms) / sum(n for _, n in terms))
        else:
            out.append(sum(s for s, _ in terms) / len(terms))
    return out
