"""The rollout engine: runs envs with a token-level policy and grows one rollout tree per task.

Each tree grows by its own loop (`_grow`, a generator): it starts `branch.global_samples(budget)` paths,
then works in rounds: all pending turns of the tree are generated (ids in, ids + logprobs out; the prompt
of a turn is the tree's token prefix, never re-rendered), the branching policy may fork after the round
(`on_turns`), every new turn is stepped in its env, and each continuing path gets an env node (the
template's end of turn + the env messages + the next generation prompt, loss mask 0). When every path has
ended, a policy with `top_up` (ARPO) fills a tree that ended below the budget with fresh global samples,
and `on_complete` may fork inside finished turns (TreeRL/APPO); the rounds run again for them.

A tree's loop never touches the policy or an env itself: it is an episode of the one episode loop
(agents/episode_loop.py): it yields work (turns to generate, env calls to make) and gets the results back,
so the tree's contents (node order included) depend only on what was generated, never on how the work was
scheduled. The loop runs every tree of a batch in one of its two modes:
- rounds (`HFPolicy`, any `TokenPolicy`): the pending turns of every tree in one `policy.generate` call per
  token allowance, then every env call, one after another, on this thread;
- continuous (a policy with an `engine`, our `EnginePolicy`): each tree's turns go to the engine as soon
  as they are ready and leave its batch the step they end (`Engine.submit/step`), env calls run on a
  thread pool while the GPU decodes the other trees; a turn that continues a path prefills only the env
  reply (its KV stays in the slot) and a branch forks the KV of the turn it starts from (`Engine.fork`,
  through the policy's prefix index): nothing is prefilled twice.
Branching draws come from one generator per tree (seeded by the run seed and the tree's index), so both
modes make the same branching decisions given the same turns and entropies.

Keyed sampling (`RolloutConfig.keys`, the trainers' `rollout_keys`; continuous mode only): every turn is
submitted with a sampling key (`Engine.submit(key=)`: its noise is a hash of (key, token position), see
agents/engine/sampling.py), so what a turn samples does not depend on env timing, admission order or which
other turns share the batch. Keys name paths, never moments: a tree's key is `request_key(seed, tree index)`,
the k-th path started from a node gets `request_key(K, k)` where K is the key of the path through that node
(`_PathKeys`: the root's is the tree's key; a global sample, a fork and an ARPO top-up are all children this
way), and a path keeps its key over its turns (their positions differ). Two branches that share a prefix
thus get different keys; the same (seed, tree) grows the same tree, turn for turn, up to the logits' float
rounding (which on a GPU may depend on the batch's size: a near-tie may then go the other way). Off by default:
the engine's one generator, as before.

Each model turn is parsed once, by its env: the env call reads it (`ToolEnv.read_action`) and steps with
that reading, and the turn's node keeps the calls the env read (`info["calls"]`, shown by saved_rollouts).

Forking an env: see trainers/rollout_envs.py (a snapshot restored, or the path's actions replayed).

Env faults: an exception from `env.step` ends that path as an infrastructure failure
(`episode.truncation == "env_error"`: no training row, not scored, tree.flatten leaves it out); the env
is closed, not pooled. A fork whose env cannot be restored is dropped. A failing first `reset` raises.
A turn no rollout server answered (continuous mode, `TurnFailed` from the engine's step: agents/vllm_policy.py)
ends its path the same way, with an empty model node as its leaf (`info["infra_error"]`); its env is pooled
again (it did nothing wrong) and the other paths go on.

Departures from the papers / official code:
1. ARPO copies a path and samples again from the tool result; here the fork resamples the turn that
   follows the tool node (paper timing; see branching.py departure 2), so the decided-on turn stays in the
   tree as a sibling of the new ones.
2. Envs are stepped through `env.unwrapped` (the ToolEnv): gymnasium wrappers keep state (TimeLimit's
   step count) that `set_state` cannot restore; the env's own `max_turns` ends episodes instead.
3. A path whose next prompt would exceed `max_total_tokens` ends there, truncated, with the sum of the
   env rewards it got (ARPO/TRL drop the overflowing tool result the same way).
4. Rounds are per tree (ARPO's code waits for the whole batch at each turn): a tree's next round starts
   when its own turns and env steps are done, whatever the other trees are doing.

Asynchronous rollouts (`gate`, trainers/async_rollout.py): the policy samples from weights the learner
publishes while trees grow. Rounds mode holds the gate's lock for each `generate` call and tags the turn with
the version it held; continuous mode picks up a newly published version at the safe point before each engine
step (`on_step`) and tags every token with the version of the step that sampled it, so a turn in flight
continues under the new weights (a partial rollout) and its earlier tokens keep their version and logprobs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from toolgym.agents.episode_loop import (
    EnvCalls,
    EpisodeLoop,
    Fault,
    Generate,
    LoopStats,
    close_quietly,
    submit_turn,
    turn_room,
)
from toolgym.errors import ConfigError
from toolgym.ray_envs import RaySpec, tree_envs
from toolgym.trainers.branching import BranchPolicy, NoBranching, apply_forks
from toolgym.trainers.tree import NodeKind, RolloutTree


@dataclass(frozen=True)
class RolloutConfig:
    budget: int = 8  # leaves (complete paths) per tree: the group size
    max_new_tokens: int = 128  # tokens per model turn
    temperature: float = 1.0  # sampling temperature (0: greedy)
    top_p: float = 1.0  # nucleus sampling
    max_total_tokens: int = 2048  # a path whose next prompt is longer ends there (truncated)
    entropies: bool = False  # ask the engine for per-token entropies (turn_entropy/branching_score need them)
    keys: bool = False  # key every turn's sampling by its path (module docstring; the trainers' rollout_keys)


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
    key: int = 0  # the path's sampling key (0: unkeyed, the engine's generator)


@dataclass(frozen=True)
class KeyedPrompt:
    """A turn's prompt ids and the sampling key its engine turn is submitted with (keyed rollouts)."""

    ids: list[int]
    key: int


