"""``toolgym serve`` streams tokens as they are sampled (the real ``openai`` client reading SSE)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pytest

from tests.interop.interop_models import chatml_policy
from toolgym.agents.openai_server import PolicyServer
from toolgym.agents.policy import Generation, RenderedTokenPolicy, SamplingParams

openai = pytest.importorskip("openai")

CONV = [{"role": "user", "content": "What is 37*58?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def _client(server: PolicyServer) -> Any:
    return openai.OpenAI(base_url=server.url, api_key="none", timeout=120, max_retries=0)


def _timed(stream: Any) -> list[tuple[float, Any]]:
    return [(time.monotonic(), chunk) for chunk in stream]


def test_tokens_arrive_while_the_reply_is_sampled() -> None:
    """Each forward of the model takes 50 ms: the first tokens must reach the client long before the last."""
    policy = chatml_policy()
    hook = policy.model.register_forward_hook(lambda *a: time.sleep(0.05))
    try:
        with PolicyServer(policy, port=0) as server:
            client = _client(server)
            whole = client.chat.completions.create(
                model="m", messages=CONV, temperature=0, max_tokens=16, logprobs=True
            )
            chunks = _timed(
                client.chat.completions.create(
                    model="m",
                    messages=CONV,
                    temperature=0,
                    max_tokens=16,
                    stream=True,
                    logprobs=True,
                    stream_options={"include_usage": True},
                )
            )
    finally:
        hook.remove()
    tokens = [(t, c) for t, c in chunks if c.choices and c.choices[0].logprobs]
    n = whole.usage.completion_tokens
    assert n >= 6 and len(tokens) == n  # one chunk per token, each with its logprob
    finish_at = next(t for t, c in chunks if c.choices and c.choices[0].finish_reason)
    # the first token left (n - 1) forwards of 50 ms before the reply was done (half that, for a busy machine)
    assert finish_at - tokens[0][0] > 0.05 * (n - 1) * 0.5
    text = "".join(c.choices[0].delta.content or "" for _, c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    streamed = [c.choices[0].logprobs.content[0] for _, c in tokens]
    expected = whole.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in expected]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in expected], abs=1e-4)
    assert chunks[-1][1].usage.completion_tokens == n
    assert [c.choices[0].finish_reason for _, c in chunks if c.choices][-1] == whole.choices[0].finish_reason


class _SlowCaller(RenderedTokenPolicy):
    """A token policy that 'samples' a fixed reply with a tool call, 20 ms a token, reporting each token."""

    name = "slow-caller"
    TEXT = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "37*58"}}</tool_call>'
    )

    def __init__(self) -> None:
        self._renderer = chatml_policy().renderer
        self.ids = [*self._renderer.encode(self.TEXT), min(self._renderer.stop_ids)]

    @property
    def renderer(self) -> Any:
        return self._renderer

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None, *, on_token: Any = None
    ) -> list[Generation]:
        for tid in self.ids:
            time.sleep(0.02)
            for row in range(len(prompts)):
                if on_token is not None:
                    on_token(row, tid, -0.5)
        return [Generation(list(self.ids), [-0.5] * len(self.ids), "stop") for _ in prompts]


def test_a_streamed_tool_call_is_held_back_and_sent_structured() -> None:
    with PolicyServer(_SlowCaller(), port=0) as server:
        client = _client(server)
        assert server.streams_tokens
        chunks = list(client.chat.completions.create(model="m", messages=CONV, tools=TOOLS, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        content = "".join(d.content or "" for d in deltas)
        assert content == "Let me compute. " and "<tool" not in content
        (call,) = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert call.function.name == "calculator" and json.loads(call.function.arguments) == {
            "expression": "37*58"
        }
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        # without tools the same reply is plain text, streamed whole as it comes
        plain = list(client.chat.completions.create(model="m", messages=CONV, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in plain if c.choices)
        assert text == _SlowCaller.TEXT
        # n choices stream side by side, each with its own index
        both = list(client.chat.completions.create(model="m", messages=CONV, stream=True, n=2))
        for i in range(2):
            mine = "".join(
                c.choices[0].delta.content or "" for c in both if c.choices and c.choices[0].index == i
            )
            assert mine == _SlowCaller.TEXT


def test_a_failure_mid_stream_reaches_the_client() -> None:
    class Failing(_SlowCaller):
        def generate(self, prompts: Any, sampling: Any = None, *, on_token: Any = None) -> list[Generation]:
            on_token(0, self.ids[0], -0.1)
            raise RuntimeError("CUDA error: device lost")

    with PolicyServer(Failing(), port=0) as server:
        stream = _client(server).chat.completions.create(model="m", messages=CONV, stream=True)
        with pytest.raises(openai.APIError, match="device lost"):
            list(stream)
