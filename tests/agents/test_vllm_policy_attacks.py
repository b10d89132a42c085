"""``engine: vllm`` with ``rollout_servers`` (agents/vllm_policy.py ``ServerBackend``) against stand-in servers that
misbehave: hang past the timeout, go down and come back, lose a sticky episode's server mid-episode, answer 429,
echo another prompt, return a null logprob, fail one request of a batch. Every fault is a typed
InfrastructureError or a failover; no turn is lost, duplicated or read as the model's output, and routing stays
sticky and round robin."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from toolgym.agents.policy import SamplingParams
from toolgym.agents.vllm_policy import RequestFailed, ServerBackend, VLLMEngine
from toolgym.errors import InfrastructureError

Answer = Callable[[dict[str, Any]], tuple[int, Any]]  # request body -> (status, JSON body)


def reply(prompt: list[int], ids: tuple[int, ...] = (5, 6), **kw: Any) -> dict[str, Any]:
    """vLLM's answer: the sampled ids with their logprobs, and the prompt echoed (``return_token_ids``)."""
    choice = {"index": 0, "text": "", "finish_reason": "stop", "token_ids": list(ids), "prompt_token_ids": prompt,
              "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}  # fmt: skip
    choice.update(kw)
    return {"choices": [choice]}


def good(body: dict[str, Any]) -> tuple[int, Any]:
    return 200, reply(body["prompt"])


class StandIn:
    """A rollout server on a fixed port: ``answer`` decides each reply; ``down()`` closes the port (connection
    refused), ``up()`` listens on it again. ``seen`` holds every prompt it was sent."""

    def __init__(self, answer: Answer = good, port: int = 0) -> None:
        self.answer, self.seen = answer, []
        self.httpd: ThreadingHTTPServer | None = None
        self.port = port
        self.up()

    def up(self) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                stand_in.seen.append(body["prompt"])
                status, out = stand_in.answer(body)
                data = json.dumps(out).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout)
                    pass

            def log_message(self, *a: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def stand_ins() -> Iterator[list[StandIn]]:
    made: list[StandIn] = []
    yield made
    for s in made:
        s.down()


def backend_for(servers: list[StandIn], **kw: Any) -> ServerBackend:
    backend = ServerBackend([s.url for s in servers], **kw)
    backend.backoff_s = 0.01
    return backend


def run_one(backend: ServerBackend, ids: list[int], rid: str = "r") -> Any:
    backend.submit(rid, ids, {"max_tokens": 4})
    ((got, done),) = backend.poll()
    assert got == rid
    return done


# ----- servers that fail ----------------------------------------------------------------------------------
def test_a_hung_server_times_out_once_then_is_skipped(stand_ins: list[StandIn]) -> None:
    """(Was: every new request routed to the hung server waited a whole timeout before failing over.)"""

    def hang(body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(3)
        return good(body)

    hung, ok = StandIn(hang), StandIn()
    stand_ins += [hung, ok]
    backend = backend_for([hung, ok], timeout=0.5, cooldown_s=30)
    try:
        t0 = time.monotonic()
        for i in range(6):  # six new episodes, each least loaded first
            assert run_one(backend, [100 + i, 1], f"r{i}").token_ids == [5, 6]
        assert time.monotonic() - t0 < 2.5  # one timeout, not six
        assert len(hung.seen) == 1 and len(ok.seen) == 6 and backend.failovers == 1
    finally:
        backend.close()


@pytest.mark.parametrize("status", [429, 408, 503])
def test_busy_answers_fail_over_to_the_next_server(stand_ins: list[StandIn], status: int) -> None:
    busy, ok = StandIn(lambda body: (status, {"error": "busy"})), StandIn()
    stand_ins += [busy, ok]
    backend = backend_for([busy, ok])
    try:
        assert run_one(backend, [1, 2]).token_ids == [5, 6] and backend.failovers == 1  # (429 was fatal)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("another prompt echoed", lambda b: (200, reply([*b["prompt"][:-1], 99]))),
        ("a shorter prompt echoed", lambda b: (200, reply(b["prompt"][:-1]))),
        ("a null logprob", lambda b: (200, reply(b["prompt"], logprobs={"token_logprobs": [-0.5, None]}))),
        ("fewer logprobs than ids", lambda b: (200, reply(b["prompt"], logprobs={"token_logprobs": [-0.5]}))),
    ],
)
def test_answers_that_do_not_fit_the_request_fail_over(
    stand_ins: list[StandIn], name: str, answer: Answer
) -> None:
    """A server that answered another prompt (or a null logprob, read as 0.0 before) is that server's fault:
    the next server answers, the broken turn is never returned."""
    bad, ok = StandIn(answer), StandIn()
    stand_ins += [bad, ok]
    backend = backend_for([bad, ok])
    try:
        done = run_one(backend, [1, 2, 3])
        assert done.token_ids == [5, 6] and done.logprobs == [-0.5, -0.5] and backend.failovers == 1
        assert len(ok.seen) == 1
    finally:
        backend.close()


