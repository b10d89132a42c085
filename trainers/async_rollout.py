"""Asynchronous rollouts: a worker thread grows rollout trees while the learner updates (`max_staleness` > 0).

Versions. The policy version v is the number of learner steps whose update the weights hold: the initial
policy is version 0 (or the resumed step), learner step s trains with version s - 1 and publishes version s.
Every generated token carries the version that sampled it (`Node.versions`). A group (tree) consumed at step
s has staleness (s - 1) - min over its tokens of v; the synchronous loop always has 0.

Admission (AReaL's `max_head_offpolicyness`, at batch granularity). The worker grows batch b (the trees of
learner step b) only once version >= b - 1 - max_staleness is published, so every token of batch b was
sampled by a version at least that new and its staleness at step b is at most `max_staleness`: nothing is
thrown away for being stale (the learner checks the bound anyway, and raises when it is broken: a bug).
At most max_staleness + 1 batches are generated or queued ahead of the learner. With `per_tree`
(`async_admission: tree`, `TreeStream`) the same bound admits each tree of batch b on its own, in one
episode loop that grows the trees of every admitted batch, so the next batch's trees start while this
batch's slowest tree finishes.

Weights. The worker samples from an actor copy of the learner's weights (`ActorWeights`), which the learner
overwrites at `publish` under a lock; the rollout reads the copy only under that lock:
- rounds (HF policy): each `generate` call holds the lock, so a turn is sampled by one version;
- continuous (our engine over the actor): the engine re-packs the actor's weights at the safe point before
  an engine step (`EpisodeLoop.on_step`), under the lock, never during a step.
A turn in flight when a version is loaded goes on under it (a partial rollout): its earlier tokens keep their
version and behaviour logprobs, the later ones get the new ones. The optimizer only ever writes the
learner's weights, so no optimizer step can race a decode step.

Off-policy correction is decoupled PPO (AReaL): the trainer recomputes the "old" (proximal) logprobs with
the weights it updates from, clips the ratio against those, and weights each token by the importance ratio
proximal / behaviour (the engine's logprob of the token as sampled), truncated or masked (`is_mode`).

Departures from AReaL / verl / prime-rl (docs/trainer.md, "Asynchronous rollouts"):
1. Admission is per batch of `prompts_per_step` trees (one `TreeRollout.run`) or per tree (`TreeStream`),
   never per sample (AReaL): a tree is GRPO's group, and a batch keeps its tasks, so a straggler still
   delays its own batch's training (per tree: not the GPU).
2. KV caches of turns in flight are kept across a weight change (AReaL recomputes them; PipelineRL keeps
   them): the next tokens are sampled with new weights over keys/values of the old ones. The recorded
   behaviour logprob is the one actually sampled from, so the IS weight stays exact for what was sampled.
   Held caches of finished turns are dropped at the change (the next turn prefills under the new weights).
3. The actor is a full copy of the weights (one more copy on the GPU; the engine's packed copy is a third).
4. This is the thread layout (one process); separate rollout and learner GPUs, weights broadcast over a
   process group, are trainers/async_split.py (`rollout_ranks`), with this worker on each rollout rank.
5. CUDA graphs: the worker's engine captures every decode bucket before the worker starts (a capture while
   the learner's kernels run from the other thread fails); the learner's own engine, which only runs the
   evaluations, captures the greedy mode's buckets then too and never captures later (a step without a graph
   runs eager). Until 2026-11-28 it decoded every evaluation eager, which cost the asynchronous arm of the
   learning benchmark wall time the synchronous arm did not pay.
6. Streams: on a GPU the worker runs on a CUDA stream of its own (PyTorch's pool streams do not wait for
   the legacy default stream the learner uses), so decode and update kernels can run at once; on one stream
   they queued in one line, and each decode step's copy of its samples to the host also waited for the
   learner's queued update. The weights cross the streams at two points only: `publish` records an event
   after its copies and the worker's stream waits for it before reading the actor; a re-pack (`sync`) or a
   generate call (`hold`) finishes on the GPU before the lock is let go, so a later publish never overwrites
   what a queued kernel still reads. ``TOOLGYM_ASYNC_STREAM=0`` keeps the worker on the default stream
   (for an A/B of the overlap).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from toolgym.errors import ConfigError
from toolgym.trainers.rollout import RolloutStats, RolloutTask, TreeRollout
from toolgym.trainers.tree import RolloutTree


class ActorWeights:
    """The rollout's copy of the learner's weights and its version (`rollout.WeightGate`).

    `publish` copies the learner's parameters and buffers into the actor under the lock; `hold` keeps them
    still while a generate call reads them; `sync` re-packs an engine's weights from the actor at a safe
    point when a newer version was published.
    """

    restarts_turns = True  # a turn in flight at a new version is prefilled again under it (`_EngineTurns`)

    def __init__(self, learner: Any, actor: Any, version: int = 0) -> None:
        self.learner, self.actor = learner, actor
        self.lock = threading.Lock()
        self.version = version  # the version the actor holds
        self.loaded = -1  # the version the engine's packed copy holds (continuous mode)
        self.changed = threading.Condition()  # notified at every publish (the worker's admission waits on it)
        self.published: torch.cuda.Event | None = None  # recorded after the last publish's copies (CUDA)

    @staticmethod
    def copy_of(model: Any) -> Any:
        """An actor: a frozen copy of `model` (same device and dtype) for the rollout to sample from."""
        actor = copy.deepcopy(model)
        for m in actor.modules():  # a compiled layer's copy would still call the learner's layer
            if getattr(m, "_compiled_call_impl", None) is not None:
                m._compiled_call_impl = None
        actor.eval()
        actor.requires_grad_(False)
        return actor

    def publish(self, version: int) -> None:
        """The learner's current weights become `version` (call after the step's optimizer steps)."""
        with self.lock, torch.no_grad():
            for a, b in zip(self.actor.parameters(), self.learner.parameters(), strict=True):
                a.copy_(b)
            for a, b in zip(self.actor.buffers(), self.learner.buffers(), strict=True):
                a.copy_(b)
            if _on_cuda(self.actor):  # the worker's stream waits for these copies (`_read`)
                self.published = torch.cuda.Event()
                self.published.record()
            self.version = version
        with self.changed:
            self.changed.notify_all()

    @contextlib.contextmanager
    def _read(self) -> Iterator[None]:
        """Under the lock: the calling stream first waits for the last publish, and what it queued while
        reading the actor has run before the lock is let go (the next publish overwrites the actor)."""
        if self.published is not None:
            torch.cuda.current_stream().wait_event(self.published)
        yield
        if _on_cuda(self.actor):
            torch.cuda.current_stream().synchronize()

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        with self.lock, self._read():
            yield self.version

    def sync(self, policy: Any) -> int:
        with self.lock:
            if self.loaded != self.version:
                with self._read():
                    policy.refresh(force=True)  # re-pack from the actor; held caches are dropped
                self.loaded = self.version
            return self.loaded

    def wait_for(self, version: int, stop: threading.Event) -> bool:
        """Blocks until the actor holds at least `version` (True) or `stop` is set (False)."""
        with self.changed:
            while self.version < version and not stop.is_set():
                self.changed.wait(timeout=0.5)
        return not stop.is_set()


def _on_cuda(model: Any) -> bool:
    p = next(iter(model.parameters()), None) if model is not None else None
    return p is not None and p.is_cuda


def worker_stream(actor: Any) -> contextlib.AbstractContextManager[Any]:
    """The worker thread's own CUDA stream on the actor's GPU (module docstring, 6.); nothing on CPU or with
    ``TOOLGYM_ASYNC_STREAM=0``."""
    if not _on_cuda(actor) or os.environ.get("TOOLGYM_ASYNC_STREAM", "1") == "0":
        return contextlib.nullcontext()
    device = next(iter(actor.parameters())).device
    return torch.cuda.stream(torch.cuda.Stream(device))


@dataclass
class Batch:
    """One learner step's rollout trees, grown by the worker."""

    step: int
    forest: list[RolloutTree]
    stats: RolloutStats
    tasks: list[RolloutTask]
    published: int  # the version published when its growth was admitted
    wait_s: float  # seconds the worker waited for admission before growing it
    early: int = 0  # per-tree admission: its trees started while an earlier batch still grew


