"""The rollout engine: runs envs with a token-level policy and grows one rollout tree per task.

Each tree grows by its own loop (`_grow`, a generator): it starts `branch.global_samples(budget)` paths,
then works in rounds: all pending turns of the tree are generated (ids in, ids + logprobs out; the prompt
of a turn is the tree's token prefix, never re-rendered), the branching policy may fork after the round
(`on_turns`), every new turn is stepped in its env, and each continuing path gets an env node (the
template's end of turn + the env messages + the next generation prompt, loss mask 0). When every path has
ended, a policy with `top_up` (ARPO) fills a tree that ended below the budget with fresh global samples,
and `on_complete` may fork inside finished turns (TreeRL/APPO); the rounds run again for them.

A tree's loop never touches the policy or an env itself: it yields work (turns to generate, env calls to
make) and gets the results back, so the tree's contents (node order included) depend only on what was
generated, never on how the work was scheduled. Two drivers run the loops of all trees of a batch:
- rounds (`HFPolicy`, any `TokenPolicy`): the pending turns of every tree in one `policy.generate` call,
  then every env call, one after another, on this thread;
- continuous (a policy with an `engine`, our `EnginePolicy`): each tree's turns go to the engine as soon
  as they are ready and leave its batch the step they end (`Engine.submit/step`), env calls run on a
  thread pool while the GPU decodes the other trees; a turn that continues a path prefills only the env
  reply (its KV stays in the slot) and a branch forks the KV of the turn it starts from (`Engine.fork`,
  through the policy's prefix index): nothing is prefilled twice.
Branching draws come from one generator per tree (seeded by the run seed and the tree's index), so both
drivers make the same branching decisions given the same turns and entropies.

Each model turn is parsed once, by its env: the env call reads it (`ToolEnv.read_action`) and steps with
that reading, and the turn's node keeps the calls the env read (`info["calls"]`, shown by rollout_log).

Forking an env: a forkable env (`env.unwrapped.supports_fork`) is snapshotted with `get_state()` on every
env node while a branching policy is active, and a fork restores the snapshot into a pooled env with
`set_state`; otherwise the fork resets a pooled env with the task's seed and replays the path's actions.

Env faults: an exception from `env.step` ends that path as an infrastructure failure
(`episode.truncation == "env_error"`: no training row, not scored, tree.flatten leaves it out); the env
is closed, not pooled. A fork whose env cannot be restored is dropped. A failing first `reset` raises.

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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolgym.envs.base import action_reader
from toolgym.errors import ConfigError
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
    generate_s: float = 0.0  # time generating (rounds: in policy.generate; continuous: in engine steps)
    env_s: float = 0.0  # time in env calls (summed over threads when they overlap)
    generate_calls: int = 0  # policy.generate calls (rounds) or engine steps (continuous)
    idle_s: float = 0.0  # continuous: wall time with nothing to decode, waiting for envs
    wall_s: float = 0.0
    env_errors: int = 0  # paths ended (or forks dropped) by an env fault
    forks: dict[str, int] = field(default_factory=dict)


@dataclass
class _Gen:
    """Work a tree loop yields: one turn per prompt, at most `lefts[i]` new tokens; gets Generations back."""

    prompts: list[list[int]]
    lefts: list[int]


@dataclass
class _Env:
    """Work a tree loop yields: env calls (any thread); gets their results back, a `_Fault` for an exception."""

    calls: list[Callable[[], Any]]


@dataclass
class _Fault:
    error: str


@dataclass
class _Loop:
    """A tree's loop and the work it waits for (filled in by a driver)."""

    gen: Generator[Any, list[Any], None]
    work: Any = None
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    done: bool = False


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


def _call(fn: Callable[[], Any]) -> Any:
    """Runs an env call; an env fault comes back as a `_Fault` (a config error still raises)."""
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as exc:  # an infrastructure fault of this env: this path only
        return _Fault(f"{type(exc).__name__}: {exc}")


