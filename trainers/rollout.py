"""The rollout engine: runs envs with a token-level policy and grows one rollout tree per task.

Per batch of tasks it starts `branch.global_samples(budget)` paths per tree, then works in rounds: all
pending turns of all trees are generated in one `policy.generate` call (ids in, ids + logprobs out; the
prompt of a turn is the tree's token prefix, never re-rendered), the branching policy may fork after
the round (`on_turns`), every new turn is stepped in its env, and each continuing path gets an env node
(the template's end of turn + the env messages + the next generation prompt, loss mask 0). When every
path has ended, a policy with `top_up` (ARPO) fills trees that ended below the budget with fresh global
samples, and `on_complete` may fork inside finished turns (TreeRL/APPO); the loop runs again for them.

Forking an env: a forkable env (`env.unwrapped.supports_fork`) is snapshotted with `get_state()` on every
env node while a branching policy is active, and a fork restores the snapshot into a pooled env with
`set_state`; otherwise the fork resets a pooled env with the task's seed and replays the path's actions.

Departures from the papers / official code:
1. ARPO copies a path and samples again from the tool result; here the fork resamples the turn that
   follows the tool node (paper timing; see branching.py departure 2), so the decided-on turn stays in the
   tree as a sibling of the new ones.
2. Envs are stepped through `env.unwrapped` (the ToolEnv): gymnasium wrappers keep state (TimeLimit's
   step count) that `set_state` cannot restore; the env's own `max_turns` ends episodes instead.
3. A path whose next prompt would exceed `max_total_tokens` ends there, truncated, with the sum of the
   env rewards it got (ARPO/TRL drop the overflowing tool result the same way).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolgym.trainers.branching import BranchPolicy, NoBranching, apply_forks
from toolgym.trainers.tree import RolloutTree


@dataclass(frozen=True)
class RolloutConfig:
    budget: int = 8  # leaves (complete paths) per tree: the group size
    max_new_tokens: int = 128  # tokens per model turn
    temperature: float = 1.0  # sampling temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling
    max_total_tokens: int = 2048  # a path whose next prompt is longer ends there (truncated)
    entropies: bool = False  # ask the engine for per-token entropies (turn_entropy/branching_score need them)


@dataclass(frozen=True)
class RolloutTask:
    env_id: str
    seed: int


@dataclass
class _Req:
    """Generate one turn for tree `tree` from node `parent`, with `env` in the state before that turn."""

    tree: int
    parent: int
    reason: str
    env: Any


@dataclass
class RolloutStats:
    generated_tokens: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0
    generate_calls: int = 0
    forks: dict[str, int] = field(default_factory=dict)


def _gold(env: Any) -> str | None:
    """The env's hidden answer (for IGPO's info-gain scorer), when it has one."""
    try:
        answer = env.task.answer
    except Exception:  # an env without tasks or answers: IGPO falls back to outcome-only rewards
        return None
    return None if answer is None else str(answer)


def state_text(messages: list[dict[str, Any]]) -> str:
    """The env messages' contents as one text (GiGPO's similarity mode compares these)."""
    return "\n".join(str(m.get("content") or "") for m in messages)


def anchor(messages: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """Node fields of the env state a model turn acts from: the env's own `info["state_key"]` when it
    reports one (then `env_key` is True), else a hash of the messages; plus the messages as text."""
    key = info.get("state_key")
    return {
        "state_key": str(key) if key is not None else state_key(messages),
        "info": {"state_text": state_text(messages), "env_key": key is not None},
    }


def state_key(messages: list[dict[str, Any]]) -> str:
    """A short stable hash of the env messages a turn acts from (the GiGPO anchor).

    >>> state_key([{"role": "tool", "content": "4"}]) == state_key([{"content": "4", "role": "tool"}])
    True
    """
    return hashlib.sha1(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()[:16]


class TreeRollout:
    """Grows rollout trees with `policy` (a `TokenPolicy`: `generate`, `renderer`) in envs made by id."""

    def __init__(
        self,
        policy: Any,
        branch: BranchPolicy | None = None,
        cfg: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.renderer = policy.renderer
        self.branch: BranchPolicy = branch or NoBranching()
        self.cfg = cfg or RolloutConfig()
        self.env_kwargs = dict(env_kwargs or {})
        self._pool: dict[str, list[Any]] = {}
        self._wrappers: list[Any] = []
        self.snapshots = not isinstance(self.branch, NoBranching)

    # ----- the loop ----------------------------------------------------------------------------------------
    def run(self, tasks: list[RolloutTask], seed: int) -> tuple[list[RolloutTree], RolloutStats]:
        """One tree per task. `seed` fixes the branching draws and the sampling of every generate call."""
        rng = np.random.default_rng(seed)
        stats = RolloutStats()
        split = bool(getattr(self.branch, "dynamic_split", False))
        forest: list[RolloutTree] = []
        reqs: list[_Req] = []
        for ti, task in enumerate(tasks):
            env = self._acquire(task.env_id)
            obs, info = env.reset(seed=task.seed)
            tools = list(info.get("tools") or [])
            where = anchor(obs, info)
            tree = RolloutTree(
                f"{task.env_id}#{task.seed}", self.renderer.prompt_ids(obs, tools), where["state_key"]
            )
            tree.nodes[tree.root].info.update(where["info"])
            tree.meta.update(env_id=task.env_id, seed=task.seed, tools=tools, answer=_gold(env))
            if self.snapshots and env.supports_fork:
                tree.nodes[tree.root].info["snapshot"] = env.get_state()
            forest.append(tree)
            n = 1 if split else self.branch.global_samples(self.cfg.budget)
            tree.meta["probe"] = split
            reqs += [
                _Req(ti, tree.root, "global", env if i == 0 else self._env_at(tree, tree.root))
                for i in range(n)
            ]
        if split:  # AEPO: one unforked pre-monitoring path per tree decides how many global samples follow
            self._rounds(forest, reqs, rng, stats)
            reqs = []
            for ti, tree in enumerate(forest):
                tree.meta["probe"] = False
                tree.meta["global_samples"] = m = self.branch.split_budget(tree, self.cfg.budget)  # type: ignore[attr-defined]
                reqs += [_Req(ti, tree.root, "global", self._env_at(tree, tree.root)) for _ in range(m - 1)]
        self._rounds(forest, reqs, rng, stats)
        if getattr(self.branch, "top_up", False):  # ARPO: fresh global samples up to the budget
            reqs = [
                _Req(ti, tree.root, "global", self._env_at(tree, tree.root))
                for ti, tree in enumerate(forest)
                for _ in range(self.cfg.budget - len(tree.leaves()))
            ]
            self._rounds(forest, reqs, rng, stats)
        for it in range(64):  # on_complete iterations (TreeRL's L); 64 is a safety net
            reqs = []
            for ti, tree in enumerate(forest):
                forks = self.branch.on_complete(tree, it, self.cfg.budget - len(tree.leaves()), rng)
                reqs += self._fork_requests(ti, tree, forks, stats)
            if not reqs:
                break
            self._rounds(forest, reqs, rng, stats)
        return forest, stats

    def _rounds(
        self, forest: list[RolloutTree], reqs: list[_Req], rng: np.random.Generator, stats: RolloutStats
    ) -> None:
        while reqs:
            new = self._generate(forest, reqs, rng, stats)
            extra: list[_Req] = []
            for ti in sorted({r.tree for r, _ in new}):
                tree = forest[ti]
                nodes = [nid for r, nid in new if r.tree == ti]
                forks = self.branch.on_turns(tree, nodes, self.cfg.budget - len(tree.leaves()), rng)
                extra += self._fork_requests(ti, tree, forks, stats)
            if extra:
                new += self._generate(forest, extra, rng, stats)
            t0 = time.perf_counter()
            stepped = [self._step(forest[r.tree], r, nid) for r, nid in new]
            stats.env_s += time.perf_counter() - t0
            reqs = [r for r in stepped if r is not None]

    def _fork_requests(self, ti: int, tree: RolloutTree, forks: list[Any], stats: RolloutStats) -> list[_Req]:
        out = []
        for parent, count, reason in apply_forks(tree, forks):
            stats.forks[reason] = stats.forks.get(reason, 0) + count
            out += [_Req(ti, parent, reason, self._env_at(tree, parent)) for _ in range(count)]
        return out

    def _generate(
        self, forest: list[RolloutTree], reqs: list[_Req], rng: np.random.Generator, stats: RolloutStats
    ) -> list[tuple[_Req, int]]:
        from toolgym.agents.policy import SamplingParams

        out: list[tuple[_Req, int]] = []
        # rows continuing a cut turn may only add what is left of the turn's token allowance
        groups: dict[int, list[_Req]] = {}
        for r in reqs:
            left = self.cfg.max_new_tokens - len(self._partial_turn(forest[r.tree], r.parent))
            groups.setdefault(max(1, left), []).append(r)
        for left, group in groups.items():
            sp = SamplingParams(
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                max_new_tokens=left,
                seed=int(rng.integers(2**31)),
                return_entropies=self.cfg.entropies,
            )
            t0 = time.perf_counter()
            gens = self.policy.generate([forest[r.tree].prefix_ids(r.parent) for r in group], sp)
            stats.generate_s += time.perf_counter() - t0
            stats.generate_calls += 1
            for r, g in zip(group, gens, strict=True):
                tree = forest[r.tree]
                parent = tree.nodes[r.parent]
                turn = (
                    parent.turn
                    if parent.kind == "model"
                    else (0 if parent.kind == "prompt" else parent.turn + 1)
                )
                key = None if parent.kind == "model" else parent.state_key
                info: dict[str, Any] = {"finish": g.finish_reason}
                if parent.kind != "model":
                    info.update(
                        state_text=parent.info.get("state_text"), env_key=parent.info.get("env_key", False)
                    )
                nid = tree.add(
                    r.parent, "model", g.token_ids, turn=turn, logprobs=list(g.logprobs),
                    entropies=list(g.entropies) if g.entropies is not None else None,
                    state_key=key, branch_reason=r.reason, info=info,
                )  # fmt: skip
                stats.generated_tokens += len(g.token_ids)
                out.append((r, nid))
        return out

    def _step(self, tree: RolloutTree, req: _Req, nid: int) -> _Req | None:
        """Steps the env with the finished turn; returns the request for the next turn, or None at the end."""
        node = tree.nodes[nid]
        turn_ids = self._partial_turn(tree, nid)
        text = self.renderer.decode(self.renderer.strip_stop(turn_ids))
        env = req.env
        obs, reward, terminated, truncated, info = env.step(text)
        node.step_reward = float(reward)
        node.info.update(
            action=text,
            invalid=bool(info.get("invalid_action", False)),
            tool_calls=int(info.get("tool_calls", 0)),
        )
        end: dict[str, Any] | None = None
        if terminated or truncated:
            end = {
                "success": bool(info.get("success", False)),
                "truncation": info.get("truncation"),
                "episode_reward": float(info.get("episode_reward", 0.0)),
                # cut (turn limit, token budget, timeout, env error), not ended by the task: GAE bootstraps
                "truncated": bool(truncated) and not terminated,
            }
        else:
            suffix = self.renderer.close_turn(turn_ids) + self.renderer.env_suffix(obs)
            if len(tree.prefix_ids(nid)) + len(suffix) + 1 > self.cfg.max_total_tokens:
                ret = sum(tree.nodes[n].step_reward for n in tree.path(nid))
                end = {
                    "success": False,
                    "truncation": "token_budget",
                    "episode_reward": ret,
                    "truncated": True,
                }
        if end is not None:
            path = tree.path(nid)
            end.update(
                turns=node.turn + 1,
                tool_calls=sum(tree.nodes[n].info.get("tool_calls", 0) for n in path),
                void=any(tree.nodes[n].info.get("invalid", False) for n in path),
                tokens=len(tree.prefix_ids(nid)),
            )
            node.info["episode"] = end
            tree.set_reward(nid, end["episode_reward"])
            self._release(tree.meta["env_id"], env)
            return None
        kind = "tool" if any(m.get("role") == "tool" for m in obs) else "user"
        where = anchor(obs, info)
        env_node = tree.add(
            nid, kind, suffix, turn=node.turn, state_key=where["state_key"], info=where["info"]
        )
        if self.snapshots and env.supports_fork:
            tree.nodes[env_node].info["snapshot"] = env.get_state()
        return _Req(req.tree, env_node, "global", env)

    # ----- helpers -----------------------------------------------------------------------------------------
    @staticmethod
    def _partial_turn(tree: RolloutTree, node_id: int) -> list[int]:
        """Token ids of the model turn that ends at `node_id` (its earlier pieces when the turn was cut)."""
        ids: list[int] = []
        cur: int | None = node_id
        while cur is not None and tree.nodes[cur].kind == "model":
            ids = tree.nodes[cur].token_ids + ids
            cur = tree.nodes[cur].parent
        return ids

    def _env_at(self, tree: RolloutTree, node_id: int) -> Any:
        """A pooled env in the state before the next turn from `node_id` (restored, or replayed)."""
        anchor = node_id
        while tree.nodes[anchor].kind == "model":
            anchor = tree.nodes[anchor].parent  # type: ignore[assignment]
        env = self._acquire(tree.meta["env_id"])
        env.reset(seed=tree.meta["seed"])
        snap = tree.nodes[anchor].info.get("snapshot")
        if snap is not None:
            env.set_state(snap)
            return env
        for n in tree.path(anchor):  # replay: the actions of the turns before the anchor
            if "action" in tree.nodes[n].info:
                env.step(tree.nodes[n].info["action"])
        return env

    def _acquire(self, env_id: str) -> Any:
        pool = self._pool.setdefault(env_id, [])
        if pool:
            return pool.pop()
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids)
        from toolgym.envs.base import tool_env

        wrapped = gym.make(env_id, **self.env_kwargs)
        self._wrappers.append(wrapped)
        return tool_env(wrapped)

    def _release(self, env_id: str, env: Any) -> None:
        self._pool.setdefault(env_id, []).append(env)

    def close(self) -> None:
        for w in self._wrappers:
            with contextlib.suppress(Exception):  # best effort: a failing close must not hide results
                w.close()
        self._wrappers, self._pool = [], {}
