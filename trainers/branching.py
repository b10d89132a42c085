"""Branching policies: where a rollout tree forks. They decide; the rollout engine generates.

The engine asks a policy three things: how many independent samples to start (`global_samples`), where
to fork after each round of model turns (`on_turns`, ARPO/AEPO: right after tool results), and where to
fork once every path has ended (`on_complete`, TreeRL/APPO: inside finished turns, for a few iterations).
A `Fork(node, pos, count)` means: keep the first `pos` tokens of `node` (all of them at a turn
boundary), sample `count` new continuations from there. `apply_forks` cuts the nodes so each fork point
is a node boundary and returns the parents to generate from. Budgets: `room` is how many more leaves the
tree may get; a policy never asks for more.

Departures from the papers / official code (docs/trainer.md):
1. Stale entropy fixed: ARPO/AEPO keep the initial entropy in a dict keyed by buffer index that is never
   cleared, so from the second batch on H_initial comes from an old batch. Here H_initial is read from
   the tree itself (the first model turn on the path), and the consecutive-branch counter lives in
   `tree.meta`: no state outlives the batch.
2. Decision timing follows the paper, not the code: the entropy that decides a fork at a tool boundary is
   that of the model turn generated right after the tool result (the code uses the turn that ended in the
   tool call, one round late). The fork then resamples that turn from the tool node.
3. Round entropy = mean per-token entropy of the first k tokens of the turn, divided by ln|V| (the
   trainer always passes the model's |V|, as ARPO's code normalises; without `vocab_size` entropies stay
   in nats and a weight tuned for ARPO reacts ~ln|V| times too strongly). The code pools the top-10
   probabilities of those tokens into one sum; our engine's entropy is over the full vocabulary.
4. AEPO's rule is used for both: p = (U + w dH) * max(0, 1 - c_pen * c), fork iff clip(p, 0, 1) >= tau;
   ARPO is c_pen = 0 (equivalent in distribution to its p = U - w dH <= tau at tau = 0.5).
5. TreeRL forks at the top-N surprisal tokens (-log p of the sampled token) over all trained tokens of
   the tree except the first token of each node (a node start is a plain sibling, not a fork).
6. APPO (no public code): BS_t = Norm(H_t) * Norm(Omega_t), min-max norms over the tree's candidates,
   Omega_t = discounted mean of exp(logp_new - logp_old) over the rest of the node after t, read from
   `node.info["log_ratio"]`. Nothing in the rollout loop writes it (a rollout has only the sampling
   policy, no older one to compare with), so in `toolgym train` Omega is 1 everywhere and the score is
   Norm(H_t) alone: an entropy top-k, not APPO's likelihood-gain weighting. Exact normalisation and
   discount are unverified.
7. AEPO's dynamic budget split (`dynamic_split`): the entropy pre-monitoring rollout is one complete
   path per tree that is then kept as the first of the m global samples (the code throws its extra
   pre-rollout away); H_root is its first turn's round entropy and H_tool the mean round entropy of its
   turns after env messages (H_root when it made no tool call). No 50-token probe.
8. TreePO's segment branching (`fixed_segments`): after the initial chains end, iteration d forks every
   distinct path prefix at its (d+1)*S-th trained token (`segment_tokens` S), `n_children` new
   continuations each; a path shorter than that falls back to the start of its last model turn (a
   turn-boundary fork), once. TreePO decodes segment by segment with early stopping; here whole
   continuations are sampled from each fork point.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from toolgym.errors import ConfigError
from toolgym.trainers.tree import RolloutTree


@dataclass(frozen=True)
class Fork:
    node: int  # node to fork from
    pos: int  # tokens of `node` kept as the shared prefix (len(tokens) = fork at its end)
    count: int  # new continuations to sample
    reason: str  # entropy | token | score


class BranchPolicy(Protocol):
    name: str

    def global_samples(self, budget: int) -> int:
        """Independent samples of the prompt to start with (<= budget)."""
        ...

    def on_turns(
        self, tree: RolloutTree, new_turns: list[int], room: int, rng: np.random.Generator
    ) -> list[Fork]:
        """Forks after a round: `new_turns` are the model nodes generated in this round."""
        ...

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        """Forks once all paths ended; called with iteration 0, 1, … until it returns no fork."""
        ...


def apply_forks(tree: RolloutTree, forks: list[Fork]) -> list[tuple[int, int, str]]:
    """Cuts nodes at the fork points; returns (parent node id, count, reason) for each fork, in order.

    Several forks inside one node are cut front to back, each in the tail left by the previous cut.
    """
    parents: dict[tuple[int, int], int] = {}
    for node in dict.fromkeys(f.node for f in forks):
        cur, offset = node, 0
        for pos in sorted({f.pos for f in forks if f.node == node}):
            length = len(tree.nodes[cur].token_ids)
            parents[(node, pos)] = tree.split(cur, pos - offset)
            if pos - offset < length:  # a real cut: later positions live in the new tail
                cur, offset = tree.nodes[cur].children[0], pos
    return [(parents[(f.node, f.pos)], f.count, f.reason) for f in forks]


class NoBranching:
    """Independent sampling (GRPO/PPO): `budget` samples of the prompt, a tree of depth one."""

    name = "none"

    def global_samples(self, budget: int) -> int:
        return budget

    def on_turns(
        self, tree: RolloutTree, new_turns: list[int], room: int, rng: np.random.Generator
    ) -> list[Fork]:
        return []

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        return []


def round_entropy(tree: RolloutTree, node: int, k: int = 20, vocab_size: int | None = None) -> float:
    """Mean engine entropy of the first k tokens of a model node (0 when unknown), / ln|V| if given."""
    ents = tree.nodes[node].entropies
    if not ents:
        return 0.0
    h = sum(ents[:k]) / len(ents[:k])
    return h / math.log(vocab_size) if vocab_size else h


def aepo_global_samples(budget: int, h_root: float, h_tool: float, beta: float = 0.5) -> int:
    """AEPO's entropy pre-monitoring split: m = clip(int(k * sigmoid(beta (H_root - H_tool))) + 1, 1, k).

    >>> aepo_global_samples(12, 1.0, 1.0)
    7
    """
    m = int(budget / (1 + math.exp(-beta * (h_root - h_tool)))) + 1
    return max(1, min(budget, m))


@dataclass
class TurnBoundaryEntropy:
    """ARPO/AEPO: after a tool/env message, fork when the next turn's entropy rose (see departures 1-4)."""

    initial: int = 8  # N global samples; the rest of the budget goes to branches
    beam_size: int = 2  # a fork adds beam_size - 1 continuations
    tau: float = 0.5  # branch threshold
    entropy_weight: float = 0.2  # w on dH = H(turn) - H(first turn of the path)
    consecutive_penalty: float = 0.05  # AEPO c_pen; 0 gives ARPO
    k_tokens: int = 20  # tokens whose entropy define a round's entropy
    vocab_size: int | None = None  # normalise entropies by ln|V| (the trainer passes the model's |V|)
    top_up: bool = True  # ARPO: fill a tree that ended below the budget with fresh global samples
    dynamic_split: bool = False  # AEPO entropy pre-monitoring: global samples m from H_root vs H_tool
    split_beta: float = 0.5  # AEPO's beta in m = k * sigmoid(beta (H_root - H_tool))
    name: str = "turn_entropy"

    def global_samples(self, budget: int) -> int:
        return max(1, min(self.initial, budget))

    def split_budget(self, tree: RolloutTree, budget: int) -> int:
        """AEPO's m for a tree that holds one finished pre-monitoring path (departure 7)."""
        path = tree.path(tree.leaves()[0])
        turns = [n for n in path if tree.nodes[n].kind == "model" and tree.nodes[n].entropies]
        if not turns:
            return self.global_samples(budget)
        h_root = round_entropy(tree, turns[0], self.k_tokens, self.vocab_size)
        after = [
            round_entropy(tree, n, self.k_tokens, self.vocab_size)
            for n in turns[1:]
            if tree.nodes[tree.nodes[n].parent].kind in ("tool", "env", "user")  # type: ignore[index]
        ]
        h_tool = sum(after) / len(after) if after else h_root
        return aepo_global_samples(budget, h_root, h_tool, self.split_beta)

    def on_turns(
        self, tree: RolloutTree, new_turns: list[int], room: int, rng: np.random.Generator
    ) -> list[Fork]:
        if tree.meta.get("probe"):
            return []  # AEPO's pre-monitoring path runs unforked
        c = int(tree.meta.get("consecutive", 0))
        forks: list[Fork] = []
        for nid in new_turns:
            node = tree.nodes[nid]
            parent = tree.nodes[node.parent] if node.parent is not None else None
            if (
                parent is None
                or parent.kind not in ("tool", "env", "user")
                or node.branch_reason == "entropy"
            ):
                continue  # not the first turn after an env message, or itself a fork of this boundary
            first = next(n for n in tree.path(nid) if tree.nodes[n].kind == "model")
            d_h = round_entropy(tree, nid, self.k_tokens, self.vocab_size) - round_entropy(
                tree, first, self.k_tokens, self.vocab_size
            )
            u = float(rng.random())  # drawn for every candidate, so decisions are reproducible by seed
            p = (u + self.entropy_weight * d_h) * max(0.0, 1.0 - self.consecutive_penalty * c)
            count = min(self.beam_size - 1, room - sum(f.count for f in forks))
            if min(max(p, 0.0), 1.0) >= self.tau and count > 0:
                forks.append(Fork(parent.id, len(parent.token_ids), count, "entropy"))
        tree.meta["consecutive"] = c + 1 if forks else 0
        return forks

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        return []


