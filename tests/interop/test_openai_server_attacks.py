"""``toolgym serve`` attacked as an outside client would: malformed and hostile requests, slow clients, clients
that leave mid-stream, a failing backend, a request after shutdown. Every answer is an OpenAI error object
with a 4xx for the client's fault (5xx for ours), never a bare 500, a trace, a hung request or a model reply
made of an error."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest

from toolgym.agents.openai_server import PolicyServer, ServerClosed
from toolgym.agents.policy import AssistantTurn
from toolgym.messages import Message
from toolgym.serving.base import Limits

pytest.importorskip("fastapi")

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class Echo:
    """A policy without tokens (as an OpenAI proxy is): answers "ok", or as ``fail`` says."""

    name = "echo"

    def __init__(self, fail: str = "", delay_s: float = 0.0) -> None:
        self.fail, self.delay_s, self.calls = fail, delay_s, 0

    def act(self, conversations: Any, tools: Any, sampling: Any = None, envs: Any = None) -> list[Any]:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.fail == "error-turn":  # what agents/openai_client.py returns when its server failed
            turn = AssistantTurn(text="http://up/v1 failed after 3 attempts: 503", message=Message(
                role="assistant", content=""), finish_reason="error")  # fmt: skip
            return [turn for _ in conversations]
        if self.fail == "short":
            return []
        return [
            AssistantTurn(text="ok", message=Message(role="assistant", content="ok")) for _ in conversations
        ]


def _error(resp: httpx.Response, status: int, needle: str = "") -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}, body  # OpenAI's error object
    assert body["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert needle in body["message"], body["message"]
    assert "Traceback" not in resp.text
    return dict(body)


@pytest.fixture(scope="module")
def token_server() -> Iterator[tuple[PolicyServer, httpx.Client, list[int]]]:
    from tests.interop.interop_models import chatml_policy

    policy = chatml_policy()
    server = PolicyServer(policy, port=0, limits=Limits(max_body_bytes=2**20, body_timeout_s=1.0)).start()
    ids = policy.renderer.prompt_ids([{"role": "user", "content": "hi"}], None)
    try:
        yield server, httpx.Client(base_url=server.url, timeout=60), ids
    finally:
        server.close()


@pytest.fixture(scope="module")
def echo_server() -> Iterator[tuple[PolicyServer, httpx.Client]]:
    server = PolicyServer(Echo(), port=0, max_tokens_limit=1000).start()
    try:
        yield server, httpx.Client(base_url=server.url, timeout=60)
    finally:
        server.close()


def raw(client: httpx.Client, path: str, text: str) -> httpx.Response:
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


# ----- malformed requests ----------------------------------------------------------------------------------
BAD_COMPLETIONS = {
    "not json": ("{not json", "not valid JSON"),
    "a list": ("[1, 2]", "valid dictionary"),
    "null": ("null", "valid dictionary"),
    "wrong type": ('{"prompt": [1], "max_tokens": "x"}', "max_tokens"),
    "missing prompt": ('{"max_tokens": 2}', "prompt: Field required"),
    "NaN temperature": ('{"prompt": [1], "temperature": NaN}', "temperature"),
    "Infinity top_p": ('{"prompt": [1], "top_p": Infinity}', "top_p"),
    "negative max_tokens": ('{"prompt": [1], "max_tokens": -5}', "max_tokens"),
    "huge max_tokens": ('{"prompt": [1], "max_tokens": 1000000000000000000000000}', "maximum context length"),
    "huge n": ('{"prompt": [1], "n": 1000000}', "n:"),
    "booleans as ids": ('{"prompt": [true, false]}', "prompt"),  # (was: served as ids 1 and 0)
    "floats as ids": ('{"prompt": [1.0]}', "prompt"),
    "an id past the vocabulary": ('{"prompt": [1000000000000000000000000]}', "out of the vocabulary"),
    "a negative id": ('{"prompt": [-1]}', "out of the vocabulary"),
    "empty prompt": ('{"prompt": []}', "prompt is empty"),
    "an empty prompt in a batch": ('{"prompt": [[1], []]}', "empty"),
    "empty text prompt": ('{"prompt": ""}', "empty"),
    "negative logprobs": ('{"prompt": [1], "logprobs": -1}', "logprobs"),
    "boolean stop ids": ('{"prompt": [1], "stop_token_ids": [true]}', "stop_token_ids"),
    "streamed": ('{"prompt": [1], "stream": true}', "stream"),
    "thousands of stop strings": (json.dumps({"prompt": [1], "stop": ["x"] * 5000}), "at most 64 stop"),
    "a huge stop string": (json.dumps({"prompt": [1], "stop": "x" * 5000}), "at most 1024"),
}


@pytest.mark.parametrize("name", sorted(BAD_COMPLETIONS))
def test_malformed_completions_are_openai_400s(token_server: Any, name: str) -> None:
    _, client, _ = token_server
    text, needle = BAD_COMPLETIONS[name]
    _error(raw(client, "/completions", text), 400, needle)


def test_malformed_json_names_the_problem_not_a_field(token_server: Any) -> None:
    _, client, _ = token_server
    body = _error(raw(client, "/chat/completions", '{"messages": ['), 400, "not valid JSON")
    assert body["param"] is None  # (was "1": the byte offset read as a field name)


def test_unknown_routes_and_methods_are_openai_errors(token_server: Any) -> None:
    _, client, _ = token_server
    _error(client.get("/nothing"), 404, "no route GET /v1/nothing")
    assert client.get("/completions").status_code in (404, 405)
    assert "error" in client.get("/completions").json()


def test_huge_max_tokens_without_a_known_context_is_a_400(echo_server: Any) -> None:
    server, client = echo_server
    calls = server.policy.calls
    _error(client.post("/chat/completions", json={**CHAT, "max_tokens": 10**30}), 400, "max_tokens")
    _error(client.post("/chat/completions", json={**CHAT, "max_tokens": 10**30, "stream": True}), 400)
    assert server.policy.calls == calls  # refused before the policy saw it
    assert client.post("/chat/completions", json={**CHAT, "max_tokens": 1000}).status_code == 200


# ----- huge and slow bodies --------------------------------------------------------------------------------
def test_a_body_past_the_limit_is_413_before_it_is_read(token_server: Any) -> None:
    _, client, ids = token_server
    _error(client.post("/completions", json={"prompt": ids, "junk": "x" * 2**21}), 413, "at most")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"prompt": [1], "junk": "'
        for _ in range(40):
            yield b"x" * 2**16
        yield b'"}'

    resp = client.post("/completions", content=chunks(), headers={"content-type": "application/json"})
    _error(resp, 413, "over")
    assert client.post("/completions", json={"prompt": ids, "max_tokens": 1}).status_code == 200


def test_a_slow_client_is_408_and_holds_up_no_one(token_server: Any) -> None:
    """Slowloris: a client sends its headers and then a byte now and then; it is answered 408 after
    ``body_timeout_s`` while other clients are served meanwhile."""
    server, client, ids = token_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 1000\r\n\r\n{")  # fmt: skip
        t0 = time.monotonic()
        assert client.post("/completions", json={"prompt": ids, "max_tokens": 1}).status_code == 200
        sock.sendall(b" ")
        answer = b""
        while chunk := sock.recv(4096):  # (the server closes the connection after its answer)
            answer += chunk
        assert time.monotonic() - t0 < 8
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 408"), head
    assert json.loads(body)["error"]["code"] == "body_timeout"


# ----- models, failing backends, shutdown ------------------------------------------------------------------
def test_the_answer_names_the_model_served_and_strict_mode_refuses_others() -> None:
    with PolicyServer(Echo(), port=0) as lenient:
        out = httpx.post(f"{lenient.url}/chat/completions", json={**CHAT, "model": "gpt-9"}, timeout=30)
        assert out.status_code == 200 and out.json()["model"] == "echo"  # (was "gpt-9": a model never served)
    with PolicyServer(Echo(), port=0, strict_model=True) as strict:
        resp = httpx.post(f"{strict.url}/chat/completions", json={**CHAT, "model": "gpt-9"}, timeout=30)
        assert _error(resp, 404, "does not exist")["code"] == "model_not_found"
        ok = httpx.post(f"{strict.url}/chat/completions", json={**CHAT, "model": "echo"}, timeout=30)
        assert ok.status_code == 200


def test_a_failed_backend_turn_is_a_502_never_the_models_reply() -> None:
    """(Was: 200 with finish_reason "stop" and the upstream error as the assistant's content.)"""
    with PolicyServer(Echo(fail="error-turn"), port=0) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        body = _error(client.post("/chat/completions", json=CHAT), 502, "failed after 3 attempts")
        assert body["code"] == "upstream_error"
        streamed = client.post("/chat/completions", json={**CHAT, "stream": True})
        assert streamed.status_code == 502


def test_a_policy_returning_too_few_turns_is_a_json_500() -> None:
    with PolicyServer(Echo(fail="short"), port=0) as server:
        _error(httpx.post(f"{server.url}/chat/completions", json=CHAT, timeout=30), 500, "0 turns")


def test_a_request_after_shutdown_is_refused_never_left_waiting() -> None:
    server = PolicyServer(Echo(), port=0).start()
    url = server.url
    assert httpx.post(f"{url}/chat/completions", json=CHAT, timeout=30).status_code == 200
    server.close()
    with pytest.raises(httpx.TransportError):  # the port is closed: a typed transport error at once
        httpx.post(f"{url}/chat/completions", json=CHAT, timeout=5)
    fut = server.submit([{"role": "user", "content": "x"}], None, _sampling())
    with pytest.raises(ServerClosed):  # (was: queued for a batcher that had stopped: waited forever)
        fut.result(timeout=5)


def test_a_policy_that_ends_the_batcher_leaves_no_request_waiting() -> None:
    class Exits(Echo):
        def act(self, *a: Any, **kw: Any) -> list[Any]:
            raise SystemExit(1)  # (a BaseException: the batcher thread ends)

    with PolicyServer(Exits(), port=0) as server:
        client = httpx.Client(base_url=server.url, timeout=10)  # (was: both waited forever)
        _error(client.post("/chat/completions", json=CHAT), 503, "stopped the server")
        _error(client.post("/chat/completions", json=CHAT), 503, "shutting down")


def test_a_request_that_breaks_the_policy_fails_only_itself() -> None:
    """Requests batched together: one whose conversation makes the policy raise gets the 500, the others their
    replies (was: every request of the batch got the 500)."""

    class Poisoned(Echo):
        sizes: ClassVar[list[int]] = []

        def act(self, conversations: Any, *a: Any, **kw: Any) -> list[Any]:
            self.sizes.append(len(conversations))
            if any("poison" in m["content"] for c in conversations for m in c):
                raise ValueError("the tokenizer choked")
            return super().act(conversations, *a, **kw)

    with PolicyServer(Poisoned(), port=0, batch_window_s=1.0) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        codes: dict[str, int] = {}

        def go(text: str) -> None:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
            codes[text] = client.post("/chat/completions", json=body).status_code

        threads = [threading.Thread(target=go, args=(t,)) for t in ("a", "poison", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert codes == {"a": 200, "poison": 500, "b": 200}
        assert (
            Poisoned.sizes[0] > 1 and Poisoned.sizes.count(1) >= 2
        )  # a batch with the poison, then each alone


def _sampling() -> Any:
    from toolgym.agents.policy import SamplingParams

    return SamplingParams(max_new_tokens=2)


# ----- concurrency and clients that leave ------------------------------------------------------------------
def test_concurrent_good_and_bad_requests_each_get_their_own_answer(token_server: Any) -> None:
    _, client, ids = token_server
    bodies = [
        {"prompt": ids, "max_tokens": 2, "temperature": 0} if i % 3 else {"prompt": [10**9]}
        for i in range(12)
    ]
    results: list[int] = [0] * len(bodies)

    def go(i: int) -> None:
        results[i] = client.post("/completions", json=bodies[i]).status_code

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [400 if i % 3 == 0 else 200 for i in range(len(bodies))]


def test_a_client_leaving_mid_stream_leaves_the_server_serving(token_server: Any) -> None:
    server, client, ids = token_server
    assert server.streams_tokens
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "n": 4, "stream": True}
    with client.stream("POST", "/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        first = next(resp.iter_lines())
        assert first.startswith("data: ") and json.loads(first[6:])["choices"]
    # the connection is closed mid-stream; the server is not stuck on it
    for _ in range(3):
        out = client.post("/completions", json={"prompt": ids, "max_tokens": 2})
        assert out.status_code == 200
    deadline = time.monotonic() + 30
    while not server._jobs.empty() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server._jobs.empty() and server._worker.is_alive()
