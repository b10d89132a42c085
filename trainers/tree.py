"""Rollout trees: what the rollout engine records and what the estimators and the loss read.

A tree holds every rollout of one prompt (its `uid`). Nodes are the prompt, model turns and env/tool/user
messages, each with the exact token ids the engine produced (never re-tokenised), a loss mask that is 1
only on model tokens, the engine's logprobs, optional per-token top-k entropies, the turn index, and the
env state key of the turn (the GiGPO anchor). Independent sampling is a tree of depth one (G children of
the prompt, each a chain of turns). A fork inside a node splits it in two, so every branch point is a
node boundary and a root-to-leaf path is a plain list of nodes.

Flattening turns each leaf path into one training row. A node shared by d kept rows is trained:
- `shared="repeat"` (ARPO's "soft" attribution): in each of the d rows, each copy with its own row's
  advantage A_i. The node's gradient is sum_i A_i grad log p(node), and its tokens count d times in a
  token-mean denominator.
- `shared="once"` (ARPO's "hard" attribution): in one row only (the first KEPT row that holds it; the
  others see it as context), with the mean advantage (1/d) sum_i A_i over the kept rows that hold it.
  Its gradient is 1/d of the "repeat" one, and its tokens count once in the denominator.
"Kept" means after the filters (void, truncation, zero-advantage groups): `flatten(..., keep=...)`.
Leaves whose episode ended in an infrastructure fault (`truncation == "env_error"`) get no row at all:
the env's failure is neither trained on nor scored against the group.

Segments: a branch point is a node with two or more children (counting only children with a row below
them); a segment is a maximal chain of nodes between branch points (model turns, tool/env messages and
forks of one unbranched stretch). Every node of a segment has the same leaves below it, hence the same
value; tree estimators give one advantage per segment (SPO, TreeRL).

>>> t = RolloutTree(uid="q0", prompt_ids=[1, 2])
>>> a = t.add(t.root, "model", [3, 4], turn=0)
>>> b = t.add(t.root, "model", [5], turn=0)
>>> t.set_reward(a, 1.0); t.set_reward(b, 0.0)
>>> [r.token_ids for r in flatten([t])]
[[1, 2, 3, 4], [1, 2, 5]]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

NodeKind = Literal["prompt", "model", "tool", "env", "user"]
SharedMode = Literal["repeat", "once"]


@dataclass
class Node:
    """One segment of a rollout. `logprobs`/`entropies`, when given, have one value per token."""

    id: int
    parent: int | None  # None only for the prompt node
    kind: NodeKind
    token_ids: list[int]
    turn: int = -1  # model turn index k (env messages carry the turn they answer; -1 for the prompt)
    logprobs: list[float] | None = None  # engine logprobs of `token_ids` (model nodes)
    entropies: list[float] | None = None  # per-token (top-k) entropy from the engine (model nodes)
    # per-token policy version that sampled each token (asynchronous rollouts, trainers/async_rollout.py);
    # None in the synchronous loop, where every token of a step comes from the same weights
    versions: list[int] | None = None
    state_key: str | None = None  # hash/text of the env state this model turn acts from (GiGPO anchor)
    step_reward: float = 0.0  # env reward received for this model turn's action
    reward: float | None = None  # outcome reward of the episode ending at this leaf
    branch_reason: str = "global"  # why this node starts a new branch: global|entropy|token|score|split
    children: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # tool calls, void/truncated flags, env state…

    @property
    def trainable(self) -> bool:
        return self.kind == "model"


class RolloutTree:
    """All rollouts of one prompt. Node ids are indices into `nodes`; node 0 is the prompt."""

    def __init__(self, uid: str, prompt_ids: list[int], state_key: str | None = None) -> None:
        self.uid = uid
        self.nodes: list[Node] = [Node(0, None, "prompt", list(prompt_ids), state_key=state_key)]
        self.meta: dict[str, Any] = {}  # per-tree, per-batch state of a branching policy (never global)

    @property
    def root(self) -> int:
        return 0

    def add(self, parent: int, kind: NodeKind, token_ids: list[int], **fields: Any) -> int:
        """Appends a child of `parent` and returns its id."""
        node = Node(len(self.nodes), parent, kind, list(token_ids), **fields)
        if node.logprobs is not None and len(node.logprobs) != len(node.token_ids):
            raise ValueError(f"node {node.id}: {len(node.logprobs)} logprobs for {len(token_ids)} tokens")
        if node.versions is not None and len(node.versions) != len(node.token_ids):
            raise ValueError(f"node {node.id}: {len(node.versions)} versions for {len(token_ids)} tokens")
        self.nodes.append(node)
        self.nodes[parent].children.append(node.id)
        return node.id

    def split(self, node_id: int, pos: int) -> int:
        """Cuts node `node_id` after its first `pos` tokens; returns the id of the prefix node.

        The prefix keeps the id (so paths through it stay valid); the suffix becomes its only child and
        takes over its children, step reward, outcome reward and info. A new branch at `pos` is then a
        second child of the prefix. `pos == len(tokens)` needs no split and returns `node_id`.
        """
        node = self.nodes[node_id]
        if not 0 < pos <= len(node.token_ids):
            raise ValueError(f"split position {pos} outside node {node_id} of {len(node.token_ids)} tokens")
        if pos == len(node.token_ids):
            return node_id
        tail = Node(
            len(self.nodes),
            node_id,
            node.kind,
            node.token_ids[pos:],
            turn=node.turn,
            logprobs=None if node.logprobs is None else node.logprobs[pos:],
            entropies=None if node.entropies is None else node.entropies[pos:],
            versions=None if node.versions is None else node.versions[pos:],
            state_key=None,
            step_reward=node.step_reward,
            reward=node.reward,
            branch_reason="split",
            children=node.children,
            info=node.info,
        )
        for c in tail.children:
            self.nodes[c].parent = tail.id
        node.token_ids = node.token_ids[:pos]
        node.logprobs = None if node.logprobs is None else node.logprobs[:pos]
        node.entropies = None if node.entropies is None else node.entropies[:pos]
        node.versions = None if node.versions is None else node.versions[:pos]
        node.step_reward, node.reward, node.children, node.info = 0.0, None, [tail.id], {}
        self.nodes.append(tail)
        return node_id

    def set_reward(self, leaf: int, reward: float) -> None:
        self.nodes[leaf].reward = float(reward)

    def leaves(self) -> list[int]:
        """Leaf ids in creation order (the root is never a leaf once anything was generated)."""
        return [n.id for n in self.nodes if not n.children and n.id != self.root]

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to `node_id`."""
        out: list[int] = []
        cur: int | None = node_id
        while cur is not None:
            out.append(cur)
            cur = self.nodes[cur].parent
        return out[::-1]

    def subtree_leaves(self, node_id: int) -> list[int]:
        """Leaves below (or equal to) `node_id`, in creation order."""
        out, stack = [], [node_id]
        while stack:
            n = self.nodes[stack.pop()]
            if n.children:
                stack.extend(reversed(n.children))
            else:
                out.append(n.id)
        return sorted(out)

    def prefix_ids(self, node_id: int, pos: int | None = None) -> list[int]:
        """Token ids from the root to `node_id`, cut after `pos` tokens of that node (default: all)."""
        ids: list[int] = []
        for n in self.path(node_id)[:-1]:
            ids += self.nodes[n].token_ids
        last = self.nodes[node_id].token_ids
        return ids + (last if pos is None else last[:pos])

    def depth(self, node_id: int) -> int:
        return len(self.path(node_id)) - 1

    def branch_count(self) -> int:
        """Nodes that start a branch other than the global samples (forks, not splits)."""
        return sum(n.branch_reason not in ("global", "split") for n in self.nodes)