def tree_key(seed: int, ti: int) -> int:
    """The sampling key of tree `ti` of a batch sampled with `seed` (nonzero int64)."""
    from toolgym.agents.engine.sampling import request_key

    return request_key(seed, ti)


class _PathKeys:
    """A tree's path keys: the key each model node was sampled with (the root: the tree's key), and how many
    paths each key has started; a node without one (an env node, the tail of a cut turn) has its path's."""

    def __init__(self, root: int, key: int) -> None:
        self.of_node: dict[int, int] = {root: key}
        self.started: dict[int, int] = {}

    def path_key(self, tree: RolloutTree, node: int) -> int:
        cur: int | None = node
        while cur is not None:
            if cur in self.of_node:
                return self.of_node[cur]
            cur = tree.nodes[cur].parent
        raise AssertionError("the root has a key")

    def start(self, tree: RolloutTree, parent: int) -> int:
        """The key of a new path from `parent`: its path's key K, the k-th path K started (request_key(K, k))."""
        from toolgym.agents.engine.sampling import request_key

        k = self.path_key(tree, parent)
        i = self.started.get(k, 0)
        self.started[k] = i + 1
        return request_key(k, i)


@dataclass
class RolloutStats(LoopStats):
    """The episode loop's times (`generate_s`, `env_s`, `generate_calls`, `idle_s`, `wall_s`) and the trees'."""

    generated_tokens: int = 0
    env_errors: int = 0  # paths ended (or forks dropped) by an infrastructure fault: env or rollout server
    server_errors: int = 0  # of those: turns no rollout server answered (`TurnFailed`)
    lost_env_workers: int = 0  # env_workers=ray: workers that died or passed env_call_timeout_s (this run)
    forks: dict[str, int] = field(default_factory=dict)


Grow = Generator[Generate | EnvCalls, list[Any], None]


