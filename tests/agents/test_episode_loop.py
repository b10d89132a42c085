"""The one episode loop (agents/episode_loop.py) with fake turn makers: who joins which round, token
allowances, env faults, answers without an engine turn, and an interrupted run leaving nothing in the batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from toolgym.agents.episode_loop import (
    Answered,
    EnvCalls,
    Episode,
    EpisodeLoop,
    Fault,
    Generate,
    LoopStats,
)
from toolgym.errors import ConfigError


def episode(name: str, turns: int, log: list[Any]) -> Episode:
    """Reset, then ``turns`` model turns each followed by an env step; logs what it got back."""
    (obs,) = yield EnvCalls([lambda: f"{name}:reset"])
    log.append(obs)
    for t in range(turns):
        (reply,) = yield Generate([f"{name}{t}"])
        (res,) = yield EnvCalls([lambda reply=reply: f"stepped {reply}"])
        log.append(res)


class Echo:
    """Rounds: each call's requests, upper-cased."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], int | None]] = []

    def generate(self, requests: list[Any], left: int | None) -> list[Any]:
        self.calls.append((list(requests), left))
        return [str(r).upper() for r in requests]


def test_rounds_a_newcomer_joins_the_round_it_starts_in() -> None:
    # a and c take one turn, b two; two at a time: c starts when a ends and joins b's second turn
    log: list[Any] = []
    echo = Echo()
    rounds: list[tuple[int, int]] = []
    loop = EpisodeLoop(concurrency=2, on_step=lambda n, live: rounds.append((n, live)))
    loop.run([lambda: episode("a", 1, log), lambda: episode("b", 2, log), lambda: episode("c", 1, log)], echo)
    assert echo.calls == [(["a0", "b0"], None), (["b1", "c0"], None)]
    assert rounds == [(1, 2), (2, 2)]
    assert log == ["a:reset", "b:reset", "stepped A0", "stepped B0", "c:reset", "stepped B1", "stepped C0"]
    assert loop.stats.generate_calls == 2


def test_rounds_one_generate_call_per_token_allowance() -> None:
    def ask(lefts: list[int]) -> Episode:
        got = yield Generate([f"r{i}" for i in range(len(lefts))], lefts)
        assert got == [f"R{i}" for i in range(len(lefts))]

    echo = Echo()
    EpisodeLoop().run([lambda: ask([5, 3, 5]), lambda: ask([3])], echo)
    assert echo.calls == [(["r0", "r2"], 5), (["r1", "r0"], 3)]


def test_env_faults_come_back_and_config_errors_end_the_run() -> None:
    got: list[Any] = []

    def broken(exc: Exception) -> Episode:
        def boom() -> None:
            raise exc

        got.extend((yield EnvCalls([boom, lambda: "fine"])))

    EpisodeLoop().run([lambda: broken(OSError("disk"))], Echo())
    assert got[0] == Fault("OSError: disk") and got[1] == "fine"
    with pytest.raises(ConfigError, match="bad id"):
        EpisodeLoop(env_workers=2).run([lambda: broken(ConfigError("bad id"))], Echo())


@dataclass(eq=False)
class FakeSeq:
    id: int
    request: Any
    state: str = "queued"
    tag: Any = None
    ids: list[int] = field(default_factory=list)


class FakeEngine:
    """Ends one submitted turn a step, in order of submission."""

    def __init__(self) -> None:
        self.queue: list[FakeSeq] = []
        self.cancelled: list[Any] = []

    def busy(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[FakeSeq]:
        seq = self.queue.pop(0)
        seq.state = "idle"
        return [seq]

    def cancel(self, seq: FakeSeq) -> None:
        self.queue.remove(seq)
        seq.state = "released"
        self.cancelled.append(seq.request)


class FakeTurns:
    """Continuous: a request "skip..." is answered at once; the others run as engine turns."""

    def __init__(self) -> None:
        self.engine = FakeEngine()
        self.plans: list[list[Any]] = []
        self._ids = 0

    def plan(self, requests: list[Any], lefts: list[int | None]) -> list[Any]:
        self.plans.append(list(requests))
        out: list[Any] = []
        for r in requests:
            if str(r).startswith("skip"):
                out.append(Answered(None))
                continue
            self._ids += 1
            seq = FakeSeq(self._ids, r)
            self.engine.queue.append(seq)
            out.append(seq)
        return out

    def result(self, request: Any, seq: FakeSeq) -> Any:
        assert seq.request == request
        return f"turn of {request}"


def test_continuous_turns_end_one_by_one_and_answers_come_at_once() -> None:
    log: list[Any] = []

    def skipper() -> Episode:
        (got,) = yield Generate(["skip it"])
        log.append(got)

    turns = FakeTurns()
    stats = LoopStats()
    loop = EpisodeLoop(concurrency=3, env_workers=2, stats=stats)
    loop.run([lambda: episode("a", 2, log), skipper, lambda: episode("b", 1, log)], turns)
    assert sorted(map(str, log)) == sorted(
        ["a:reset", "b:reset", "None", "stepped turn of a0", "stepped turn of a1", "stepped turn of b0"]
    )
    assert ["skip it"] in turns.plans
    assert not turns.engine.busy() and stats.generate_calls == 3  # one engine step a turn here


def test_a_failing_episode_cancels_the_turns_in_flight() -> None:
    def waits() -> Episode:
        yield Generate(["never ends"])

    def fails() -> Episode:
        yield Generate(["skip"])
        raise RuntimeError("the episode's own bug")

    turns = FakeTurns()
    turns.engine.step = lambda: []  # type: ignore[method-assign]  # an engine whose turns never end
    with pytest.raises(RuntimeError, match="own bug"):
        EpisodeLoop().run([waits, fails], turns)
    assert turns.engine.cancelled == ["never ends"]