@dataclass(frozen=True)
class Row:
    """One root-to-leaf path, flattened. Lists have one entry per token ([T])."""

    tree: int  # index of the tree in the forest (= the GRPO group)
    leaf: int  # leaf node id
    nodes: tuple[int, ...]  # node ids root → leaf
    token_ids: list[int]  # [T]
    loss_mask: list[int]  # [T] 1 on model tokens this row trains
    node_ids: list[int]  # [T] node of each token
    turn_ids: list[int]  # [T] turn index of each token (-1 on the prompt)
    logprobs: list[float]  # [T] engine logprobs (0.0 where unknown or not a model token)
    entropies: list[float]  # [T] engine top-k entropies (0.0 where unknown)
    versions: list[int] = field(default_factory=list)  # [T] policy version per token (-1 unknown/not model)


def env_error(tree: RolloutTree, leaf: int) -> bool:
    """True when the episode ending at `leaf` was cut by an infrastructure fault (not the model's doing)."""
    return tree.nodes[leaf].info.get("episode", {}).get("truncation") == "env_error"


def truncated(tree: RolloutTree, leaf: int) -> bool:
    """True when the episode ending at `leaf` was cut (turn limit, token budget, timeout), not ended."""
    return bool(tree.nodes[leaf].info.get("episode", {}).get("truncated"))


