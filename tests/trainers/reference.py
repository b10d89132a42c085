"""An independent reference of the GRPO trainer's credit and update, written from ALGORITHMS.md and
docs/trainer.md (not from trainers/*.py): plain Python for the credit, autograd on the `Table` model of
tests/trainers/table.py for the update. test_combinations.py sweeps the trainer against it.

Covered from the spec: the outcome and tree estimators (GRPO z-score with unbiased std + 1e-4, Dr.GRPO,
RLOO, SPO with V the mean over children and its std form, TreeRL on leave-one-out rewards, TreePO's sub-group
baseline and whitening), the filters, shared "repeat"/"once", shaping centred on the group, and the update
(clipped surrogate with dual clip and token TIS, four aggregations, EPO's trajectory entropy and band,
epochs x minibatches with the old logprobs of the sampling policy). GiGPO, HGPO, IGPO and HiPER's node
advantages are taken from the trainer (their formulas have hand-number tests of their own); what the
trainer does with them afterwards (filters, shared modes, shaping) is checked here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from tests.trainers.table import VOCAB
from toolgym.trainers.tree import RolloutTree, Row

OWN = ("grpo", "dr_grpo", "rloo", "tree", "spo_std", "treerl", "treepo")  # estimators written out here


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float], unbiased: bool) -> float:
    m = _mean(xs)
    n = len(xs) - 1 if unbiased else len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / n) if n > 0 else 0.0


def overlong(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO 7.3: min(-(len - L_exp) / L_b * factor, 0), flat at -factor past the maximum."""
    return max(min(-(length - (max_len - buffer)) / buffer * factor, 0.0), -factor)


class Tree:
    """Values on one rollout tree over the leaves that have rows."""

    def __init__(self, tree: RolloutTree, leaves: list[int]) -> None:
        self.t, self.leaves = tree, leaves

    def below(self, nid: int) -> list[int]:
        return [lf for lf in self.t.subtree_leaves(nid) if lf in self.leaves]

    def kids(self, nid: int) -> list[int]:
        return [c for c in self.t.nodes[nid].children if self.below(c)]

    def head(self, nid: int) -> int:
        """First node of the segment: a child of the root or of a node with two or more live children."""
        p = self.t.nodes[nid].parent
        if p is None or p == self.t.root or len(self.kids(p)) > 1:
            return nid
        return self.head(p)

    def v_children(self, nid: int, leaf_v: dict[int, float]) -> float:
        if nid in leaf_v:
            return leaf_v[nid]
        return _mean([self.v_children(c, leaf_v) for c in self.kids(nid)])

    def v_leaves(self, nid: int, leaf_v: dict[int, float]) -> float:
        return _mean([leaf_v[lf] for lf in self.below(nid)])


def outcome_node_adv(name: str, forest: list[RolloutTree], rows: list[Row]) -> list[dict[int, float]]:
    """Node advantages of the estimators in OWN, from the outcome rewards."""
    by_tree: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_tree[r.tree].append(i)
    R = [forest[r.tree].nodes[r.leaf].reward or 0.0 for r in rows]
    out: list[dict[int, float]] = [{} for _ in rows]
    for ti, idx in by_tree.items():
        t = forest[ti]
        tr = Tree(t, [rows[i].leaf for i in idx])
        rs = [R[i] for i in idx]
        for i in idx:
            r = rows[i]
            model = [n for n in r.nodes if t.nodes[n].kind == "model"]
            if name in ("grpo", "dr_grpo", "rloo", "treepo"):
                if name == "treepo":
                    a = _treepo(tr, rows[i].leaf, R[i], {rows[j].leaf: R[j] for j in idx}, r.nodes)
                elif len(idx) < 2:
                    a = 0.0  # a group of one has no baseline (docs: departure 1)
                elif name == "grpo":
                    a = (R[i] - _mean(rs)) / (_std(rs, True) + 1e-4)
                elif name == "dr_grpo":
                    a = R[i] - _mean(rs)
                else:
                    a = R[i] - (sum(rs) - R[i]) / (len(rs) - 1)
                out[i] = dict.fromkeys(model, a)
                continue
            leaf_v = {rows[j].leaf: R[j] for j in idx}
            if name == "treerl":
                leaf_v = {
                    rows[j].leaf: R[j] - (sum(rs) - R[j]) / (len(rs) - 1) if len(rs) > 1 else 0.0 for j in idx
                }
            for n in model:
                h = tr.head(n)
                p = t.nodes[h].parent
                assert p is not None
                if name == "treerl":
                    vh, vp = tr.v_leaves(h, leaf_v), tr.v_leaves(p, leaf_v)
                    out[i][n] = ((vh - vp) + vh) / math.sqrt(len(tr.below(h)))
                else:
                    vh, vp = tr.v_children(h, leaf_v), tr.v_children(p, leaf_v)
                    a = vh - vp
                    if name == "spo_std":
                        a /= _std([tr.v_children(c, leaf_v) for c in tr.kids(p)], False) + 1e-8
                    out[i][n] = a
    return out


