"""Success replay and task selection for sparse rewards (ARPO for GUI agents, Lu et al. 2025).

Two pieces, both off by default (docs/trainer.md, "Add-ons"):

- `SuccessBuffer`: per task (env id, seed) the newest `per_task` successful root-to-leaf paths seen in
  training (ARPO keeps 8). When every rollout of a task's group failed, `inject` replaces one failed
  rollout of that group with a buffered success drawn uniformly at random (as ARPO), so GRPO's group has a
  learning signal. The loop injects first, then buffers the step's fresh successes (as ARPO). The replayed turns keep the
  logprobs of the policy that sampled them; the trainer recomputes the old logprobs under the current
  policy, and the truncated importance weight (`is_mode`, `is_max`) corrects for the older behaviour
  policy. A replayed leaf carries `info["replayed"] = True`.
- `TaskSelector`: a finite task pool (the first `pool` data positions) drawn cyclically; each group a
  task gets is a probe of its success rate under the current policy. A task whose last probe was all
  successes, or all failures with nothing buffered to replay, leaves the pool for `refresh` steps, then
  comes back to be measured again.

Departures from ARPO:
1. The probe is the training group itself (ARPO probes the initial policy before training): no extra
   rollouts, and the filter follows the policy as it learns.
2. Replay needs a prompt identical token for token to the buffered one (same task, same renderer).
3. The buffer and the selector are saved with the checkpoint (`AddonState.state_dict`): a resume is exact.
4. With `refill` the zero-variance filter drops all-failed groups before replay could act.
5. ARPO trains the replayed rollout as if on-policy (its old logprobs recomputed, PPO epoch 1: ratio 1);
   we keep its behaviour logprobs, so the truncated weight min(exp(logp_old - logp_behaviour), `is_max`)
   (`is_mode`) corrects for the older policy that sampled it.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from toolgym.trainers.episodes import next_tasks
from toolgym.trainers.loss import KL_SHAPING
from toolgym.trainers.rollout import RolloutTask
from toolgym.trainers.tree import Node, RolloutTree, env_error

TaskKey = tuple[str, int]


def task_key(tree: RolloutTree) -> TaskKey:
    return (str(tree.meta.get("env_id", "")), int(tree.meta.get("seed", -1)))


def succeeded(tree: RolloutTree, leaf: int) -> bool:
    return bool(tree.nodes[leaf].info.get("episode", {}).get("success"))


@dataclass
class Stored:
    """One successful path below the prompt: node copies in order (the last is the leaf)."""

    prompt_ids: list[int]
    nodes: list[Node]


class SuccessBuffer:
    """The newest `per_task` successful paths of each task."""

    def __init__(self, per_task: int = 8, seed: int = 0) -> None:
        if per_task < 1:
            raise ValueError(f"per_task must be >= 1, got {per_task}")
        self.per_task = per_task
        self.rng = random.Random(seed)
        self.paths: dict[TaskKey, deque[Stored]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self.paths.values())

    def has(self, key: TaskKey) -> bool:
        return bool(self.paths.get(key))

    def add(self, forest: list[RolloutTree]) -> int:
        """Stores every fresh (not replayed) success of `forest`; returns how many."""
        n = 0
        for tree in forest:
            for leaf in tree.leaves():
                node = tree.nodes[leaf]
                if not succeeded(tree, leaf) or node.info.get("replayed") or env_error(tree, leaf):
                    continue
                path = [copy.deepcopy(tree.nodes[i]) for i in tree.path(leaf)[1:]]
                for p in path:
                    p.info.pop("snapshot", None)  # env snapshots are large and never replayed
                    p.info.pop(KL_SHAPING, None)  # the replayed copy is shaped again under the policy of then
                path[-1].reward = float(
                    node.info.get("episode", {}).get("episode_reward", node.reward or 0.0)
                )
                q = self.paths.setdefault(task_key(tree), deque(maxlen=self.per_task))
                q.append(Stored(list(tree.nodes[tree.root].token_ids), path))
                n += 1
        return n

    def inject(self, forest: list[RolloutTree]) -> list[RolloutTree]:
        """The forest where each all-failed group with a buffered success (same prompt) has one failed
        rollout replaced by a buffered success of its task, drawn uniformly. Other trees are unchanged."""
        out = []
        for tree in forest:
            leaves = [lf for lf in tree.leaves() if not env_error(tree, lf)]
            stored = self.paths.get(task_key(tree))
            if not leaves or any(succeeded(tree, lf) for lf in leaves) or not stored:
                out.append(tree)
                continue
            same = [s for s in stored if s.prompt_ids == tree.nodes[tree.root].token_ids]
            out.append(replace_one(tree, self.rng.choice(same)) if same else tree)
        return out


def replace_one(tree: RolloutTree, stored: Stored) -> RolloutTree:
    """A copy of `tree` whose last single-leaf branch from the prompt is replaced by `stored` (appended
    as an extra rollout when every branch holds several leaves, as forks do)."""
    new = RolloutTree(tree.uid, list(tree.nodes[tree.root].token_ids), tree.nodes[tree.root].state_key)
    new.meta = dict(tree.meta)
    new.nodes[0].info = dict(tree.nodes[0].info)
    kids = tree.nodes[tree.root].children
    drop = next((c for c in reversed(kids) if len(tree.subtree_leaves(c)) == 1), None)

    def graft(src: int, parent: int) -> None:
        n = tree.nodes[src]
        nid = _add_copy(new, parent, n)
        for c in n.children:
            graft(c, nid)

    for c in kids:
        if c != drop:
            graft(c, new.root)
    parent = new.root
    for n in stored.nodes:
        parent = _add_copy(new, parent, n)
    new.nodes[parent].info["replayed"] = True
    return new


def _add_copy(tree: RolloutTree, parent: int, n: Node) -> int:
    nid = tree.add(
        parent, n.kind, list(n.token_ids), turn=n.turn,
        logprobs=None if n.logprobs is None else list(n.logprobs),
        entropies=None if n.entropies is None else list(n.entropies), state_key=n.state_key,
        step_reward=n.step_reward, branch_reason=n.branch_reason, info=copy.deepcopy(n.info),
    )  # fmt: skip
    if n.reward is not None:
        tree.set_reward(nid, n.reward)
    return nid


@dataclass
class TaskSelector:
    """Cyclic draws over a pool of `pool` tasks, skipping tasks the policy always or never solves.

    >>> s = TaskSelector(["e"], seed=0, pool=3, refresh=2)
    >>> [t.seed for t in s.draw(4, step=1)]
    [0, 1, 2, 0]
    """

    env_ids: list[str]
    seed: int
    pool: int
    refresh: int = 10  # steps a dropped task stays out before it is measured again
    drop_solved: bool = True
    drop_unsolved: bool = True
    tasks: list[RolloutTask] = field(init=False)
    cursor: int = 0
    rate: dict[TaskKey, float] = field(default_factory=dict)  # last measured success rate
    dropped_at: dict[TaskKey, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.pool < 1 or self.refresh < 1:
            raise ValueError(f"pool and refresh must be >= 1, got {self.pool}, {self.refresh}")
        self.tasks = next_tasks(self.env_ids, self.seed, 0, self.pool)

    def active(self, step: int) -> list[RolloutTask]:
        live = [
            t for t in self.tasks
            if (k := (t.env_id, t.seed)) not in self.dropped_at or step - self.dropped_at[k] >= self.refresh
        ]  # fmt: skip
        return live or list(self.tasks)  # every task dropped: the filter gives way rather than stall

    def draw(self, n: int, step: int) -> list[RolloutTask]:
        live = {(t.env_id, t.seed) for t in self.active(step)}
        out: list[RolloutTask] = []
        while len(out) < n:
            t = self.tasks[self.cursor % self.pool]
            self.cursor += 1
            if (t.env_id, t.seed) in live:
                out.append(t)
        return out

    def observe(self, forest: list[RolloutTree], step: int, buffer: SuccessBuffer | None = None) -> None:
        """Records each group's success rate (fresh rollouts only) and drops the tasks it rules out."""
        for tree in forest:
            leaves = [
                lf
                for lf in tree.leaves()
                if not env_error(tree, lf) and not tree.nodes[lf].info.get("replayed")
            ]
            if not leaves:
                continue
            key = task_key(tree)
            r = sum(succeeded(tree, lf) for lf in leaves) / len(leaves)
            self.rate[key] = r
            solved = self.drop_solved and r == 1.0
            unsolved = self.drop_unsolved and r == 0.0 and not (buffer is not None and buffer.has(key))
            if solved or unsolved:
                self.dropped_at[key] = step
            else:
                self.dropped_at.pop(key, None)

    def metrics(self, step: int) -> dict[str, float]:
        return {
            "rollout/active_tasks": float(len(self.active(step))),
            "rollout/measured_tasks": float(len(self.rate)),
        }


def make(cfg: Any) -> tuple[SuccessBuffer | None, TaskSelector | None]:
    """The buffer and selector a GRPO/PPO config asks for (None when off)."""
    buf = SuccessBuffer(cfg.replay_per_task, cfg.seed) if cfg.replay else None
    sel = (
        TaskSelector(cfg.env_ids, cfg.seed, cfg.task_pool, cfg.task_filter_refresh)
        if cfg.task_pool > 0
        else None
    )
    return buf, sel