class AsyncRollout:
    """The worker thread: grows batch `first`, `first` + 1, …, `last` with `roller`, each admitted when the
    bound allows, and queues them for the learner (`take`). `draw(step)` gives a batch's tasks, `seed(step)`
    its sampling seed; `context()` the worker's torch mode (no_grad and autocast are per thread). `steps`: the
    batches to grow, when not all of `first`..`last` (a rollout rank of the split layout grows its share).
    `per_tree`: admission per tree (`TreeStream`) instead of one `TreeRollout.run` per batch."""

    def __init__(
        self, roller: TreeRollout, gate: ActorWeights, *, first: int, last: int, max_staleness: int,
        draw: Callable[[int], list[RolloutTask]], seed: Callable[[int], int],
        context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        steps: Sequence[int] | None = None, per_tree: bool = False,
    ) -> None:  # fmt: skip
        if max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {max_staleness}")
        self.roller, self.gate = roller, gate
        self.first, self.last, self.max_staleness = first, last, max_staleness
        self.steps = list(range(first, last + 1)) if steps is None else list(steps)
        self.per_tree = per_tree
        self.draw, self.seed, self.context = draw, seed, context
        self.ready: queue.Queue[Batch | BaseException] = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._work, name="async-rollout", daemon=True)
        self.taken: list[int] = []

    def start(self) -> AsyncRollout:
        self.thread.start()
        return self

    def _work(self) -> None:
        try:
            with torch.no_grad(), self.context(), worker_stream(self.gate.actor):
                if self.per_tree:
                    TreeStream(self).run()
                    return
                for step in self.steps:
                    t0 = time.perf_counter()
                    if not self.gate.wait_for(step - 1 - self.max_staleness, self.stop):
                        return
                    waited = time.perf_counter() - t0
                    published = self.gate.version
                    tasks = self.draw(step)
                    forest, stats = self.roller.run(tasks, seed=self.seed(step))
                    self.ready.put(Batch(step, forest, stats, tasks, published, waited))
        except BaseException as exc:  # the learner re-raises it at its next take
            self.ready.put(exc)

    def next(self) -> Batch:
        """The next batch the worker has grown (blocks); raises what the worker raised."""
        while True:
            try:
                got = self.ready.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the asynchronous rollout worker ended without a batch") from None
        if isinstance(got, BaseException):
            raise RuntimeError(f"the asynchronous rollout worker failed: {got!r}") from got
        return got

    def take(self, step: int) -> Batch:
        """The batch of learner step `step` (blocks until the worker has grown it); checks its staleness."""
        got = self.next()
        checked(got, step, self.max_staleness)
        self.taken.append(step)
        return got

    def publish(self, version: int) -> dict[str, float]:
        """The learner's weights become `version` for the worker; the `time/` metrics of the hand-over."""
        t0 = time.perf_counter()
        self.gate.publish(version)
        return {"time/weight_publish_s": time.perf_counter() - t0}

    def close(self) -> None:
        """Stops the worker after its current run (its batch, if any, is discarded)."""
        self.stop.set()
        with self.gate.changed:
            self.gate.changed.notify_all()
        self.thread.join()