def _treepo(tr: Tree, leaf: int, r: float, rewards: dict[int, float], path: tuple[int, ...]) -> float:
    heads = list(dict.fromkeys([tr.t.root] + [tr.head(n) for n in path if n != tr.t.root]))
    terms = []
    for d, h in enumerate(heads):
        sub = [rewards[lf] for lf in tr.below(h)]
        if d == 0 or len(sub) > 1:
            terms.append(r - _mean(sub))
    return _mean(terms)


def credit(
    cfg: Any, forest: list[RolloutTree], rows: list[Row], node_adv: list[dict[int, float]]
) -> tuple[list[bool], list[list[int]], list[list[float]]]:
    """(keep, loss masks, token advantages) of `rows` (every leaf's row, remove_clip applied) as trained."""
    eps = [forest[r.tree].nodes[r.leaf].info.get("episode", {}) for r in rows]
    groups = [r.tree for r in rows]
    model = [[forest[r.tree].nodes[n].kind == "model" for n in r.node_ids] for r in rows]
    # filters, in the trainer's order; the zero-variance one on the estimator's token advantages
    keep = [True] * len(rows)
    if cfg.filter_zero_variance:
        live = defaultdict(bool)
        for r, a, m in zip(rows, node_adv, model, strict=True):
            live[r.tree] |= any(abs(a.get(n, 0.0)) > 1e-6 for n, mm in zip(r.node_ids, m, strict=True) if mm)
        keep = [k and live[g] for k, g in zip(keep, groups, strict=True)]
    if cfg.acc_filter_low > 0 or cfg.acc_filter_high < 1:
        rate = {
            g: _mean([float(bool(e.get("success"))) for e, h in zip(eps, groups, strict=True) if h == g])
            for g in groups
        }
        keep = [
            k and cfg.acc_filter_low <= rate[g] <= cfg.acc_filter_high
            for k, g in zip(keep, groups, strict=True)
        ]
    if cfg.filter_void:
        keep = [k and not e.get("void") for k, e in zip(keep, eps, strict=True)]
    if cfg.mask_truncated_completions:
        keep = [k and not e.get("truncated") for k, e in zip(keep, eps, strict=True)]
    # shaping, centred on the group (every row of it, filtered or not), never scaled
    s = []
    for r, e in zip(rows, eps, strict=True):
        x = float(forest[r.tree].nodes[r.leaf].info.get("kl_shaping", 0.0))
        if cfg.overlong_buffer > 0:
            x += overlong(e.get("tokens", 0), cfg.max_total_tokens, cfg.overlong_buffer, cfg.overlong_factor)
        s.append(x)
    s_c = [
        x - _mean([y for y, h in zip(s, groups, strict=True) if h == g])
        for x, g in zip(s, groups, strict=True)
    ]
    # who trains which node, with which advantage
    est = [dict(a) for a in node_adv]
    shape = [
        dict.fromkeys((n for n, mm in zip(r.node_ids, m, strict=True) if mm), c)
        for r, m, c in zip(rows, model, s_c, strict=True)
    ]
    owner: dict[tuple[int, int], int] = {}
    for i, r in enumerate(rows):
        if keep[i]:
            for n in r.nodes:
                owner.setdefault((r.tree, n), i)
    if cfg.shared == "once":
        for tbl in (est, shape):
            vals: dict[tuple[int, int], list[float]] = defaultdict(list)
            for i, r in enumerate(rows):
                if keep[i]:
                    for n, a in tbl[i].items():
                        vals[(r.tree, n)].append(a)
            for i, r in enumerate(rows):
                tbl[i] = {n: _mean(vals[(r.tree, n)]) for n in tbl[i] if vals.get((r.tree, n))}
    masks, toks = [], []
    for i, (r, m) in enumerate(zip(rows, model, strict=True)):
        train = [
            mm and keep[i] and (cfg.shared == "repeat" or owner.get((r.tree, n)) == i)
            for n, mm in zip(r.node_ids, m, strict=True)
        ]
        masks.append([int(x) for x in train])
        toks.append([est[i].get(n, 0.0) if x else 0.0 for n, x in zip(r.node_ids, train, strict=True)])
    if cfg.estimator == "treepo" and cfg.treepo_whiten:  # over the trained tokens of the batch, unbiased std
        vals = [a for t, m in zip(toks, masks, strict=True) for a, x in zip(t, m, strict=True) if x]
        if len(vals) >= 2:
            mu, sd = _mean(vals), _std(vals, True)
            toks = [
                [(a - mu) / (sd + 1e-8) if x else 0.0 for a, x in zip(t, m, strict=True)]
                for t, m in zip(toks, masks, strict=True)
            ]
        else:
            toks = [[0.0] * len(t) for t in toks]
    toks = [
        [a + (shape[i].get(n, 0.0) if x else 0.0) for a, n, x in zip(t, rows[i].node_ids, m, strict=True)]
        for i, (t, m) in enumerate(zip(toks, masks, strict=True))
    ]
    return keep, masks, toks


