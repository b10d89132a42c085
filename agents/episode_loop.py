"""The one episode loop: `toolgym eval`'s episodes, a training step's rollout trees and the in-training
evaluation all run here.

An episode (or a tree of episodes) is a generator, an ``Episode``: it never calls the policy or an env
itself but yields work and gets the results back, so what it records depends only on what was generated,
never on how the work was scheduled:

- ``Generate(requests, lefts)``: one model turn per request (``lefts``: each turn's token allowance,
  when the caller gives each its own); gets one result per request;
- ``EnvCalls(calls)``: env calls (any thread); gets one result per call, a ``Fault`` for an exception (a
  ``ConfigError`` ends the run: it is the caller's mistake, not the env's).

``EpisodeLoop.run(starts, turns)`` drives the episodes that ``starts`` make, at most ``concurrency`` at once
(the next starts as one ends), in one of two modes, picked by what ``turns`` is:

- rounds (``turns`` a ``RoundTurns``: any policy): each round, every request of every episode waiting for
  the model goes to ``turns.generate`` (one call per token allowance), then every env call of every episode
  waiting on its env runs (in a thread pool when ``env_workers > 0``, else on this thread). An episode
  that starts runs its first env calls (a reset) at once, so it joins the round it starts in.
- continuous (``turns`` an ``EngineTurns``: a policy with our engine): a request enters the engine's
  batch as soon as its episode makes it (``turns.plan`` makes and submits a sequence, or answers at once)
  and leaves it the step its turn ends (``turns.result``); env calls run on a thread pool while the engine
  decodes the other episodes. When nothing decodes and env calls are in flight, turns ready to start wait
  up to ``plan_wait`` seconds for those calls, so that they share one prefill pass.

  A turn the engine cannot end (``TurnFailed`` from ``step``: no rollout server answered it) goes to
  ``turns.failed``, whose value its episode gets as the turn's result (the tree rollout ends that path as an
  ``env_error``); the other turns go on. Turns without ``failed`` let the error end the run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from toolgym.errors import ConfigError, InfrastructureError


@dataclass
class Generate:
    """Work an episode yields: one model turn per request; ``lefts[i]``: request i's token allowance (empty:
    the caller's sampling decides)."""

    requests: list[Any]
    lefts: list[int] = field(default_factory=list)


@dataclass
class EnvCalls:
    """Work an episode yields: env calls (any thread); gets their results back, a ``Fault`` for an exception."""

    calls: list[Callable[[], Any]]


@dataclass
class Fault:
    """An env call's exception (an infrastructure fault of that env, not the model's failure)."""

    error: str


@dataclass
class Answered:
    """``EngineTurns.plan``'s answer for a request that needs no engine turn (e.g. no room left for one)."""

    value: Any


Episode = Generator["Generate | EnvCalls", list[Any], None]


class TurnFailed(InfrastructureError):
    """From an engine's ``step``: the turn of ``seq`` cannot end (no rollout server answered it). ``seq`` (set
    by the engine) is out of the batch, released; the engine stays usable and the other turns end in later
    steps."""

    seq: Any = None


class RoundTurns(Protocol):
    def generate(self, requests: list[Any], left: int | None) -> list[Any]:
        """One result per request, in order (``left``: the requests' shared token allowance, if any)."""
        ...


@runtime_checkable
class EngineTurns(Protocol):
    engine: Any  # an ``Engine``: submit / step / busy / cancel

    def plan(self, requests: list[Any], lefts: list[int | None]) -> list[Any]:
        """A submitted engine sequence per request, or ``Answered`` where no turn is to run."""
        ...

    def result(self, request: Any, seq: Any) -> Any:
        """The result of ``request`` whose turn, ``seq``, ended."""
        ...

    # optional: ``failed(request, seq, error) -> Any``, the result of a turn that failed (``TurnFailed``)


@dataclass
class LoopStats:
    generate_s: float = 0.0  # in generate calls (rounds); planning turns and engine steps (continuous)
    env_s: float = 0.0  # time in env calls (summed over threads when they overlap)
    generate_calls: int = 0  # generate calls (rounds) or engine steps (continuous)
    idle_s: float = 0.0  # continuous: wall time with nothing to decode, waiting for envs
    wall_s: float = 0.0