def _token_candidates(tree: RolloutTree) -> list[tuple[int, int]]:
    """(node, pos) of every trained token that may start a fork (not a node's first token)."""
    return [(n.id, i) for n in tree.nodes if n.trainable for i in range(1, len(n.token_ids))]


def _top(scored: list[tuple[float, int, int]], n: int) -> list[tuple[int, int]]:
    """The n best (node, pos) by score, ties to the earlier token."""
    return [(nid, pos) for _, nid, pos in sorted(scored, key=lambda s: (-s[0], s[1], s[2]))[:n]]


class _ForkAfterCompletion:
    """Token-level policies: ``initial`` independent chains, no forks while turns are produced; forks are
    chosen in ``on_complete`` once the chains have ended."""

    initial: int

    def global_samples(self, budget: int) -> int:
        return max(1, min(self.initial, budget))

    def on_turns(
        self, tree: RolloutTree, new_turns: list[int], room: int, rng: np.random.Generator
    ) -> list[Fork]:
        return []


@dataclass
class TokenEntropyTopK(_ForkAfterCompletion):
    """TreeRL (EPTree): after the chains end, fork at the top-N surprisal tokens, T continuations each, L times."""

    initial: int = 4  # M independent chains
    n_forks: int = 2  # N fork points per tree per iteration
    n_children: int = 2  # T continuations per fork point
    iterations: int = 1  # L
    name: str = "token_entropy"

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        if iteration >= self.iterations:
            return []
        scored = []
        for nid, pos in _token_candidates(tree):
            lp = tree.nodes[nid].logprobs
            scored.append((-lp[pos] if lp is not None else 0.0, nid, pos))
        return _fill(_top(scored, self.n_forks), self.n_children, room, "token")


