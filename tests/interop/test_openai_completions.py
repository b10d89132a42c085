"""``toolgym serve``'s ``POST /v1/completions`` with token ids in and out, as vLLM's server takes it (the request
``engine: vllm`` with ``rollout_servers`` sends): an in-process server on the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.interop.interop_models import chatml_policy
from toolgym.agents.openai_server import PolicyServer, cpu_threads
from toolgym.agents.policy import SamplingParams

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[PolicyServer, Any]]:
    server = PolicyServer(chatml_policy(), port=0).start()
    try:
        yield server, httpx.Client(base_url=server.url, timeout=120)
    finally:
        server.close()


def prompt_ids() -> list[int]:
    policy = chatml_policy()
    return policy.renderer.prompt_ids([{"role": "user", "content": "What is 2+2?"}], None)


def post(client: Any, **body: Any) -> dict[str, Any]:
    resp = client.post("/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_token_ids_in_and_out_match_generate(served: Any) -> None:
    _, client = served
    ids = prompt_ids()
    out = post(
        client, prompt=ids, max_tokens=8, temperature=0, logprobs=0, return_token_ids=True,
        return_tokens_as_token_ids=True,
    )  # fmt: skip
    choice = out["choices"][0]
    want = chatml_policy().generate([ids], SamplingParams(temperature=0, max_new_tokens=8))[0]
    assert choice["token_ids"] == want.token_ids
    assert choice["prompt_token_ids"] == ids
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in want.token_ids]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(want.logprobs, abs=1e-5)
    assert choice["finish_reason"] == want.finish_reason
    assert out["object"] == "text_completion"
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["usage"]["completion_tokens"] == len(want.token_ids)


def test_top_logprobs_and_token_text(served: Any) -> None:
    _, client = served
    out = post(client, prompt=prompt_ids(), max_tokens=4, temperature=0, logprobs=3)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert not tok.startswith("token_id:")
        assert 3 <= len(top) <= 4 and tok in top  # the sampled token is always among them (vLLM's rule)
        assert max(top.values()) == pytest.approx(value, abs=1e-4)  # greedy: the top token was taken
    assert "token_ids" not in out["choices"][0]


def test_batch_of_prompts_and_n_choices(served: Any) -> None:
    _, client = served
    ids = prompt_ids()
    out = post(
        client, prompt=[ids, ids[:-3]], n=2, max_tokens=3, temperature=1.0, seed=1, return_token_ids=True
    )
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in out["choices"]] == [ids, ids, ids[:-3], ids[:-3]]


def test_stop_token_ids_end_the_reply_and_stay_in_it(served: Any) -> None:
    _, client = served
    ids = prompt_ids()
    free = post(client, prompt=ids, max_tokens=8, temperature=0, return_token_ids=True)["choices"][0]
    if len(free["token_ids"]) < 3:
        pytest.skip("the tiny model ended its reply too soon")
    stop_at = free["token_ids"][1]
    cut = post(
        client, prompt=ids, max_tokens=8, temperature=0, return_token_ids=True, stop_token_ids=[stop_at]
    )
    choice = cut["choices"][0]
    assert choice["token_ids"] == free["token_ids"][: free["token_ids"].index(stop_at) + 1]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_at


def test_a_string_prompt_is_tokenized_without_special_tokens(served: Any) -> None:
    _, client = served
    out = post(client, prompt="hello world", max_tokens=2, temperature=0, return_token_ids=True)
    tok = chatml_policy().tokenizer
    assert out["choices"][0]["prompt_token_ids"] == tok.encode("hello world", add_special_tokens=False)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": [10**7], "max_tokens": 2}, "vocabulary"),
        ({"prompt": [], "max_tokens": 2}, "empty"),
        ({"prompt": [1, 2], "stream": True}, "stream"),
        ({"prompt": [1, 2], "top_k": 5}, "top_k"),
        ({"prompt": [1, 2], "logprobs": 50}, "logprobs"),
        # review: requests past the model's limits are the caller's mistake too
        ({"prompt": [5] * 5000, "max_tokens": 2}, "context"),  # the tiny model has 4096 positions
        ({"prompt": [5, 6], "max_tokens": 10**12}, "context"),  # (allocated a 10^12-position KV cache: 500)
        ({"prompt": [5, 6], "max_tokens": 2, "seed": 2**80}, "seed"),  # (torch's seed overflowed: 500)
        ({"prompt": [[5, 6]] * 300, "n": 64, "max_tokens": 1}, "choices"),  # 19,200 sequences in one request
    ],
)
def test_bad_requests_are_400(served: Any, body: dict[str, Any], needle: str) -> None:
    _, client = served
    resp = client.post("/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


def test_cpu_threads_default() -> None:
    import torch

    assert cpu_threads(3) == 3
    assert 1 <= cpu_threads() <= 4
    before = torch.get_num_threads()
    server = PolicyServer(chatml_policy(), port=0, threads=2)
    try:
        assert server.use_cpu_threads() == 2 and torch.get_num_threads() == 2  # (what serve_forever sets)
    finally:
        torch.set_num_threads(before)
        server.close()


# ----- review: requests past the model's limits are the caller's mistake (400), and never fail a neighbour ----
def test_a_request_over_the_context_does_not_fail_the_batch_it_joins() -> None:
    import threading

    server = PolicyServer(chatml_policy(), port=0, batch_window_s=0.5).start()  # the two share one batch
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        long_chat = [{"role": "user", "content": "7 " * 5000}]  # rendered in the batcher: > 4096 tokens
        got: dict[str, Any] = {}

        def good() -> None:
            got["good"] = client.post(
                "/completions", json={"prompt": prompt_ids(), "max_tokens": 2, "seed": 1}
            )

        def bad() -> None:
            body = {"messages": long_chat, "max_tokens": 2, "seed": 1}
            got["bad"] = client.post("/chat/completions", json=body)

        threads = [threading.Thread(target=good), threading.Thread(target=bad)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert got["good"].status_code == 200, got["good"].text
        assert got["bad"].status_code == 400 and "context" in got["bad"].json()["error"]["message"]
        assert client.get("/health").status_code == 200
    finally:
        server.close()


def test_a_cancelled_request_neither_kills_the_batcher_nor_is_generated() -> None:
    """A request whose caller went away (its future cancelled before the batcher took it) is dropped; the
    requests batched with it are answered (was: set_result on the cancelled future raised InvalidStateError in
    the batcher thread, which died, and every later request hung)."""
    server = PolicyServer(chatml_policy(), port=0, batch_window_s=0.2)
    sampling = SamplingParams(temperature=0, max_new_tokens=2)
    gone = server.submit([], None, sampling, prompt=[5, 6])
    gone.cancel()
    kept = server.submit([], None, sampling, prompt=[5, 6, 7])
    server._worker.start()
    try:
        assert kept.result(timeout=60).turn.token_ids
        later = server.submit([], None, sampling, prompt=[5])
        assert later.result(timeout=60).turn.token_ids and server._worker.is_alive()
    finally:
        server.close()