@dataclass(eq=False)
class _Slot:
    """An episode's generator and the work it waits for."""

    gen: Episode
    work: Generate | EnvCalls | None = None
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    done: bool = False


def call(fn: Callable[[], Any]) -> Any:
    """Runs an env call; an env fault comes back as a ``Fault`` (a config error still raises)."""
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as exc:  # an infrastructure fault of this env: this episode only
        return Fault(f"{type(exc).__name__}: {exc}")


def turn_room(engine: Any, seq: Any) -> int:
    """New tokens ``seq``'s next turn may take: what is left of its slot, two positions kept back."""
    return int(engine.cache.capacity) - 2 - len(seq.ids)


def submit_turn(engine: Any, seq: Any, mode: Any, max_new: int, stop: Iterable[str], key: int = 0) -> bool:
    """Submit ``seq``'s next turn with at most ``max_new`` tokens; False when its slot has no room for one.
    ``key``: the turn's sampling key (``Engine.submit(key=)``; 0: the engine's generator)."""
    room = turn_room(engine, seq)
    if room < 1:
        return False
    if key:
        engine.submit(seq, mode, min(max_new, room), tuple(stop), key=key)
    else:  # (engines without keys take this too)
        engine.submit(seq, mode, min(max_new, room), tuple(stop))
    return True


class EpisodeLoop:
    """Drives episodes (see the module docstring). ``on_step(n, live)`` is called before each round's
    generate calls (rounds) or each engine step (continuous) with the number of live episodes."""

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        env_workers: int = 0,
        plan_wait: float = 0.0,
        on_step: Callable[[int, int], None] | None = None,
        stats: LoopStats | None = None,
    ) -> None:
        if concurrency is not None and concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.env_workers = env_workers
        self.plan_wait = plan_wait
        self.on_step = on_step
        self.stats = stats if stats is not None else LoopStats()
        self._lock = threading.Lock()

    def run(self, starts: Iterable[Callable[[], Episode]], turns: RoundTurns | EngineTurns) -> None:
        t0 = time.perf_counter()
        try:
            if isinstance(turns, EngineTurns):
                _Continuous(self, iter(starts), turns).run()
            else:
                self._rounds(iter(starts), turns)
        finally:
            self.stats.wall_s += time.perf_counter() - t0

    # ----- both modes --------------------------------------------------------------------------------------
    @staticmethod
    def _advance(slot: _Slot, first: bool = False) -> None:
        """Resumes an episode with its results until it waits for work (or ends)."""
        try:
            work = next(slot.gen) if first else slot.gen.send(slot.results)
            while not (work.requests if isinstance(work, Generate) else work.calls):
                work = slot.gen.send([])  # nothing to do: answer at once
        except StopIteration:
            slot.done, slot.work = True, None
            return
        slot.work = work
        n = len(work.requests) if isinstance(work, Generate) else len(work.calls)
        slot.results, slot.remaining = [None] * n, n

    def _room(self, live: int) -> bool:
        return self.concurrency is None or live < self.concurrency

    # ----- rounds ------------------------------------------------------------------------------------------
    def _rounds(self, starts: Iterator[Callable[[], Episode]], turns: RoundTurns) -> None:
        """Lock-step: every waiting turn in ``generate`` calls (one per token allowance), then every env call."""
        live: list[_Slot] = []
        pool = ThreadPoolExecutor(self.env_workers) if self.env_workers > 0 else None
        rounds = 0
        try:
            while True:
                while self._room(len(live)) and (start := next(starts, None)) is not None:
                    slot = _Slot(start())
                    self._advance(slot, first=True)
                    while isinstance(slot.work, EnvCalls):  # a newcomer joins this round's generate calls
                        self._env_phase([slot], None)
                        self._advance(slot)
                    if not slot.done:
                        live.append(slot)
                if not live:
                    return
                if any(isinstance(s.work, Generate) for s in live):
                    rounds += 1
                    if self.on_step is not None:
                        self.on_step(rounds, len(live))
                    self._generate_phase(live, turns)
                self._env_phase([s for s in live if isinstance(s.work, EnvCalls)], pool)
                for s in live:
                    self._advance(s)
                live = [s for s in live if not s.done]
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _generate_phase(self, live: list[_Slot], turns: RoundTurns) -> None:
        """Every waiting turn of ``live``, one ``generate`` call per token allowance."""
        groups: dict[int | None, list[tuple[_Slot, int]]] = {}
        for s in live:
            if isinstance(s.work, Generate):
                for k in range(len(s.work.requests)):
                    groups.setdefault(s.work.lefts[k] if s.work.lefts else None, []).append((s, k))
        for left, group in groups.items():
            t0 = time.perf_counter()
            got = turns.generate([s.work.requests[k] for s, k in group], left)  # type: ignore[union-attr]
            self.stats.generate_s += time.perf_counter() - t0
            self.stats.generate_calls += 1
            if len(got) != len(group):
                raise ConfigError(f"{turns!r} returned {len(got)} turns for {len(group)} requests")
            for (s, k), g in zip(group, got, strict=True):
                s.results[k] = g

    def _env_phase(self, slots: list[_Slot], pool: ThreadPoolExecutor | None) -> None:
        """Every env call of ``slots``, on ``pool`` or on this thread."""
        fns = [(s, k, fn) for s in slots for k, fn in enumerate(s.work.calls)]  # type: ignore[union-attr]
        if not fns:
            return
        t0 = time.perf_counter()
        got = [call(fn) for _, _, fn in fns] if pool is None else list(pool.map(call, [f for _, _, f in fns]))
        self.stats.env_s += time.perf_counter() - t0
        for (s, k, _), r in zip(fns, got, strict=True):
            s.results[k] = r