def update(
    cfg: Any, batch: Any, theta0: torch.Tensor, step: int = 1, history: list[float] | None = None
) -> torch.Tensor:
    """theta after the step's epochs x minibatches SGD(lr 1) updates of the table, from the docs' loss."""
    theta = theta0.clone().requires_grad_(True)
    ids, B = batch.input_ids, batch.input_ids.shape[0]
    m = batch.loss_mask
    turn = batch.row_mask if batch.row_mask is not None else batch.loss_mask

    def scores(th: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp_all = th[ids[:, 0], : ids.shape[1]].log_softmax(-1)  # [B, T, V]
        lp = lp_all.gather(-1, (ids % VOCAB)[..., None]).squeeze(-1)
        return lp, -(lp_all.exp() * lp_all).sum(-1)

    with torch.no_grad():
        old_all, _ = scores(theta)
    g = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    band = None
    if cfg.epo and history:
        hbar = _mean(history)
        band = (cfg.epo_kappa_low * hbar, cfg.epo_kappa_high * hbar)
    p = step / cfg.steps
    w = (
        cfg.epo_weight_start
        if p <= cfg.epo_warmup
        else cfg.epo_weight_start
        + (cfg.epo_weight_end - cfg.epo_weight_start) * (p - cfg.epo_warmup) / (1 - cfg.epo_warmup)
    )
    for epoch in range(cfg.epochs):
        order = torch.randperm(B, generator=g) if cfg.minibatches > 1 else torch.arange(B)
        size = -(-B // cfg.minibatches)
        for k in range(0, B, size):
            rows = order[k : k + size].tolist()
            lp, ent = scores(theta)
            old = lp.detach() if epoch == 0 and k == 0 else old_all
            trained = [r for r in rows if m[r].sum() > 0]
            epo_rows = [r for r in rows if cfg.epo and turn[r].sum() > 0]
            if not trained and not epo_rows:
                continue
            loss = torch.zeros(())
            per_row = []
            for r in rows:
                a = batch.advantages[r]
                ratio = (lp[r] - old[r]).exp()
                L = torch.maximum(-a * ratio, -a * ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high))
                if cfg.dual_clip:
                    L = torch.where(a < 0, torch.minimum(L, -a * cfg.dual_clip), L)
                tis = (old[r] - batch.rollout_logprobs[r]).clamp(max=math.log(cfg.is_max)).exp()  # token TIS
                per_row.append((L * tis * m[r]).sum())
            tokens = sum(float(m[r].sum()) for r in rows)
            row_means = [s / m[r].sum() for s, r in zip(per_row, rows, strict=True) if m[r].sum() > 0]
            if cfg.agg == "token_mean":
                loss = sum(per_row) / max(tokens, 1.0)
            elif cfg.agg == "seq_mean":
                loss = sum(row_means) / max(len(trained), 1)
            elif cfg.agg == "seq_mean_token_sum":
                loss = sum(per_row) / max(len(trained), 1)
            else:
                loss = sum(per_row) / max(len(trained) * cfg.max_total_tokens, 1)
            if epo_rows:
                total = torch.zeros(())
                for r in epo_rows:
                    on = turn[r] > 0
                    turns = sorted(set(batch.turn_ids[r][on].tolist()))
                    h = torch.stack([ent[r][on & (batch.turn_ids[r] == t)].mean() for t in turns]).mean()
                    pen = torch.relu(band[0] - h) + torch.relu(h - band[1]) if band else torch.zeros(())
                    total = total + h - cfg.epo_beta * w * pen
                loss = loss - cfg.epo_alpha * total / len(epo_rows)
            (grad,) = torch.autograd.grad(loss, theta)
            with torch.no_grad():
                theta -= grad
    return theta.detach()
