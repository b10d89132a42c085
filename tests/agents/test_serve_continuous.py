"""``toolgym serve`` over our engine batches continuously (agents/openai_continuous.py): the same replies as the
rounds path, a short request that arrives behind a long one is answered first, a pause holds the turns in
flight and a reload restarts them under the new weights; a request the engine refuses fails alone."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agents.test_serve_weight_updates import PROMPT, completion, push, root, rounded
from toolgym.agents.policy import SamplingParams

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")


def _engine(model: Any, tokenizer: Any) -> Any:
    from toolgym.agents.engine import EnginePolicy

    return EnginePolicy(model, tokenizer, slots=8, capacity=512)


def _complete(server: Any, prompt: list[int], max_tokens: int, out: dict[str, Any], key: str) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True}
    resp = httpx.post(f"{server.url}/completions", json=body, timeout=120)
    out[key] = (resp.status_code, resp.json(), time.monotonic())


def test_engine_servers_batch_continuously_with_the_rounds_replies(
    serve: Any, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=3)
    cont = serve(_engine(model, chatml_tokenizer))
    rounds = serve(_engine(copy.deepcopy(model), chatml_tokenizer), continuous=False)
    assert cont.continuous and not rounds.continuous
    prompts = [[1, 40 + i, 41, 42, 2, 44 + i] for i in range(6)]
    for server in (cont, rounds):
        got: dict[str, Any] = {}
        threads = [
            threading.Thread(target=_complete, args=(server, p, 12, got, str(i)))
            for i, p in enumerate(prompts)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        server.replies = [got[str(i)][1]["choices"][0]["token_ids"] for i in range(len(prompts))]
        assert all(got[str(i)][0] == 200 for i in range(len(prompts)))
    assert cont.replies == rounds.replies  # (greedy: the same turns whichever way they were batched)


def test_a_short_request_behind_a_long_one_is_answered_first(
    serve: Any, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    """The defining property: in rounds the short request would wait for the long one's whole reply."""
    model = make_tiny_model(len(chatml_tokenizer), seed=3)
    server = serve(_engine(model, chatml_tokenizer))
    got: dict[str, Any] = {}
    long = threading.Thread(target=_complete, args=(server, PROMPT, 480, got, "long"))
    long.start()
    assert _wait_for_tokens(server, 3, got, "long")
    _complete(server, [1, 50, 51, 2, 52], 2, got, "short")  # (2 tokens: a few steps, beside the long one)
    long.join(120)
    assert got["short"][0] == 200 and got["long"][0] == 200
    n_long = len(got["long"][1]["choices"][0]["token_ids"])
    if n_long > 20:  # (the tiny random model may sample a stop id early: then there is nothing to compare)
        assert got["short"][2] < got["long"][2]


def _sampled(server: Any) -> int:
    """Tokens the one turn in the server's engine has sampled (0: none in flight)."""
    live = list(server.batcher.live.values()) if server.batcher is not None else []
    return len(live[0].seq.out) if live else 0


def _wait_for_tokens(server: Any, n: int, got: dict[str, Any], key: str) -> bool:
    """Waits until the one turn in the engine has sampled `n` tokens (False: it ended first)."""
    deadline = time.monotonic() + 60
    while key not in got and time.monotonic() < deadline:
        if _sampled(server) >= n:
            return True
        time.sleep(0.001)
    return False


def test_a_request_the_engine_refuses_fails_alone(
    serve: Any, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=3)
    server = serve(_engine(model, chatml_tokenizer))
    got: dict[str, Any] = {}
    ok = threading.Thread(target=_complete, args=(server, PROMPT, 20, got, "ok"))
    ok.start()
    _complete(server, [1, 10**6, 2], 4, got, "bad")  # an id outside the vocabulary
    ok.join(60)
    assert got["bad"][0] == 400 and "vocabulary" in got["bad"][1]["error"]["message"]
    assert got["ok"][0] == 200
    assert completion(server)  # the server goes on


def test_pause_holds_turns_in_flight_and_a_reload_restarts_them_under_the_new_weights(
    serve: Any, chatml_tokenizer: Any, make_tiny_model: Any, tmp_path: Path
) -> None:
    """A turn in flight during /pause stays in the engine and ends after /resume; after a reload it goes on from
    a fresh prefill under the new weights: its reply is the k tokens it had (the old weights' greedy
    continuation) followed by the new weights' greedy continuation of the prompt and those k tokens."""
    from toolgym.agents.engine import EnginePolicy

    served = make_tiny_model(len(chatml_tokenizer), seed=3)
    learner = make_tiny_model(len(chatml_tokenizer), seed=9)
    server = serve(_engine(copy.deepcopy(served), chatml_tokenizer), weight_updates=True)
    base = root(server)
    got: dict[str, Any] = {}
    flight = threading.Thread(target=_complete, args=(server, PROMPT, 480, got, "long"))
    flight.start()

    _wait_for_tokens(server, 3, got, "long")
    assert httpx.post(f"{base}/pause?mode=keep", timeout=30).status_code == 200
    assert "long" not in got, "the turn ended before the pause (too fast to test)"
    k = _sampled(server)  # (paused between steps: nothing more is sampled until /resume)
    flight.join(0.3)
    assert flight.is_alive() and _sampled(server) == k  # held in the engine, not answered, not failed
    push(server, learner, tmp_path / "sync")  # (its own pause and resume: the reload lands between steps)
    assert httpx.post(f"{base}/resume").status_code == 200
    flight.join(120)
    status, body, _ = got["long"]
    assert status == 200
    reply = body["choices"][0]["token_ids"]
    old = EnginePolicy(copy.deepcopy(served), chatml_tokenizer, slots=2, capacity=512)
    new = EnginePolicy(rounded(learner), chatml_tokenizer, slots=2, capacity=512)
    assert reply[:k] == old.generate([PROMPT], SamplingParams(temperature=0.0, max_new_tokens=k))[0].token_ids
    rest = SamplingParams(temperature=0.0, max_new_tokens=len(reply) - k)
    assert reply[k:] == new.generate([PROMPT + reply[:k]], rest)[0].token_ids