class _Continuous:
    """One continuous run: turns enter and leave the engine's decode batch one by one, env calls run on a
    thread pool meanwhile."""

    def __init__(
        self, loop: EpisodeLoop, starts: Iterator[Callable[[], Episode]], turns: EngineTurns
    ) -> None:
        self.loop, self.starts, self.turns, self.stats = loop, starts, turns, loop.stats
        self.eng = turns.engine
        self.pending: dict[Future[Any], tuple[_Slot, int]] = {}
        self.planned: list[_Slot] = []  # episodes whose turns wait for the next joint plan
        self.inflight: dict[int, Any] = {}  # engine sequences submitted and not ended, by id
        self.live = 0  # episodes started and not ended
        self.steps = 0
        self.pool = ThreadPoolExecutor(max(1, loop.env_workers), thread_name_prefix="episode-env")

    def run(self) -> None:
        try:
            while self._admit() or self.live > 0:
                self._wait_for_company()
                planned = self._plan()
                if self.eng.busy():
                    self._step()
                    ready = [f for f in self.pending if f.done()]
                elif self.pending:
                    t0 = time.perf_counter()
                    ready = list(wait(list(self.pending), return_when=FIRST_COMPLETED)[0])
                    self.stats.idle_s += time.perf_counter() - t0
                elif planned or self.planned or self.live == 0:
                    continue  # answered at once (the episodes went on), or the next ones start
                else:
                    raise RuntimeError("episode loop stalled: episodes wait for work that was never queued")
                self._collect(ready)
        finally:
            self.pool.shutdown(wait=True)
            for seq in self.inflight.values():  # an interrupted run leaves nothing in the batch
                if seq.state in ("queued", "active"):
                    self.eng.cancel(seq)

    def _admit(self) -> bool:
        started = False
        while self.loop._room(self.live) and (start := next(self.starts, None)) is not None:
            self.live += 1
            self._resume(_Slot(start()), first=True)
            started = True
        return started

    def _resume(self, slot: _Slot, first: bool = False) -> None:
        EpisodeLoop._advance(slot, first)
        if slot.done:
            self.live -= 1
        elif isinstance(slot.work, EnvCalls):
            for k, fn in enumerate(slot.work.calls):
                self.pending[self.pool.submit(self._timed, fn)] = (slot, k)
        else:
            self.planned.append(slot)

    def _timed(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return call(fn)
        finally:
            with self.loop._lock:
                self.stats.env_s += time.perf_counter() - t0

    def _give(self, slot: _Slot, k: int, value: Any) -> None:
        slot.results[k] = value
        slot.remaining -= 1
        if slot.remaining == 0:
            self._resume(slot)

    def _collect(self, ready: Iterable[Future[Any]]) -> None:
        for fut in ready:
            slot, k = self.pending.pop(fut)
            self._give(slot, k, fut.result())

    def _wait_for_company(self) -> None:
        """Nothing decodes: a turn planned now runs its own prefill pass (~50 launches a layer, ~40 ms on an
        H100 host), so env calls in flight get ``plan_wait`` seconds to join it (resets finish one by one,
        and an episode may need another env call after its reset)."""
        if not (self.planned and self.pending and not self.eng.busy() and self.loop.plan_wait > 0):
            return
        t0 = time.perf_counter()
        while self.planned and self.pending and (left := t0 + self.loop.plan_wait - time.perf_counter()) > 0:
            self._collect(wait(list(self.pending), timeout=left, return_when=ALL_COMPLETED)[0])
        self.stats.idle_s += time.perf_counter() - t0

    def _plan(self) -> bool:
        """Every episode's waiting turns in one plan: their new ids run as one packed prefill (a plan per
        episode was a prefill pass per group, ~30 layers of launches each, most of a short step)."""
        if not self.planned:
            return False
        asks = [(s, k, s.work) for s in self.planned for k in range(len(s.work.requests))]  # type: ignore[union-attr]
        self.planned.clear()
        t0 = time.perf_counter()
        seqs = self.turns.plan(
            [w.requests[k] for _, k, w in asks],  # type: ignore[union-attr]
            [w.lefts[k] if w.lefts else None for _, k, w in asks],  # type: ignore[union-attr]
        )
        self.stats.generate_s += time.perf_counter() - t0
        for (s, k, _), seq in zip(asks, seqs, strict=True):
            if isinstance(seq, Answered):
                self._give(s, k, seq.value)
            else:
                seq.tag = (s, k)
                self.inflight[seq.id] = seq
        return True

    def _step(self) -> None:
        self.steps += 1
        if self.loop.on_step is not None:
            self.loop.on_step(self.steps, self.live)
        t0 = time.perf_counter()
        lost: TurnFailed | None = None
        try:
            ended = self.eng.step()
        except TurnFailed as exc:  # (not one of our turns, or turns that cannot end one path: the run ends)
            if getattr(self.turns, "failed", None) is None or exc.seq is None or exc.seq.tag is None:
                raise
            ended, lost = [], exc
        self.stats.generate_s += time.perf_counter() - t0
        self.stats.generate_calls += 1
        if lost is not None:  # that turn's episode decides what its failure means; the other turns go on
            slot, k = lost.seq.tag
            lost.seq.tag = None
            self.inflight.pop(lost.seq.id, None)
            request = slot.work.requests[k]  # type: ignore[union-attr]
            self._give(slot, k, self.turns.failed(request, lost.seq, str(lost)))  # type: ignore[attr-defined]
        for seq in ended:
            slot, k = seq.tag
            seq.tag = None
            self.inflight.pop(seq.id, None)
            self._give(slot, k, self.turns.result(slot.work.requests[k], seq))  # type: ignore[union-attr]


class EnvPool:
    """Envs kept between episodes for reuse, by key (thread-safe: resets run on the loop's threads)."""

    def __init__(self) -> None:
        self._free: dict[Hashable, list[Any]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """A pooled env of ``key``, or ``make()``'s new one."""
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return make()

    def release(self, key: Hashable, env: Any) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(env)

    def drain(self) -> list[Any]:
        """Every pooled env, taken out of the pool."""
        with self._lock:
            envs = [env for free in self._free.values() for env in free]
            self._free.clear()
        return envs


def close_quietly(env: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken env must not end the run or hide results
        env.close()