def test_every_server_failing_is_a_typed_request_failure(stand_ins: list[StandIn]) -> None:
    bad = StandIn(lambda body: (500, {"error": "oom"}))
    stand_ins.append(bad)
    backend = backend_for([bad])
    try:
        backend.submit("r", [1], {"max_tokens": 4})
        with pytest.raises(RequestFailed, match=r"no rollout server answered.*500") as err:
            backend.poll()
        assert err.value.rid == "r" and isinstance(err.value, InfrastructureError)
        assert len(bad.seen) == ServerBackend.ROUNDS and backend.load == [0]
    finally:
        backend.close()


# ----- sticky sessions -------------------------------------------------------------------------------------
def test_an_episodes_server_lost_mid_episode(stand_ins: list[StandIn]) -> None:
    """The server holding an episode goes down between its turns: the next turn fails over, and the turns
    after it (and the episode's forks) stick to the new server, even once the old one is back."""
    a, b = StandIn(), StandIn()
    stand_ins += [a, b]
    backend = backend_for([a, b], cooldown_s=0.2)
    try:
        prompt = [1, 2, 3]
        turn1 = run_one(backend, prompt, "t1")
        assert a.seen == [prompt]  # least loaded: the first server
        a.down()
        turn2_prompt = [*prompt, *turn1.token_ids, 7]
        turn2 = run_one(backend, turn2_prompt, "t2")
        assert b.seen == [turn2_prompt] and backend.failovers == 1
        a.up()
        time.sleep(0.3)  # past the cooldown: the old server takes requests again
        run_one(backend, [*turn2_prompt, *turn2.token_ids, 8], "t3")
        run_one(backend, [*prompt, 9], "fork")  # a fork of the first prompt: where the episode is now
        assert len(b.seen) == 3 and a.seen == [prompt]
        run_one(backend, [50, 51], "new")  # a new episode: least loaded, the first server again
        assert a.seen[-1] == [50, 51]
    finally:
        backend.close()


def test_new_episodes_round_robin_by_load(stand_ins: list[StandIn]) -> None:
    gate = threading.Event()

    def slow(body: dict[str, Any]) -> tuple[int, Any]:
        gate.wait(10)
        return good(body)

    servers = [StandIn(slow) for _ in range(3)]
    stand_ins += servers
    backend = backend_for(servers)
    try:
        for i in range(6):
            backend.submit(f"r{i}", [200 + i], {"max_tokens": 4})
        gate.set()
        got: list[str] = []
        while len(got) < 6:
            got += [rid for rid, _ in backend.poll()]
        assert sorted(got) == [f"r{i}" for i in range(6)]  # each once
        assert [len(s.seen) for s in servers] == [2, 2, 2]
    finally:
        backend.close()


# ----- one failed request loses no other ----------------------------------------------------------------------
def test_a_failed_request_loses_no_other_turn_and_leaves_the_engine_usable(stand_ins: list[StandIn]) -> None:
    """(Was: the turns that ended in the same poll as a failed one were dropped, and the engine then waited for
    them forever: `run()` spun with nothing in flight.)"""
    gate = threading.Event()

    def answer(body: dict[str, Any]) -> tuple[int, Any]:
        gate.wait(10)
        if body["prompt"][0] == 13:
            return 400, {"error": "bad request"}
        return good(body)

    server = StandIn(answer)
    stand_ins.append(server)
    backend = backend_for([server])
    engine = VLLMEngine(backend, capacity=64, stop_ids=[2], vocab=100)
    sp = SamplingParams(temperature=0.0, max_new_tokens=4)
    try:
        seqs = [engine.new([p, 1]) for p in (11, 13, 12)]
        for s in seqs:
            engine.submit(s, sp, 4)
        gate.set()
        time.sleep(0.3)  # all three answered: they end in one poll
        ended: list[Any] = []
        with pytest.raises(RequestFailed, match="400"):
            while engine.busy():
                ended += engine.step()
        while engine.busy():
            ended += engine.step()
        assert sorted(s.ids[0] for s in ended) == [11, 12] and all(s.out == [5, 6] for s in ended)
        assert seqs[1].state == "released" and not engine.busy()
        again = engine.new([14, 1])  # the engine goes on
        engine.submit(again, sp, 4)
        assert engine.run() == [again] and again.out == [5, 6]
    finally:
        backend.close()


# ----- a server that restarted holds its start-up weights ---------------------------------------------------
def test_a_server_that_went_away_takes_no_turn_until_the_next_weight_push(stand_ins: list[StandIn]) -> None:
    """With weights pushed by the trainer, a server that could not be reached may have restarted with the
    weights it was started with: its turns would be off-policy. It takes none until the next push (after its
    cooldown it would have); every server in that state is a typed error, never a silent stale turn."""
    a, b = StandIn(), StandIn()
    stand_ins += [a, b]
    backend = backend_for([a, b], cooldown_s=0.05)
    backend.track_weights = True
    try:
        a.down()
        run_one(backend, [1], "r1")
        a.up()
        time.sleep(0.1)  # past the cooldown
        for i in range(3):
            run_one(backend, [10 + i], f"n{i}")
        assert a.seen == [] and len(b.seen) == 4
        backend.pushed()
        run_one(backend, [20], "after-push")  # least loaded: the first server again
        assert a.seen == [[20]]
        a.down()
        b.down()
        backend.submit("lost", [30], {"max_tokens": 4})
        with pytest.raises(RequestFailed, match="unreachable since the last weight push"):
            for _ in range(ServerBackend.ROUNDS + 1):
                backend.poll()
    finally:
        backend.close()