@dataclass
class _Open:
    """A batch whose trees are growing (per-tree admission)."""

    tasks: list[RolloutTask]
    forest: list[RolloutTree | None]
    stats: RolloutStats
    left: int  # trees not finished
    published: int = -1
    wait_s: float = 0.0
    early: int = 0


class TreeStream:
    """Per-tree admission: one episode loop grows the trees of every batch, each tree started as soon as the
    bound admits its batch (version >= b - 1 - max_staleness), so batch b + 1's trees fill the engine while
    batch b's slowest tree finishes, instead of waiting for it. A batch is queued when all its trees are done,
    in step order. Staleness is bounded as with per-batch admission (a tree's tokens are no older than the
    version that admitted it); batches keep their tasks, not their sampling seeds (one loop samples them all).

    The loop draws starts from this iterator (`__next__`), which answers StopIteration while nothing is
    admissible: the loop goes on with the trees it has, asks again at its next engine step or round, and
    ends when none is left; `run` then waits for the next version and starts the loop again."""

    def __init__(self, pipe: AsyncRollout) -> None:
        self.pipe, self.roller, self.gate = pipe, pipe.roller, pipe.gate
        self.todo = list(pipe.steps)  # batches not opened yet
        self.order = list(pipe.steps)  # batches not queued yet
        self.starts: list[tuple[int, int, RolloutTask]] = []  # (step, tree index, task) not started yet
        self.open: dict[int, _Open] = {}
        self.refused_at: float | None = None
        self.loop_stats = RolloutStats()
        self.mark = (0.0, 0.0, 0, 0.0, time.perf_counter())  # loop stats when the last batch was queued

    def __iter__(self) -> TreeStream:
        return self

    def __next__(self) -> Callable[[], Any]:
        if self.pipe.stop.is_set():
            raise StopIteration
        if not self.starts and self.todo:
            step = self.todo.pop(0)
            tasks = self.pipe.draw(step)
            self.open[step] = _Open(tasks, [None] * len(tasks), RolloutStats(), len(tasks))
            self.starts = [(step, i, t) for i, t in enumerate(tasks)]
            self._queue()  # (a batch of no tasks)
        if not self.starts:
            raise StopIteration
        step, ti, task = self.starts[0]
        if self.gate.version < self.needs(step):
            if self.refused_at is None:
                self.refused_at = time.perf_counter()
            raise StopIteration
        self.starts.pop(0)
        b = self.open[step]
        b.early += any(s < step and o.left for s, o in self.open.items())
        if ti == 0:  # the batch's admission
            b.published = self.gate.version
            b.wait_s = time.perf_counter() - self.refused_at if self.refused_at is not None else 0.0
            self.refused_at = None
        rng = np.random.default_rng([self.pipe.seed(step), ti])  # the tree's branching draws
        return functools.partial(self._episode, step, ti, task, rng)

    def needs(self, step: int) -> int:
        return step - 1 - self.pipe.max_staleness

    def _episode(self, step: int, ti: int, task: RolloutTask, rng: np.random.Generator) -> Any:
        b = self.open[step]
        key = self.roller.tree_key(self.pipe.seed(step), ti)  # (keyed turns: rollout_keys)
        yield from self.roller._grow(ti, task, rng, b.forest, b.stats, key)
        b.left -= 1
        self._queue()

    def _queue(self) -> None:
        """Queues the finished batches at the head of the step order."""
        while self.order and self.order[0] in self.open and self.open[self.order[0]].left == 0:
            step = self.order.pop(0)
            b = self.open.pop(step)
            ls, now = self.loop_stats, time.perf_counter()
            g, e, c, i, t = self.mark
            b.stats.generate_s += ls.generate_s - g  # the loop's times since the last batch was queued
            b.stats.env_s += ls.env_s - e
            b.stats.generate_calls += ls.generate_calls - c
            b.stats.idle_s += ls.idle_s - i
            b.stats.wall_s += now - t
            self.mark = (ls.generate_s, ls.env_s, ls.generate_calls, ls.idle_s, now)
            forest = [t for t in b.forest if t is not None]
            self.pipe.ready.put(Batch(step, forest, b.stats, b.tasks, b.published, b.wait_s, b.early))

    def run(self) -> None:
        from toolgym.agents.episode_loop import EpisodeLoop
        from toolgym.trainers.rollout import _EngineTurns, _RoundTurns

        r = self.roller
        sampling = np.random.default_rng(self.pipe.seed(self.pipe.steps[0]) if self.pipe.steps else 0)
        while self.order and not self.pipe.stop.is_set():
            if self.starts or self.todo:
                step = self.starts[0][0] if self.starts else self.todo[0]
                if not self.gate.wait_for(self.needs(step), self.pipe.stop):
                    return
            if r.continuous:
                loop = EpisodeLoop(env_workers=r.env_workers, plan_wait=r.plan_wait, stats=self.loop_stats)
                turns = _EngineTurns(r.policy, r.cfg, sampling, r.gate)
                loop.on_step = turns.safe_point
                loop.run(self, turns)
            else:
                rounds = _RoundTurns(r.policy, r.cfg, sampling, r.gate)
                EpisodeLoop(env_workers=r.round_workers, stats=self.loop_stats).run(self, rounds)