@dataclass
class BranchingScore(_ForkAfterCompletion):
    """APPO: fork at the top positions of Norm(entropy) * Norm(likelihood gain of the continuation)."""

    initial: int = 4  # independent samples
    n_forks: int = 2  # fork points per tree per iteration
    n_children: int = 2  # continuations per fork point
    iterations: int = 1
    gamma: float = 0.9  # discount of the likelihood gain along the continuation
    name: str = "branching_score"

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        if iteration >= self.iterations:
            return []
        cands = _token_candidates(tree)
        if not cands:
            return []
        h = [(tree.nodes[n].entropies or [0.0] * (p + 1))[p] for n, p in cands]
        omega = [self.gain(tree, n, p) for n, p in cands]
        bs = [a * b for a, b in zip(_minmax(h), _minmax(omega), strict=True)]
        scored = [(s, n, p) for s, (n, p) in zip(bs, cands, strict=True)]
        return _fill(_top(scored, self.n_forks), self.n_children, room, "score")

    def gain(self, tree: RolloutTree, node: int, pos: int) -> float:
        """Omega_t: discounted mean of exp(log ratio) over the tokens of `node` after `pos` (1 if unknown)."""
        lr = tree.nodes[node].info.get("log_ratio")
        rest = lr[pos + 1 :] if lr is not None else []
        if not rest:
            return 1.0
        w = [self.gamma**i for i in range(len(rest))]
        return sum(wi * math.exp(x) for wi, x in zip(w, rest, strict=True)) / sum(w)