class TreeRollout:
    """Grows rollout trees with `policy` (a `TokenPolicy`: `generate`, `renderer`) in envs made by id.

    `continuous`: drive the trees with the engine's continuous batching (default: when the policy has an
    `engine`, i.e. `EnginePolicy`); otherwise in rounds. `env_workers`: threads for env calls (continuous).
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
        self.env_workers = max(1, env_workers)
        # seconds an idle engine waits for env calls in flight before planning the turns that are ready
        # (continuous driver): about half an eager prefill pass on a GPU host
        self.plan_wait = 0.02
        self._pool: dict[str, list[Any]] = {}
        self._pool_lock = threading.Lock()
        self._wrappers: list[Any] = []
        self.snapshots = not isinstance(self.branch, NoBranching)

    # ----- the run -----------------------------------------------------------------------------------------
    def run(self, tasks: list[RolloutTask], seed: int) -> tuple[list[RolloutTree], RolloutStats]:
        """One tree per task. `seed` fixes the branching draws and the sampling."""
        stats = RolloutStats()
        forest: list[RolloutTree | None] = [None] * len(tasks)
        sampling = np.random.default_rng(seed)  # sampling seeds; each tree draws its branching from its own
        loops = [
            _Loop(self._grow(ti, task, np.random.default_rng([seed, ti]), forest, stats))
            for ti, task in enumerate(tasks)
        ]
        t0 = time.perf_counter()
        if self.continuous:
            self._drive_continuous(loops, sampling, stats)
        else:
            self._drive_rounds(loops, sampling, stats)
        stats.wall_s = time.perf_counter() - t0
        return [t for t in forest if t is not None], stats

    # ----- one tree (what it does, not when) ---------------------------------------------------------------
    def _grow(
        self, ti: int, task: RolloutTask, rng: np.random.Generator, forest: list[RolloutTree | None],
        stats: RolloutStats,
    ) -> Generator[Any, list[Any], None]:  # fmt: skip
        (start,) = yield _Env([lambda: self._reset(task)])
        if isinstance(start, _Fault):
            raise RuntimeError(f"{task.env_id} seed {task.seed}: reset failed: {start.error}")
        env, obs, info, snap = start
        tools = list(info.get("tools") or [])
        where = anchor(obs, info)
        tree = RolloutTree(
            f"{task.env_id}#{task.seed}", self.renderer.prompt_ids(obs, tools), where["state_key"]
        )
        tree.nodes[tree.root].info.update(where["info"])
        tree.meta.update(env_id=task.env_id, seed=task.seed, tools=tools, answer=_gold(env))
        if snap is not None:
            tree.nodes[tree.root].info["snapshot"] = snap
        forest[ti] = tree
        split = bool(getattr(self.branch, "dynamic_split", False))
        n = 1 if split else self.branch.global_samples(self.cfg.budget)
        tree.meta["probe"] = split
        reqs = [_Req(ti, tree.root, "global", env)]
        reqs += yield from self._requests(ti, tree, [(tree.root, n - 1, "global")], stats)
        if split:  # AEPO: one unforked pre-monitoring path decides how many global samples follow
            yield from self._rounds(tree, reqs, rng, stats)
            tree.meta["probe"] = False
            tree.meta["global_samples"] = m = self.branch.split_budget(tree, self.cfg.budget)  # type: ignore[attr-defined]
            reqs = yield from self._requests(ti, tree, [(tree.root, m - 1, "global")], stats)
        yield from self._rounds(tree, reqs, rng, stats)
        if getattr(self.branch, "top_up", False):  # ARPO: fresh global samples up to the budget
            more = self.cfg.budget - len(tree.leaves())
            reqs = yield from self._requests(ti, tree, [(tree.root, more, "global")], stats)
            yield from self._rounds(tree, reqs, rng, stats)
        for it in range(64):  # on_complete iterations (TreeRL's L); 64 is a safety net
            forks = self.branch.on_complete(tree, it, self.cfg.budget - len(tree.leaves()), rng)
            if not forks:
                break
            reqs = yield from self._fork_requests(ti, tree, forks, stats)
            yield from self._rounds(tree, reqs, rng, stats)

    def _rounds(
        self, tree: RolloutTree, reqs: list[_Req], rng: np.random.Generator, stats: RolloutStats
    ) -> Generator[Any, list[Any], None]:
        while reqs:
            new = yield from self._generate(tree, reqs, stats)
            room = self.cfg.budget - len(tree.leaves())
            forks = self.branch.on_turns(tree, [nid for _, nid in new], room, rng)
            extra = yield from self._fork_requests(reqs[0].tree, tree, forks, stats)
            if extra:
                new += yield from self._generate(tree, extra, stats)
            texts = [self._action(tree, nid) for _, nid in new]
            results = yield _Env(
                [self._stepper(r.env, text) for (r, _), text in zip(new, texts, strict=True)]
            )
            reqs = []
            for (r, nid), text, res in zip(new, texts, results, strict=True):
                nxt = self._record(tree, r, nid, text, res, stats)
                if nxt is not None:
                    reqs.append(nxt)

    def _fork_requests(
        self, ti: int, tree: RolloutTree, forks: list[Any], stats: RolloutStats
    ) -> Generator[Any, list[Any], list[_Req]]:
        todo = []
        for parent, count, reason in apply_forks(tree, forks):
            stats.forks[reason] = stats.forks.get(reason, 0) + count
            todo.append((parent, count, reason))
        return (yield from self._requests(ti, tree, todo, stats))

    def _requests(
        self, ti: int, tree: RolloutTree, todo: list[tuple[int, int, str]], stats: RolloutStats
    ) -> Generator[Any, list[Any], list[_Req]]:
        """`count` requests from each `parent`, each with a pooled env in the state at that node."""
        wanted = [(parent, reason) for parent, count, reason in todo for _ in range(max(0, count))]
        if not wanted:
            return []
        envs = yield _Env([functools.partial(self._env_at, tree, parent) for parent, _ in wanted])
        out = []
        for (parent, reason), env in zip(wanted, envs, strict=True):
            if isinstance(env, _Fault):
                stats.env_errors += 1  # the fork is dropped: its env could not be put in that state
                continue
            out.append(_Req(ti, parent, reason, env))
        return out

    def _generate(
        self, tree: RolloutTree, reqs: list[_Req], stats: RolloutStats
    ) -> Generator[Any, list[Any], list[tuple[_Req, int]]]:
        """One turn per request (rows continuing a cut turn only get what is left of its allowance)."""
        lefts = [max(1, self.cfg.max_new_tokens - len(self._partial_turn(tree, r.parent))) for r in reqs]
        gens = yield _Gen([tree.prefix_ids(r.parent) for r in reqs], lefts)
        out: list[tuple[_Req, int]] = []
        for r, g in zip(reqs, gens, strict=True):
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
                entropies=list(g.entropies) if g.entropies is not None else None,
                state_key=key, branch_reason=r.reason, info=info,
            )  # fmt: skip
            stats.generated_tokens += len(g.token_ids)
            out.append((r, nid))
        return out

    def _action(self, tree: RolloutTree, nid: int) -> str:
        """The text the env gets for the turn ending at `nid` (the whole turn when it was cut by forks)."""
        return self.renderer.decode(self.renderer.strip_stop(self._partial_turn(tree, nid)))

    def _stepper(self, env: Any, text: str) -> Callable[[], Any]:
        def step() -> tuple[Any, ...]:
            # the turn's one parse, by the env's parser: step takes it as it is, the tree keeps its calls
            reader = action_reader(env)
            read = reader(text) if reader is not None else None
            obs, reward, terminated, truncated, info = env.step(read if read is not None else text)
            snap = None
            if self.snapshots and not (terminated or truncated) and env.supports_fork:
                snap = env.get_state()
            return obs, reward, terminated, truncated, info, snap, read

        return step

    def _record(
        self, tree: RolloutTree, req: _Req, nid: int, text: str, res: Any, stats: RolloutStats
    ) -> _Req | None:
        """Records the env's answer to the turn `nid`; returns the request for the next turn, or None."""
        node = tree.nodes[nid]
        node.info["action"] = text
        path = tree.path(nid)
        if isinstance(res, _Fault):  # an infrastructure fault: the path ends, not the model's failure
            stats.env_errors += 1
            node.info.update(invalid=False, tool_calls=0, infra_error=res.error)
            ret = sum(tree.nodes[n].step_reward for n in path)
            fault = {"success": False, "truncation": "env_error", "episode_reward": ret, "truncated": True}
            self._finish(tree, nid, fault)
            with contextlib.suppress(Exception):  # a broken env is closed, never pooled
                req.env.close()
            return None
        obs, reward, terminated, truncated, info, snap, read = res
        node.step_reward = float(reward)
        node.info.update(
            invalid=bool(info.get("invalid_action", False)), tool_calls=int(info.get("tool_calls", 0))
        )
        if read is not None:  # the env's own reading of the turn: rollout_log shows it without parsing again
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
            self._release(tree.meta["env_id"], req.env)
            return None
        kind: NodeKind = "tool" if any(m.get("role") == "tool" for m in obs) else "user"
        where = anchor(obs, info)
        env_node = tree.add(
            nid, kind, suffix, turn=node.turn, state_key=where["state_key"], info=where["info"]
        )
        if snap is not None:
            tree.nodes[env_node].info["snapshot"] = snap
        return _Req(req.tree, env_node, "global", req.env)

    def _finish(self, tree: RolloutTree, nid: int, end: dict[str, Any]) -> None:
        node, path = tree.nodes[nid], tree.path(nid)
        end.update(
            turns=node.turn + 1,
            tool_calls=sum(tree.nodes[n].info.get("tool_calls", 0) for n in path),
            void=any(tree.nodes[n].info.get("invalid", False) for n in path),
            tokens=len(tree.prefix_ids(nid)),
        )
        node.info["episode"] = end
        tree.set_reward(nid, end["episode_reward"])

    # ----- drivers -----------------------------------------------------------------------------------------
    def _advance(self, loop: _Loop, first: bool = False) -> None:
        """Resumes a tree loop with its results until it waits for work (or ends)."""
        try:
            work = next(loop.gen) if first else loop.gen.send(loop.results)
            while isinstance(work, (_Gen, _Env)) and not (
                work.prompts if isinstance(work, _Gen) else work.calls
            ):
                work = loop.gen.send([])  # nothing to do: answer at once
        except StopIteration:
            loop.done, loop.work = True, None
            return
        loop.work = work
        n = len(work.prompts) if isinstance(work, _Gen) else len(work.calls)
        loop.results, loop.remaining = [None] * n, n

    def _sampling(self, left: int, seed: int) -> Any:
        from toolgym.agents.policy import SamplingParams

        return SamplingParams(
            temperature=self.cfg.temperature, top_p=self.cfg.top_p, max_new_tokens=left, seed=seed,
            return_entropies=self.cfg.entropies,
        )  # fmt: skip

    def _drive_rounds(self, loops: list[_Loop], sampling: np.random.Generator, stats: RolloutStats) -> None:
        """Lock-step: every waiting turn of every tree in one generate call (per token allowance), then every
        env call on this thread."""
        for loop in loops:
            self._advance(loop, first=True)
        while True:
            live = [lp for lp in loops if not lp.done]
            if not live:
                return
            turns = [(lp, k) for lp in live if isinstance(lp.work, _Gen) for k in range(len(lp.work.prompts))]
            groups: dict[int, list[tuple[_Loop, int]]] = {}
            for lp, k in turns:
                groups.setdefault(lp.work.lefts[k], []).append((lp, k))
            for left, group in groups.items():
                sp = self._sampling(left, int(sampling.integers(2**31)))
                t0 = time.perf_counter()
                gens = self.policy.generate([lp.work.prompts[k] for lp, k in group], sp)
                stats.generate_s += time.perf_counter() - t0
                stats.generate_calls += 1
                for (lp, k), g in zip(group, gens, strict=True):
                    lp.results[k] = g
            t0 = time.perf_counter()
            for lp in live:
                if isinstance(lp.work, _Env):
                    lp.results = [_call(fn) for fn in lp.work.calls]
            stats.env_s += time.perf_counter() - t0
            for lp in live:
                self._advance(lp)

    def _drive_continuous(
        self, loops: list[_Loop], sampling: np.random.Generator, stats: RolloutStats
    ) -> None:
        """The engine's continuous batching: turns enter and leave the decode batch one by one, env calls
        run on a thread pool meanwhile (see the module docstring)."""
        from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

        from toolgym.agents.engine.policy import mode_of

        policy = self.policy
        eng = policy.engine
        policy.refresh()  # new weights after an optimizer step: held caches are dropped
        eng.seed(int(sampling.integers(2**31)))
        sp = self._sampling(self.cfg.max_new_tokens, 0)
        mode = mode_of(sp, getattr(policy, "top_k", 0))
        pending: dict[Future[Any], tuple[_Loop, int]] = {}
        ours: list[Any] = []  # every engine sequence this run made (released at the end)

        def timed(fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            try:
                return _call(fn)
            finally:
                with self._pool_lock:
                    stats.env_s += time.perf_counter() - t0

        planned: list[_Loop] = []  # trees whose turns wait for the next joint plan

        def dispatch(loop: _Loop) -> None:
            work = loop.work
            if isinstance(work, _Env):
                for k, fn in enumerate(work.calls):
                    pending[pool.submit(timed, fn)] = (loop, k)
                return
            planned.append(loop)

        def plan() -> None:
            # every tree's waiting turns in one plan: their prompts' new ids run as one packed prefill (a plan
            # per tree was a prefill pass per group, ~30 layers of launches each, most of a short step)
            if not planned:
                return
            batch = planned[:]
            planned.clear()
            works = [lp.work for lp in batch]
            assert all(isinstance(w, _Gen) for w in works)
            t0 = time.perf_counter()
            seqs = iter(policy._plan([p for w in works for p in w.prompts]))  # continues / forks held caches
            stats.generate_s += time.perf_counter() - t0
            for loop, work in zip(batch, works, strict=True):
                for k, left in enumerate(work.lefts):
                    s = next(seqs)
                    room = eng.cache.capacity - 2 - len(s.ids)
                    if room < 1:
                        raise ConfigError(
                            f"a prompt of {len(s.ids)} tokens does not fit the engine's capacity "
                            f"({eng.cache.capacity}): give it max_total_tokens + max_new_tokens + 8"
                        )
                    s.tag = (loop, k)
                    eng.submit(s, mode, min(left, room), sp.stop)
                    ours.append(s)

        def resume(loop: _Loop) -> None:
            self._advance(loop)
            if not loop.done:
                dispatch(loop)

        def collect(ready: Iterable[Future[Any]]) -> None:
            for fut in ready:
                loop, k = pending.pop(fut)
                loop.results[k] = fut.result()
                loop.remaining -= 1
                if loop.remaining == 0:
                    resume(loop)

        pool = ThreadPoolExecutor(self.env_workers, thread_name_prefix="rollout-env")
        try:
            for loop in loops:
                self._advance(loop, first=True)
                if not loop.done:
                    dispatch(loop)
            while any(not lp.done for lp in loops):
                if planned and pending and not eng.busy():
                    # nothing decodes: a turn planned now runs its own prefill pass (~50 launches a layer,
                    # ~40 ms on an H100 host), so env calls in flight get a moment to join it (resets of a
                    # step's trees finish one by one, and a tree may need another env call after its reset)
                    t0 = time.perf_counter()
                    while planned and pending and (left := t0 + self.plan_wait - time.perf_counter()) > 0:
                        collect(wait(list(pending), timeout=left, return_when=ALL_COMPLETED)[0])
                    stats.idle_s += time.perf_counter() - t0
                plan()
                if eng.busy():
                    t0 = time.perf_counter()
                    ended = eng.step()
                    stats.generate_s += time.perf_counter() - t0
                    stats.generate_calls += 1
                    for s in ended:
                        policy.index.add(s)
                        loop, k = s.tag
                        s.tag = None
                        loop.results[k] = policy.generation(s)
                        loop.remaining -= 1
                        if loop.remaining == 0:
                            resume(loop)
                    ready = [f for f in pending if f.done()]
                elif pending:
                    t0 = time.perf_counter()
                    ready = list(wait(list(pending), return_when=FIRST_COMPLETED)[0])
                    stats.idle_s += time.perf_counter() - t0
                else:
                    raise RuntimeError("rollout stalled: trees wait for work that was never queued")
                collect(ready)
        finally:
            pool.shutdown(wait=True)
            for s in ours:  # an interrupted run leaves nothing in the batch (finished turns stay held)
                if s.state in ("queued", "active"):
                    eng.cancel(s)

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

    def _reset(self, task: RolloutTask) -> tuple[Any, list[dict[str, Any]], dict[str, Any], Any]:
        env = self._acquire(task.env_id)
        obs, info = env.reset(seed=task.seed)
        snap = env.get_state() if self.snapshots and env.supports_fork else None
        return env, obs, info, snap

    def _env_at(self, tree: RolloutTree, node_id: int) -> Any:
        """A pooled env in the state before the next turn from `node_id` (restored, or replayed)."""
        anchor = node_id
        while tree.nodes[anchor].kind == "model":
            anchor = tree.nodes[anchor].parent  # type: ignore[assignment]
        env = self._acquire(tree.meta["env_id"])
        try:
            env.reset(seed=tree.meta["seed"])
            snap = tree.nodes[anchor].info.get("snapshot")
            if snap is not None:
                env.set_state(snap)
                return env
            for n in tree.path(anchor):  # replay: the actions of the turns before the anchor
                if "action" in tree.nodes[n].info:
                    env.step(tree.nodes[n].info["action"])
        except Exception:
            with contextlib.suppress(Exception):  # a broken env is closed, never pooled
                env.close()
            raise
        return env

    def _acquire(self, env_id: str) -> Any:
        with self._pool_lock:  # env calls run on threads (continuous driver)
            pool = self._pool.setdefault(env_id, [])
            if pool:
                return pool.pop()
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids)
        from toolgym.envs.base import tool_env

        wrapped = gym.make(env_id, **self.env_kwargs)
        with self._pool_lock:
            self._wrappers.append(wrapped)
        return tool_env(wrapped)

    def _release(self, env_id: str, env: Any) -> None:
        with self._pool_lock:
            self._pool.setdefault(env_id, []).append(env)

    def close(self) -> None:
        for w in self._wrappers:
            with contextlib.suppress(Exception):  # best effort: a failing close must not hide results
                w.close()
        self._wrappers, self._pool = [], {}