def checked(batch: Batch, step: int, max_staleness: int) -> Batch:
    """`batch` if it is step `step`'s and within the bound; else a RuntimeError (a bug: admission bounds it)."""
    if batch.step != step:
        raise RuntimeError(f"rollout batch {batch.step} arrived for learner step {step}")
    worst = staleness(batch.forest, step)[1]
    if worst > max_staleness:
        raise RuntimeError(f"step {step}: a group is {worst} versions old (max_staleness {max_staleness})")
    return batch


def token_versions(forest: list[RolloutTree]) -> list[list[int]]:
    """Every tree's sampled-token versions (model nodes with versions), one list per tree."""
    return [[v for n in t.nodes if n.trainable and n.versions for v in n.versions] for t in forest]


def staleness(forest: list[RolloutTree], step: int) -> tuple[float, int]:
    """(mean over sampled tokens, max over groups) of the staleness at learner step `step`: (step - 1) minus
    the version that sampled a token; a group's is that of its oldest token. (0, 0) without versions.

    >>> from toolgym.trainers.tree import RolloutTree
    >>> t = RolloutTree("q", [1]); _ = t.add(0, "model", [2, 3], turn=0, versions=[3, 4])
    >>> staleness([t], 6)
    (1.5, 2)
    """
    per_tree = token_versions(forest)
    tokens = [step - 1 - v for vs in per_tree for v in vs]
    if not tokens:
        return 0.0, 0
    return sum(tokens) / len(tokens), max(step - 1 - min(vs) for vs in per_tree if vs)