def _gold(env: Any) -> str | None:
    """The env's hidden answer (for IGPO's info-gain scorer), when it has one."""
    try:
        answer = env.task.answer
    except Exception:  # an env without tasks or answers: IGPO falls back to outcome-only rewards
        return None
    # aliases (Search-v0): the first is the canonical form, not the list's repr
    if isinstance(answer, (list, tuple)):
        answer = answer[0] if answer else None
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
    """Grows rollout trees with `policy` (a `TokenPolicy`: `generate`, `renderer`) in envs made by id.

    `continuous`: drive the trees with the engine's continuous batching (default: when the policy has an
    `engine`, i.e. `EnginePolicy`); otherwise in rounds. `env_workers`: threads for env calls (continuous;
    in rounds too when the envs are remote). `env_backend`: where the envs run, `threads` (this process) or
    `ray`, `ray://HOST:PORT`, `ray:ADDRESS` (Ray actors: toolgym/ray_envs.py), or a `RaySpec`.
    """

    def __init__(
        self,
        policy: Any,
        branch: BranchPolicy | None = None,
        cfg: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        *,
        continuous: bool | None = None,
        env_workers: int = 16,
        env_backend: str | RaySpec = "threads",
        gate: WeightGate | None = None,
    ) -> None:
        self.policy = policy
        self.renderer = policy.renderer
        self.branch: BranchPolicy = branch or NoBranching()
        self.cfg = cfg or RolloutConfig()
        self.env_kwargs = dict(env_kwargs or {})
        has_engine = getattr(policy, "engine", None) is not None and hasattr(policy, "generation")
        if continuous and not has_engine:
            raise ConfigError("continuous rollouts need a policy with an engine (EnginePolicy)")
        self.continuous = has_engine if continuous is None else continuous
        if self.keyed and not self.continuous:
            name = getattr(policy, "name", "") or "?"
            raise ConfigError(
                f"rollout_keys needs our engine (engine fast) or vLLM, whose turns take a sampling key each; this "
                f"rollout's policy, {type(policy).__name__} ({name}), generates in rounds from one generator, without "
                "per-sequence keys (engine auto picks the HF one off CUDA): set engine fast or vllm, or rollout_keys "
                "false"
            )
        self.env_workers = max(1, env_workers)
        self.gate = gate  # asynchronous rollouts: published weights and their versions (None: synchronous)
        # seconds an idle engine waits for env calls in flight before planning the turns that are ready
        # (continuous mode): about half an eager prefill pass on a GPU host
        self.plan_wait = 0.02
        self.snapshots = not isinstance(self.branch, NoBranching)
        self.envs = tree_envs(self.env_kwargs, self.snapshots, env_backend)
        # remote envs wait on other nodes: their calls overlap on threads, in rounds too, and on more threads
        # (one waiting on an actor costs little)
        remote = env_backend != "threads"
        self.env_workers = max(self.env_workers, 64) if remote else self.env_workers
        self.round_workers = self.env_workers if remote else 0

    @property
    def keyed(self) -> bool:
        """Turns are keyed (`cfg.keys`; greedy turns draw no noise: never keyed)."""
        return self.cfg.keys and self.cfg.temperature > 0

    def tree_key(self, seed: int, ti: int) -> int:
        """Tree `ti`'s sampling key in a batch sampled with `seed`; 0 when turns are not keyed."""
        return tree_key(seed, ti) if self.keyed else 0

    # ----- the run -----------------------------------------------------------------------------------------
    def run(self, tasks: list[RolloutTask], seed: int) -> tuple[list[RolloutTree], RolloutStats]:
        """One tree per task. `seed` fixes the branching draws and the sampling."""
        stats = RolloutStats()
        forest: list[RolloutTree | None] = [None] * len(tasks)
        sampling = np.random.default_rng(seed)  # sampling seeds; each tree draws its branching from its own
        grow = functools.partial(self._grow, forest=forest, stats=stats)
        starts = [
            functools.partial(grow, ti, task, np.random.default_rng([seed, ti]), key=self.tree_key(seed, ti))
            for ti, task in enumerate(tasks)
        ]
        workers = getattr(self.envs, "workers", None)  # Ray env workers: their losses are counted per run
        lost0 = workers.lost_workers if workers is not None else 0
        if self.continuous:
            loop = EpisodeLoop(env_workers=self.env_workers, plan_wait=self.plan_wait, stats=stats)
            turns = _EngineTurns(self.policy, self.cfg, sampling, self.gate)
            if self.gate is not None:
                loop.on_step = turns.safe_point  # new weights between engine steps, never during one
            loop.run(starts, turns)
        else:
            EpisodeLoop(env_workers=self.round_workers, stats=stats).run(
                starts, _RoundTurns(self.policy, self.cfg, sampling, self.gate)
            )
        stats.lost_env_workers = (workers.lost_workers - lost0) if workers is not None else 0
        return [t for t in forest if t is not None], stats

    # ----- one tree (what it does, not when) ---------------------------------------------------------------
    def _grow(
        self, ti: int, task: RolloutTask, rng: np.random.Generator, forest: list[RolloutTree | None],
        stats: RolloutStats, key: int = 0,
    ) -> Grow:  # fmt: skip
        """Tree `ti` (`key`: its sampling key, `tree_key`; 0: unkeyed turns)."""
        (start,) = yield EnvCalls([lambda: self.envs.reset(task.env_id, task.seed)])
        if isinstance(start, Fault):
            raise RuntimeError(f"{task.env_id} seed {task.seed}: reset failed: {start.error}")
        env, obs, info, snap = start
        tools = list(info.get("tools") or [])
        where = anchor(obs, info)
        tree = RolloutTree(
            f"{task.env_id}#{task.seed}", self.renderer.prompt_ids(obs, tools), where["state_key"]
        )
        if len(tree.nodes[tree.root].token_ids) + 1 > self.cfg.max_total_tokens:
            # the budget rule below ends a path whose NEXT prompt leaves no room; a first prompt that leaves
            # none is the run's setting, not the model's doing (and overflows the engine's KV cache)
            raise ConfigError(
                f"{task.env_id} seed {task.seed}: the first prompt is {len(tree.nodes[tree.root].token_ids)} "
                f"tokens, leaving no room for a turn within max_total_tokens ({self.cfg.max_total_tokens}); "
                "raise max_total_tokens"
            )
        tree.nodes[tree.root].info.update(where["info"])
        if info.get("observation_truncated"):  # the task prompt itself was cut (envs/base.py)
            tree.nodes[tree.root].info["observations_cut"] = len(info["observation_truncated"])
        tree.meta.update(env_id=task.env_id, seed=task.seed, tools=tools, answer=_gold(env))
        if snap is not None:
            tree.nodes[tree.root].info["snapshot"] = snap
        forest[ti] = tree
        keys = _PathKeys(tree.root, key) if key else None
        split = bool(getattr(self.branch, "dynamic_split", False))
        n = 1 if split else self.branch.global_samples(self.cfg.budget)
        tree.meta["probe"] = split
        reqs = [_Req(ti, tree.root, "global", env, keys.start(tree, tree.root) if keys else 0)]
        reqs += yield from self._requests(ti, tree, [(tree.root, n - 1, "global")], stats, keys)
        if split:  # AEPO: one unforked pre-monitoring path decides how many global samples follow
            yield from self._rounds(tree, reqs, rng, stats, keys)
            tree.meta["probe"] = False
            tree.meta["global_samples"] = m = self.branch.split_budget(tree, self.cfg.budget)  # type: ignore[attr-defined]
            reqs = yield from self._requests(ti, tree, [(tree.root, m - 1, "global")], stats, keys)
        yield from self._rounds(tree, reqs, rng, stats, keys)
        if getattr(self.branch, "top_up", False):  # ARPO: fresh global samples up to the budget
            more = self.cfg.budget - len(tree.leaves())
            reqs = yield from self._requests(ti, tree, [(tree.root, more, "global")], stats, keys)
            yield from self._rounds(tree, reqs, rng, stats, keys)
        for it in range(64):  # on_complete iterations (TreeRL's L); 64 is a safety net
            forks = self.branch.on_complete(tree, it, self.cfg.budget - len(tree.leaves()), rng)
            if not forks:
                break
            reqs = yield from self._fork_requests(ti, tree, forks, stats, keys)
            yield from self._rounds(tree, reqs, rng, stats, keys)

    def _rounds(
        self, tree: RolloutTree, reqs: list[_Req], rng: np.random.Generator, stats: RolloutStats,
        keys: _PathKeys | None = None,
    ) -> Grow:  # fmt: skip
        while reqs:
            new = yield from self._generate(tree, reqs, stats, keys)
            room = self.cfg.budget - len(tree.leaves())
            forks = self.branch.on_turns(tree, [nid for _, nid in new], room, rng)
            extra = yield from self._fork_requests(reqs[0].tree, tree, forks, stats, keys)
            if extra:
                new += yield from self._generate(tree, extra, stats, keys)
            texts = [self._action(tree, nid) for _, nid in new]
            results = yield EnvCalls(
                [self.envs.stepper(r.env, text) for (r, _), text in zip(new, texts, strict=True)]
            )
            reqs = []
            for (r, nid), text, res in zip(new, texts, results, strict=True):
                nxt = self._record(tree, r, nid, text, res, stats)
                if nxt is not None:
                    reqs.append(nxt)

    def _fork_requests(
        self, ti: int, tree: RolloutTree, forks: list[Any], stats: RolloutStats, keys: _PathKeys | None = None
    ) -> Generator[Generate | EnvCalls, list[Any], list[_Req]]:
        todo = []
        for parent, count, reason in apply_forks(tree, forks):
            stats.forks[reason] = stats.forks.get(reason, 0) + count
            todo.append((parent, count, reason))
        return (yield from self._requests(ti, tree, todo, stats, keys))

    def _requests(
        self, ti: int, tree: RolloutTree, todo: list[tuple[int, int, str]], stats: RolloutStats,
        keys: _PathKeys | None = None,
    ) -> Generator[Generate | EnvCalls, list[Any], list[_Req]]:  # fmt: skip
        """`count` requests from each `parent`, each with a pooled env in the state at that node (and, keyed,
        a new path key: given before the envs answer, so a dropped fork does not shift its siblings' keys)."""
        wanted = [(parent, reason) for parent, count, reason in todo for _ in range(max(0, count))]
        if not wanted:
            return []
        path_keys = [keys.start(tree, parent) if keys else 0 for parent, _ in wanted]
        envs = yield EnvCalls([functools.partial(self.envs.at, tree, parent) for parent, _ in wanted])
        out = []
        for (parent, reason), key, env in zip(wanted, path_keys, envs, strict=True):
            if isinstance(env, Fault):
                stats.env_errors += 1  # the fork is dropped: its env could not be put in that state
                continue
            out.append(_Req(ti, parent, reason, env, key))
        return out

    def _generate(
        self, tree: RolloutTree, reqs: list[_Req], stats: RolloutStats, keys: _PathKeys | None = None
    ) -> Generator[Generate | EnvCalls, list[Any], list[tuple[_Req, int]]]:
        """One turn per request (rows continuing a cut turn only get what is left of its allowance)."""
        lefts = [max(1, self.cfg.max_new_tokens - len(self._partial_turn(tree, r.parent))) for r in reqs]
        prompts: list[Any] = [tree.prefix_ids(r.parent) for r in reqs]
        if keys is not None:
            prompts = [KeyedPrompt(p, r.key) for p, r in zip(prompts, reqs, strict=True)]
        gens = yield Generate(prompts, lefts)
        out: list[tuple[_Req, int]] = []
        for r, g in zip(reqs, gens, strict=True):
            if isinstance(g, Fault):  # no rollout server answered this turn: the path ends
                self._lost_turn(tree, r, g, stats)
                continue
            versions = None
            if isinstance(g, Versioned):
                g, versions = g.generation, g.versions
            parent = tree.nodes[r.parent]
            turn = (
                parent.turn if parent.kind == "model" else (0 if parent.kind == "prompt" else parent.turn + 1)
            )
            key = None if parent.kind == "model" else parent.state_key
            info: dict[str, Any] = {"finish": g.finish_reason}
            if parent.kind != "model":
                info.update(
                    state_text=parent.info.get("state_text"), env_key=parent.info.get("env_key", False)
                )
            nid = tree.add(
                r.parent, "model", g.token_ids, turn=turn, logprobs=list(g.logprobs),
                entropies=list(g.entropies) if g.entropies is not None else None, versions=versions,
                state_key=key, branch_reason=r.reason, info=info,
            )  # fmt: skip
            stats.generated_tokens += len(g.token_ids)
            if keys is not None:
                keys.of_node[nid] = r.key
            out.append((r, nid))
        return out

    def _lost_turn(self, tree: RolloutTree, req: _Req, fault: Fault, stats: RolloutStats) -> None:
        """Ends `req`'s path at an empty model node as an env_error (no row, not scored, counted)."""
        stats.env_errors += 1
        stats.server_errors += 1
        parent = tree.nodes[req.parent]
        turn = parent.turn if parent.kind == "model" else (0 if parent.kind == "prompt" else parent.turn + 1)
        nid = tree.add(
            req.parent, "model", [], turn=turn, logprobs=[], branch_reason=req.reason,
            info={"finish": "error", "infra_error": fault.error, "invalid": False, "tool_calls": 0},
        )  # fmt: skip
        ret = sum(tree.nodes[n].step_reward for n in tree.path(nid))
        end = {"success": False, "truncation": "env_error", "episode_reward": ret, "truncated": True}
        self._finish(tree, nid, end)
        self.envs.release(tree.meta["env_id"], req.env)  # (the env did nothing wrong: pooled, reset on reuse)

    def _action(self, tree: RolloutTree, nid: int) -> str:
        """The text the env gets for the turn ending at `nid` (the whole turn when it was cut by forks)."""
        return self.renderer.decode(self.renderer.strip_stop(self._partial_turn(tree, nid)))

    def _record(
        self, tree: RolloutTree, req: _Req, nid: int, text: str, res: Any, stats: RolloutStats
    ) -> _Req | None:
        """Records the env's answer to the turn `nid`; returns the request for the next turn, or None."""
        node = tree.nodes[nid]
        node.info["action"] = text
        path = tree.path(nid)
        if isinstance(res, Fault):  # an infrastructure fault: the path ends, not the model's failure
            stats.env_errors += 1
            node.info.update(invalid=False, tool_calls=0, infra_error=res.error)
            ret = sum(tree.nodes[n].step_reward for n in path)
            fault = {"success": False, "truncation": "env_error", "episode_reward": ret, "truncated": True}
            self._finish(tree, nid, fault)
            close_quietly(req.env)  # a broken env is closed, never pooled
            return None
        obs, reward, terminated, truncated, info, snap, read = res
        node.step_reward = float(reward)
        node.info.update(
            invalid=bool(info.get("invalid_action", False)), tool_calls=int(info.get("tool_calls", 0))
        )
        if info.get("observation_truncated"):  # the env cut an observation at max_observation_chars
            node.info["observations_cut"] = len(info["observation_truncated"])
        if read is not None:  # the env's own reading of the turn: saved_rollouts shows it without a reparse
            node.info["calls"] = [{"name": c.name, "arguments": c.arguments} for c in read.result.tool_calls]
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
            turn_ids = self._partial_turn(tree, nid)
            suffix = self.renderer.close_turn(turn_ids) + self.renderer.env_suffix(obs)
            if len(tree.prefix_ids(nid)) + len(suffix) + 1 > self.cfg.max_total_tokens:
                ret = sum(tree.nodes[n].step_reward for n in path)
                end = {
                    "success": False,
                    "truncation": "token_budget",
                    "episode_reward": ret,
                    "truncated": True,
                }
        if end is not None:
            self._finish(tree, nid, end)
            self.envs.release(tree.meta["env_id"], req.env)
            return None
        kind: NodeKind = "tool" if any(m.get("role") == "tool" for m in obs) else "user"
        where = anchor(obs, info)
        env_node = tree.add(
            nid, kind, suffix, turn=node.turn, state_key=where["state_key"], info=where["info"]
        )
        if snap is not None:
            tree.nodes[env_node].info["snapshot"] = snap
        return _Req(req.tree, env_node, "global", req.env, req.key)  # (the path's next turn: its key goes on)

    def _finish(self, tree: RolloutTree, nid: int, end: dict[str, Any]) -> None:
        node, path = tree.nodes[nid], tree.path(nid)
        end.update(
            turns=node.turn + 1,
            tool_calls=sum(tree.nodes[n].info.get("tool_calls", 0) for n in path),
            void=any(tree.nodes[n].info.get("invalid", False) for n in path),
            observations_cut=sum(tree.nodes[n].info.get("observations_cut", 0) for n in path),
            tokens=len(tree.prefix_ids(nid)),
        )
        node.info["episode"] = end
        tree.set_reward(nid, end["episode_reward"])

    @staticmethod
    def _partial_turn(tree: RolloutTree, node_id: int) -> list[int]:
        """Token ids of the model turn that ends at `node_id` (its earlier pieces when the turn was cut)."""
        ids: list[int] = []
        cur: int | None = node_id
        while cur is not None and tree.nodes[cur].kind == "model":
            ids = tree.nodes[cur].token_ids + ids
            cur = tree.nodes[cur].parent
        return ids

    def close(self) -> None:
        self.envs.close()


