"""The openai backend against real HTTP servers: ``toolgym serve``'s PolicyServer, and a flaky one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.processes import start, stop
from toolgym.agents import OpenAIPolicy, SamplingParams, run_episodes
from toolgym.agents.openai_server import PolicyServer
from toolgym.errors import ConfigError


def test_policy_server_round_trip_with_tools_and_logprobs(tiny_policy: Any) -> None:
    with PolicyServer(tiny_policy, port=0) as server:
        client = OpenAIPolicy(server.url, sampling=SamplingParams(temperature=0, max_new_tokens=6))
        conv = [{"role": "user", "content": "What is 2*3?"}]
        (turn,) = client.act([conv])
        assert client.model == tiny_policy.name
        (local,) = tiny_policy.act([conv], sampling=SamplingParams(temperature=0, max_new_tokens=6))
        assert turn.token_ids == local.token_ids and turn.text == local.text
        assert turn.logprobs == pytest.approx(local.logprobs, abs=1e-5)
        trajs = run_episodes(client, "toolgym/Calculator-v0", 3, env_kwargs={"max_turns": 2})
        assert all(t.turns == 2 and not t.infra_failure and t.completion_tokens == 12 for t in trajs)


def test_server_returns_structured_tool_calls_and_n_choices(tiny_policy: Any) -> None:
    class Caller:
        name = "caller"

        def act(self, conversations: Any, tools: Any = None, **kw: Any) -> Any:
            from toolgym.agents.policy import AssistantTurn, parse_turn

            text = 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
            return [AssistantTurn(text, parse_turn(text, t), [1, 2], [-0.1, -0.2]) for t in tools]

    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            },
        }
    ]
    with PolicyServer(Caller(), port=0) as server:
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "logprobs": True, "n": 2}
        data = httpx.post(server.url + "/chat/completions", json=body, timeout=10).json()
        assert len(data["choices"]) == 2
        choice = data["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me compute."
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "calculator" and json.loads(call["function"]["arguments"]) == {
            "expression": "2*3"
        }
        assert choice["token_ids"] == [1, 2] and [c["logprob"] for c in choice["logprobs"]["content"]] == [
            -0.1,
            -0.2,
        ]
        (turn,) = OpenAIPolicy(server.url).act([body["messages"]], [tools])
        assert turn.structured and turn.message.tool_calls and turn.action is turn.message
        bad = httpx.post(server.url + "/chat/completions", json={"messages": []}, timeout=10)
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]


class _Flaky(BaseHTTPRequestHandler):
    """503 (with Retry-After) for the first `fail` requests, then a fixed answer; counts requests."""

    fail = 2
    seen = 0

    def log_message(self, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        type(self).seen += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).seen <= type(self).fail:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            body = b"overloaded"
        else:
            self.send_response(200)
            body = json.dumps(
                {
                    "choices": [
                        {
                            "message": {"role": "assistant", "content": "<answer>6</answer>"},
                            "finish_reason": "stop",
                        }
                    ]
                }
            ).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_retries_503_then_succeeds() -> None:
    handler = type("H", (_Flaky,), {"fail": 2, "seen": 0})
    httpd = _serve(handler)
    try:
        policy = OpenAIPolicy(f"http://127.0.0.1:{httpd.server_port}", model="m", backoff_s=0.01)
        (turn,) = policy.act([[{"role": "user", "content": "2*3?"}]])
        assert turn.text == "<answer>6</answer>" and turn.finish_reason == "stop" and handler.seen == 3
    finally:
        httpd.shutdown()


def test_gives_up_after_retries_as_an_error_turn() -> None:
    handler = type("H", (_Flaky,), {"fail": 99, "seen": 0})
    httpd = _serve(handler)
    try:
        policy = OpenAIPolicy(
            f"http://127.0.0.1:{httpd.server_port}", model="m", max_retries=2, backoff_s=0.01
        )
        trajs = run_episodes(policy, "toolgym/Calculator-v0", 2)
        assert all(t.infra_failure and "503" in (t.error or "") for t in trajs) and handler.seen == 6
    finally:
        httpd.shutdown()


def test_connection_refused_and_bad_urls() -> None:
    policy = OpenAIPolicy("http://127.0.0.1:9", model="m", max_retries=1, backoff_s=0.01, timeout=2)
    (turn,) = policy.act([[{"role": "user", "content": "hi"}]])
    assert turn.finish_reason == "error" and "ConnectError" in turn.text
    with pytest.raises(ConfigError, match="http"):
        OpenAIPolicy("localhost:8000")


def test_toolgym_serve_command(tmp_path: Any, tiny_policy: Any) -> None:
    tiny_policy.model.save_pretrained(tmp_path)
    tiny_policy.tokenizer.save_pretrained(tmp_path)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start(
        [sys.executable, "-m", "toolgym", "serve", "--agent", f"hf:{tmp_path}", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        policy = OpenAIPolicy(
            f"http://127.0.0.1:{port}", sampling=SamplingParams(temperature=0, max_new_tokens=3)
        )
        (turn,) = policy.act([[{"role": "user", "content": "hi"}]])
        assert len(turn.token_ids) == 3 and len(turn.logprobs) == 3
    finally:
        stop(proc)