def async_metrics(batch: Batch, step: int) -> dict[str, float]:
    """The `rollout/` metrics of an asynchronous batch (docs/trainer.md)."""
    mean, worst = staleness(batch.forest, step)
    versions = {v for vs in token_versions(batch.forest) for v in vs}
    return {
        "rollout/staleness_mean": mean,
        "rollout/staleness_max": float(worst),
        "rollout/versions_per_batch": float(len(versions)),  # > 1: weights changed while the batch grew
        "time/admission_wait_s": batch.wait_s,  # the worker waited for the bound to admit this batch
        "rollout/early_trees": float(batch.early),  # per-tree admission: started before the last batch ended
    }


def rollout_side(
    cfg: Any, policy: Any, device: torch.device, version: int, kv_budget: int | None,
    cleanup: contextlib.ExitStack,
) -> tuple[ActorWeights | None, Any]:  # fmt: skip
    """The gate and the rollout policy of a run of `cfg` (GRPO's or PPO's, one process): (None, `policy`) when
    synchronous; on vLLM servers (`rollout_servers`) their gate and a twin of `policy` (trainers/async_servers.py);
    else an actor copy behind our engine or HF (`actor_policy`)."""
    if not cfg.max_staleness:
        return None, policy
    if cfg.rollout_servers:
        from toolgym.trainers.async_servers import server_policy

        gate, rollout = server_policy(policy, version)
        cleanup.callback(rollout.close)
        return gate, rollout
    return actor_policy(cfg, policy, device, version, kv_budget)