class WeightGate(Protocol):
    """Published weights for asynchronous rollouts (trainers/async_rollout.py `ActorWeights`)."""

    # whether a turn in flight at a new version is restarted here (our engine's partial rollout), or the
    # engine carries it across the change itself (vLLM servers: trainers/async_servers.py)
    restarts_turns: bool

    def hold(self) -> AbstractContextManager[int]:
        """Holds the weights still (no publish meanwhile); yields their version."""
        ...

    def sync(self, policy: Any) -> int:
        """At a safe point: loads a newer published version into `policy`'s engine; its version now."""
        ...


@dataclass
class Versioned:
    """A generation and the policy version of each of its tokens (asynchronous rollouts)."""

    generation: Any
    versions: list[int]


class _RoundTurns:
    """Rounds: each token allowance's prompts in one `policy.generate` call, seeded from the run's sampling
    generator (one draw a call). With a gate the call holds the weights still and its turns carry their
    version."""

    def __init__(
        self, policy: Any, cfg: RolloutConfig, sampling: np.random.Generator, gate: WeightGate | None = None
    ) -> None:
        self.policy, self.cfg, self.sampling, self.gate = policy, cfg, sampling, gate

    def generate(self, requests: list[Any], left: int | None) -> list[Any]:
        sp = _sampling(self.cfg, left or self.cfg.max_new_tokens, int(self.sampling.integers(2**31)))
        if self.gate is None:
            return list(self.policy.generate(requests, sp))
        with self.gate.hold() as version:
            gens = list(self.policy.generate(requests, sp))
        return [Versioned(g, [version] * len(g.token_ids)) for g in gens]