@dataclass
class FixedSegments(_ForkAfterCompletion):
    """TreePO's segment branching: fork every `segment_tokens` trained tokens, depth by depth (departure 8)."""

    initial: int = 2  # independent chains
    segment_tokens: int = 64  # S: tokens per segment
    n_children: int = 1  # new continuations per fork point (TreePO's fixed divergence 2 = 1 new + the old)
    iterations: int = 3  # depths forked
    fallback: bool = True  # a path shorter than the offset forks at the start of its last model turn
    name: str = "fixed_segments"

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        if iteration >= self.iterations:
            return []
        offset = (iteration + 1) * self.segment_tokens
        points: list[tuple[int, int]] = []
        for leaf in tree.leaves():
            point = self._point(tree, leaf, offset)
            if point is not None and point not in points:
                points.append(point)
        return _fill(points, self.n_children, room, "segment")

    def _point(self, tree: RolloutTree, leaf: int, offset: int) -> tuple[int, int] | None:
        seen = 0
        last_turn: tuple[int, int] | None = None
        for nid in tree.path(leaf):
            n = tree.nodes[nid]
            if not n.trainable:
                continue
            parent = tree.nodes[n.parent] if n.parent is not None else None
            if parent is not None and parent.kind != "model":
                last_turn = (parent.id, len(parent.token_ids))
            if seen + len(n.token_ids) > offset:
                pos = offset - seen
                return (nid, pos) if pos > 0 else (n.parent, len(parent.token_ids)) if parent else None  # type: ignore[return-value]
            seen += len(n.token_ids)
        key = f"fallback/{leaf}"  # a flat value: replay's dict(tree.meta) copy must not share it
        if self.fallback and last_turn is not None and key not in tree.meta:
            tree.meta[key] = True  # once per path
            return last_turn
        return None


def _minmax(x: list[float]) -> list[float]:
    lo, hi = min(x), max(x)
    return [1.0] * len(x) if hi - lo < 1e-12 else [(v - lo) / (hi - lo) for v in x]


def _fill(points: list[tuple[int, int]], per_point: int, room: int, reason: str) -> list[Fork]:
    forks = []
    for nid, pos in points:
        count = min(per_point, room)
        if count <= 0:
            break
        forks.append(Fork(nid, pos, count, reason))
        room -= count
    return forks


POLICIES = {"none": NoBranching, "turn_entropy": TurnBoundaryEntropy, "token_entropy": TokenEntropyTopK,
            "branching_score": BranchingScore, "fixed_segments": FixedSegments}  # fmt: skip


def make_branch_policy(name: str, **kwargs: object) -> BranchPolicy:
    """A branching policy by name (`none | turn_entropy | token_entropy | branching_score | fixed_segments`)."""
    if name not in POLICIES:
        raise ConfigError(f"unknown branching policy {name!r}; choose one of {sorted(POLICIES)}")
    cls = POLICIES[name]
    known = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(f"branching policy {name!r} has no option {unknown}; its options: {sorted(known)}")
    return cls(**kwargs)  # type: ignore[no-any-return, arg-type]