def start_worker(
    cfg: Any,
    roller: TreeRollout,
    gate: ActorWeights,
    progress: Any,
    count: int,
    device: torch.device,
    cleanup: contextlib.ExitStack,
) -> AsyncRollout:
    """The worker of a run at `progress` (its step and data position: the start, or a resumed checkpoint's):
    batch s holds the `count` tasks at the data position learner step s starts at, with the synchronous loop's
    seed; stopped by `cleanup` when the run fails (register it after the roller's close: it runs first)."""
    from toolgym.trainers.episodes import next_tasks
    from toolgym.trainers.modeling import autocast

    step, data_pos = progress.step, progress.data_pos
    pipe = AsyncRollout(
        roller, gate, first=step + 1, last=cfg.steps, max_staleness=cfg.max_staleness,
        draw=lambda s: next_tasks(cfg.env_ids, cfg.seed, data_pos + (s - step - 1) * cfg.prompts_per_step, count),
        seed=lambda s: cfg.seed * 100_003 + s, context=lambda: autocast(device, cfg.bf16),
        per_tree=cfg.async_admission == "tree",
    ).start()  # fmt: skip
    cleanup.callback(pipe.close)
    return pipe


def actor_policy(
    cfg: Any, policy: Any, device: torch.device, version: int, kv_budget: int | None = None
) -> tuple[ActorWeights, Any]:
    """The gate and the rollout policy of an asynchronous run: an actor copy of `policy`'s model (the
    learner's) behind the same kind of policy (`cfg.engine`: our engine over the actor, or `HFPolicy`).
    `kv_budget`: the actor engine's KV-cache bytes in the run's memory estimate (`gpu_memory.memory_plan`,
    which counts the actor and its engine's packed copy too); None: `cfg.engine_memory` of free memory."""
    from toolgym.agents.hf import HFPolicy

    actor = ActorWeights.copy_of(policy.model)
    rollout = rollout_engine(
        cfg,
        HFPolicy(actor, policy.tokenizer, batch_size=256, reuse_kv=device.type == "cpu"),
        budget=kv_budget,
    )
    precapture(policy, cfg, temperature=0.0)  # the learner's engine runs the (greedy) evaluations
    return ActorWeights(policy.model, actor, version), rollout


def rollout_engine(cfg: Any, hf: Any, quiet: bool = True, budget: int | None = None) -> Any:
    """The rollout's policy over `hf`'s model (the actor): `cfg.engine` sized for a whole batch, graphs captured."""
    from toolgym.agents.engine.select import choose_engine

    rollout = choose_engine(
        hf, cfg.engine, rows=cfg.prompts_per_step * cfg.budget, capacity=cfg.max_total_tokens + cfg.max_new_tokens + 8,
        quiet=quiet, memory=cfg.engine_memory, budget=budget,
    )  # fmt: skip
    precapture(rollout, cfg)
    return rollout


def precapture(policy: Any, cfg: Any, temperature: float | None = None) -> int:
    """Captures the CUDA graph of every decode bucket of `policy`'s engine for the training sampling mode (or
    that mode at `temperature`: 0.0 for the greedy evaluations), now, before the worker starts: a capture
    later, while the other thread's kernels run, would fail (work on the legacy stream during a capture), so
    the engine never captures after this (``capture_new`` off: a mode not captured now, another temperature,
    decodes eager). Returns the graphs captured."""
    engine = getattr(policy, "engine", None)
    runner = getattr(engine, "runner", None)
    if runner is None:
        return 0
    runner.capture_new = False
    if not runner.cuda_graphs:
        return 0
    from toolgym.agents.engine.engine_policy import mode_of
    from toolgym.trainers.rollout import _sampling

    sampling = _sampling(cfg.rollout_config(), cfg.max_new_tokens, 0)
    if temperature is not None:
        sampling = dataclasses.replace(sampling, temperature=temperature)
    mode = mode_of(sampling, getattr(policy, "top_k", 0))
    n = 0
    with torch.no_grad():
        for b in runner.buckets:
            if (b, mode) not in runner._graphs:
                runner._graphs[(b, mode)] = runner._capture(b, mode)
                n += 1
            keyed = getattr(cfg, "rollout_keys", False) and sampling.temperature > 0  # (keyed turns' steps)
            if keyed and (b, mode) not in runner._keyed_graphs:
                runner._keyed_graphs[(b, mode)] = runner._capture(b, mode, True)
                n += 1
    runner.sync()
    return n