class _EngineTurns:
    """Continuous: every waiting prompt planned against the policy's held caches (continued, forked or new),
    then submitted; an ended turn's sequence stays held (indexed) for the forks and turns that continue it."""

    def __init__(
        self, policy: Any, cfg: RolloutConfig, sampling: np.random.Generator, gate: WeightGate | None = None
    ) -> None:
        from toolgym.agents.engine.engine_policy import mode_of

        self.policy, self.engine, self.gate = policy, policy.engine, gate
        # with a gate: each submitted turn's sequence and the (position in its output, version) where each
        # version it was sampled under starts; a turn restarted at a version change (`safe_point`) carries
        # the tokens, logprobs and entropies it had sampled before
        self.marks: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        self.carried: dict[int, tuple[list[int], list[float], list[float]]] = {}
        self.version = -1
        if gate is None:
            policy.refresh()  # new weights after an optimizer step: held caches are dropped
        else:
            self.version = gate.sync(policy)  # the published version (under the gate's lock)
        self.engine.seed(int(sampling.integers(2**31)))
        self.sp = _sampling(cfg, cfg.max_new_tokens, 0)
        self.mode = mode_of(self.sp, getattr(policy, "top_k", 0))

    def plan(self, requests: list[Any], lefts: list[int | None]) -> list[Any]:
        keys = [r.key if isinstance(r, KeyedPrompt) else 0 for r in requests]
        prompts = [r.ids if isinstance(r, KeyedPrompt) else r for r in requests]
        seqs = self.policy._plan(prompts)  # continues / forks held caches
        for s in seqs:  # (all checked before any is submitted: a failed plan leaves nothing in the batch)
            if turn_room(self.engine, s) < 1:
                raise ConfigError(
                    f"a prompt of {len(s.ids)} tokens does not fit the engine's capacity "
                    f"({self.engine.cache.capacity}): give it max_total_tokens + max_new_tokens + 8"
                )
        for s, left, key in zip(seqs, lefts, keys, strict=True):
            submit_turn(self.engine, s, self.mode, left or self.sp.max_new_tokens, self.sp.stop, key)
            if self.gate is not None:
                self.marks[s.id] = (s, [(0, self.version)])
        return list(seqs)

    def safe_point(self, steps: int, live: int) -> None:
        """Before an engine step (`EpisodeLoop.on_step`): newer published weights are loaded now, and every
        turn in flight goes on under them (a partial rollout): it is taken out of the batch and submitted
        again with what it sampled so far appended, so its whole context is prefilled again under the new
        weights (as AReaL's interrupted generation; keeping the old keys/values would make the next tokens
        a mix of two versions). Its earlier tokens keep their version and logprobs."""
        from toolgym.agents.engine.engine_policy import NOTHING_CARRIED, restart_turn

        assert self.gate is not None
        version = self.gate.sync(self.policy)
        if version == self.version:
            return
        self.version = version
        if not self.gate.restarts_turns:
            return  # vLLM servers go on with their turns under the new weights (trainers/async_servers.py)
        for sid, (seq, marks) in list(self.marks.items()):
            if seq.state not in ("queued", "active"):
                continue
            fresh, carried = restart_turn(self.engine, seq, self.carried.pop(sid, NOTHING_CARRIED))
            del self.marks[sid]
            self.marks[fresh.id] = (fresh, [*marks, (len(carried[0]), version)])
            self.carried[fresh.id] = carried

    def failed(self, request: Any, seq: Any, error: str) -> Fault:
        """A turn no rollout server answered (`TurnFailed`): its path ends as an env_error (`_lost_turn`)."""
        self.marks.pop(seq.id, None)
        self.carried.pop(seq.id, None)
        return Fault(f"rollout server: {error}")

    def result(self, request: Any, seq: Any) -> Any:
        self.policy.index.add(seq)
        gen = self.policy.generation(seq)
        if self.gate is None:
            return gen
        from toolgym.agents.engine.engine_policy import NOTHING_CARRIED, with_carried

        _, marks = self.marks.pop(seq.id)
        gen = with_carried(gen, self.carried.pop(seq.id, NOTHING_CARRIED))
        n = len(gen.token_ids)
        versions: list[int] = []
        for i, (_, version) in enumerate(marks):
            end = marks[i + 1][0] if i + 1 < len(marks) else n
            versions += [version] * (min(end, n) - len(versions))
        return Versioned(gen, versions)


def _sampling(cfg: RolloutConfig, left: int, seed: int) -> Any:
    from toolgym.agents.policy import SamplingParams

    return SamplingParams(
        temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=left, seed=seed,
        return_entropies=cfg.entropies,
    )  # fmt: skip