def flatten(
    forest: list[RolloutTree],
    shared: SharedMode = "repeat",
    keep: list[bool] | None = None,
    drop_truncated: bool = False,
) -> list[Row]:
    """One row per leaf (env_error leaves excepted), trees in order. See the module docstring for `shared`.

    `drop_truncated` also leaves out truncated episodes (SimpleTIR's `remove_clip`).

    `keep` (one flag per row, in the order this function returns them) matters only for `shared="once"`:
    a shared node is trained by the first kept row that holds it; a node held by no kept row by none.

    >>> t = RolloutTree("q", [1])
    >>> a = t.add(t.root, "model", [2, 3], turn=0)
    >>> _ = t.add(a, "model", [4], turn=0, branch_reason="split"); _ = t.add(a, "model", [5], turn=0)
    >>> [r.loss_mask for r in flatten([t], shared="once")]
    [[0, 1, 1, 1], [0, 0, 0, 1]]
    >>> [r.loss_mask for r in flatten([t], shared="once", keep=[False, True])]
    [[0, 0, 0, 0], [0, 1, 1, 1]]
    """
    if shared not in ("repeat", "once"):
        raise ValueError(f"shared must be 'repeat' or 'once', got {shared!r}")
    paths = [
        (ti, leaf)
        for ti, tree in enumerate(forest)
        for leaf in tree.leaves()
        if not env_error(tree, leaf) and not (drop_truncated and truncated(tree, leaf))
    ]
    if keep is not None and len(keep) != len(paths):
        raise ValueError(f"keep has {len(keep)} flags for {len(paths)} rows")
    owner: dict[tuple[int, int], int] = {}  # (tree, node) -> index of the row that trains it ("once")
    for i, (ti, leaf) in enumerate(paths):
        if keep is None or keep[i]:
            for nid in forest[ti].path(leaf):
                owner.setdefault((ti, nid), i)
    rows: list[Row] = []
    for i, (ti, leaf) in enumerate(paths):
        tree = forest[ti]
        path = tree.path(leaf)
        ids: list[int] = []
        mask: list[int] = []
        nids: list[int] = []
        turns: list[int] = []
        lps: list[float] = []
        ents: list[float] = []
        vers: list[int] = []
        for nid in path:
            n = tree.nodes[nid]
            k = len(n.token_ids)
            train = n.trainable and (shared == "repeat" or owner.get((ti, nid)) == i)
            if shared == "repeat" and keep is not None and not keep[i]:
                train = False
            ids += n.token_ids
            mask += [int(train)] * k
            nids += [nid] * k
            turns += [n.turn] * k
            lps += list(n.logprobs) if n.logprobs is not None else [0.0] * k
            ents += list(n.entropies) if n.entropies is not None else [0.0] * k
            vers += list(n.versions) if n.versions is not None else [-1] * k
        rows.append(Row(ti, leaf, tuple(path), ids, mask, nids, turns, lps, ents, vers))
    return rows


def segment_heads(tree: RolloutTree, leaves: set[int] | None = None) -> dict[int, int]:
    """The first node of the segment each node belongs to (see the module docstring). `leaves`: the
    leaves that have rows (default all); children without such a leaf below them do not make a branch.

    >>> t = RolloutTree("q", [1])
    >>> a = t.add(t.root, "model", [2], turn=0); e = t.add(a, "env", [3], turn=0)
    >>> b = t.add(e, "model", [4], turn=1); c = t.add(e, "model", [5], turn=1)
    >>> segment_heads(t)
    {0: 0, 1: 1, 2: 1, 3: 3, 4: 4}
    """
    live = set(tree.leaves()) if leaves is None else leaves
    alive: dict[int, bool] = {}

    def has_live(nid: int) -> bool:
        if nid not in alive:
            alive[nid] = any(leaf in live for leaf in tree.subtree_leaves(nid))
        return alive[nid]

    heads = {tree.root: tree.root}
    stack = [tree.root]
    while stack:
        nid = stack.pop()
        kids = [c for c in tree.nodes[nid].children if has_live(c)]
        for c in kids:
            heads[c] = c if nid == tree.root or len(kids) > 1 else heads[nid]
            stack.append(c)
    return heads


@dataclass(frozen=True)
class Turn:
    """One model turn of a row: its index, anchor state, env reward, and the nodes that hold its tokens.

    `state_key` identifies the env state the turn acts from: the env's own key (`info["state_key"]`,
    `env_key` True) or else a hash of the newest env messages; `state_text` is those messages as text
    (for GiGPO's similarity mode), when the rollout recorded it.
    """

    index: int
    state_key: str | None
    step_reward: float
    nodes: tuple[int, ...]
    state_text: str | None = None
    env_key: bool = False


def row_turns(tree: RolloutTree, row: Row) -> list[Turn]:
    """The model turns along a row, in order (a turn split by forks spans several nodes)."""
    turns: dict[int, list[Node]] = {}
    for nid in row.nodes:
        n = tree.nodes[nid]
        if n.trainable:
            turns.setdefault(n.turn, []).append(n)
    return [
        Turn(
            k,
            ns[0].state_key,
            sum(n.step_reward for n in ns),
            tuple(n.id for n in ns),
            ns[0].info.get("state_text"),
            bool(ns[0].info.get("env_key", False)),
        )
        for k, ns in sorted(turns.items())
    ]


def leaf_rewards(forest: list[RolloutTree], rows: list[Row]) -> list[float]:
    """Outcome reward of each row's leaf; a leaf without one is an error (say where it is)."""
    out = []
    for r in rows:
        reward = forest[r.tree].nodes[r.leaf].reward
        if reward is None:
            raise ValueError(f"tree {forest[r.tree].uid!r} leaf {r.leaf} has no reward; call set_reward")
        out.append(reward)
    return out
