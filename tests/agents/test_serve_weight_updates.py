"""``toolgym serve --weight-updates`` (agents/openai_weights.py): the trainer's ``weight_sync: disk`` push
(``DiskSync``) into a live server on the CPU, over ``HFPolicy`` and over our engine; pauses that keep requests;
files that do not fit refused with the model unchanged; the routes absent without the flag."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from toolgym.agents import HFPolicy
from toolgym.agents.openai_weights import PauseGate
from toolgym.agents.policy import SamplingParams
from toolgym.agents.vllm_policy import DiskSync, ServerBackend

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

PROMPT = [1, 40, 41, 42, 43, 2, 44]  # token ids (the tiny tokenizer has 600)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def root(server: Any) -> str:
    return str(server.url).removesuffix("/v1")


def completion(server: Any, prompt: list[int] = PROMPT) -> list[int]:
    body = {
        "prompt": prompt,
        "max_tokens": GREEDY.max_new_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    resp = httpx.post(f"{server.url}/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["choices"][0]["token_ids"])


def rounded(model: Any) -> Any:
    """``model`` with its weights as DiskSync ships them (bf16) and back in their dtype."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return out


@pytest.fixture
def models(chatml_tokenizer: Any, make_tiny_model: Any) -> tuple[Any, Any]:
    """The served model and a learner with other weights."""
    served = make_tiny_model(len(chatml_tokenizer), seed=3)
    learner = make_tiny_model(len(chatml_tokenizer), seed=9)
    return served, learner


def push(server: Any, learner: Any, folder: Path) -> None:
    backend = ServerBackend([server.url])
    try:
        DiskSync(backend, folder).push(learner)
    finally:
        backend.close()


def assert_weights(model: Any, learner: Any) -> None:
    theirs = dict(learner.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, theirs[name].to(torch.bfloat16).to(p.dtype)), name


# ----- DiskSync round trips ---------------------------------------------------------------------------------
def test_disk_sync_reaches_an_hf_server(
    serve: Any, models: Any, chatml_tokenizer: Any, tmp_path: Path
) -> None:
    served, learner = models
    policy = HFPolicy(copy.deepcopy(served), chatml_tokenizer, reuse_kv=True)
    server = serve(policy, weight_updates=True)
    before = completion(server)  # (fills the reused KV cache: it must not outlive the new weights)
    assert before == HFPolicy(served, chatml_tokenizer).generate([PROMPT], GREEDY)[0].token_ids
    push(server, learner, tmp_path / "sync")
    assert_weights(policy.model, learner)
    expected = HFPolicy(rounded(learner), chatml_tokenizer).generate([PROMPT], GREEDY)[0].token_ids
    assert expected and completion(server) == expected
    assert not server.gate.paused


def test_disk_sync_reaches_an_engine_server(
    serve: Any, models: Any, chatml_tokenizer: Any, tmp_path: Path
) -> None:
    """Our engine serves from its own packed copy of the weights: the reload re-packs it at once."""
    from toolgym.agents.engine import EnginePolicy

    served, learner = models
    policy = EnginePolicy(copy.deepcopy(served), chatml_tokenizer, slots=4, capacity=256)
    server = serve(policy, weight_updates=True)
    completion(server)  # (a held cache of the old weights)
    push(server, learner, tmp_path / "sync")
    assert_weights(policy.model, learner)
    embed = rounded(learner).model.embed_tokens.weight
    assert torch.equal(
        policy.engine.weights.embed, embed.to(policy.engine.weights.dtype)
    )  # re-packed already
    fresh = EnginePolicy(rounded(learner), chatml_tokenizer, slots=4, capacity=256)
    expected = fresh.generate([PROMPT], GREEDY)[0].token_ids
    assert expected and completion(server) == expected


# ----- pause --------------------------------------------------------------------------------------------------
def test_a_failed_push_leaves_no_server_paused(
    serve: Any, chatml_tokenizer: Any, make_tiny_model: Any, tmp_path: Path
) -> None:
    """A push the server refuses (here: another model's shapes) raises, and the server is resumed all the
    same: paused, it would hold every later request of any client forever."""
    from toolgym.errors import InfrastructureError

    served = make_tiny_model(len(chatml_tokenizer), seed=3)
    server = serve(HFPolicy(served, chatml_tokenizer), weight_updates=True)
    other = make_tiny_model(len(chatml_tokenizer) + 8, seed=4)  # (another vocabulary: other shapes)
    with pytest.raises(InfrastructureError, match="does not fit the served model"):
        push(server, other, tmp_path / "sync")
    assert not server.gate.paused
    assert completion(server)  # (answered: the server goes on with its own weights)


def test_pause_keeps_requests_until_resume(serve: Any, tiny_policy: Any) -> None:
    server = serve(tiny_policy, weight_updates=True)
    base = root(server)
    expected = completion(server)
    for _ in range(2):  # twice: harmless
        resp = httpx.post(f"{base}/pause?mode=keep", timeout=10)
        assert resp.status_code == 200, resp.text
    assert httpx.get(f"{base}/is_paused").json() == {"is_paused": True}
    got: list[list[int]] = []
    waiting = threading.Thread(target=lambda: got.append(completion(server)))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not got  # queued, not answered, not failed
    assert httpx.post(f"{base}/resume").status_code == 200
    waiting.join(30)
    assert got == [expected]
    for _ in range(2):  # resume when not paused: harmless
        assert httpx.post(f"{base}/resume").status_code == 200
    assert completion(server) == expected


def test_pause_modes_other_than_keep_are_refused(serve: Any, tiny_policy: Any) -> None:
    server = serve(tiny_policy, weight_updates=True)
    resp = httpx.post(f"{root(server)}/pause?mode=abort")
    assert resp.status_code == 400 and "keep" in resp.json()["error"]["message"]
    assert not server.gate.paused


def test_gate_holds_loads_off_a_running_batch_and_lets_a_paused_batcher_go_on_close() -> None:
    gate = PauseGate()
    assert gate.enter()  # a batch runs
    held = threading.Event()

    def load() -> None:
        with gate.exclusive():
            held.set()

    loader = threading.Thread(target=load)
    loader.start()
    assert not held.wait(0.2)  # the load waits for the batch
    gate.leave()
    assert held.wait(5)
    loader.join(5)
    gate.pause()
    answered: list[bool] = []
    batcher = threading.Thread(target=lambda: answered.append(gate.enter()))
    batcher.start()
    batcher.join(0.2)
    assert batcher.is_alive()  # paused: no batch starts
    gate.close()
    batcher.join(5)
    assert answered == [False]  # closing while paused: the batch does not run


def test_close_while_paused_answers_the_queued_requests(serve: Any, tiny_policy: Any) -> None:
    server = serve(tiny_policy, weight_updates=True)
    httpx.post(f"{root(server)}/pause")
    fut = server.submit([{"role": "user", "content": "hi"}], None, GREEDY)
    time.sleep(0.1)
    server.close()
    with pytest.raises(Exception, match="shut down"):
        fut.result(timeout=10)


# ----- files that do not fit ------------------------------------------------------------------------------------
def write(folder: Path, tensors: dict[str, torch.Tensor]) -> str:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
    return str(folder)


def reload(server: Any, path: str, method: str = "reload_weights") -> Any:
    body = {"method": method, "kwargs": {"weights_path": path}}
    return httpx.post(f"{root(server)}/collective_rpc", json=body, timeout=60)


def test_reload_refuses_what_does_not_fit(
    serve: Any, models: Any, chatml_tokenizer: Any, tmp_path: Path
) -> None:
    served, learner = models
    policy = HFPolicy(copy.deepcopy(served), chatml_tokenizer)
    server = serve(policy, weight_updates=True)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    good = {n: p.detach().to(torch.bfloat16) for n, p in learner.named_parameters()}
    missing = dict(good)
    del missing["model.norm.weight"]
    wrong = dict(good, **{"model.norm.weight": torch.ones(7)})
    cases = {
        "missing parameter 'model.norm.weight'": missing,
        "unexpected tensor 'extra.weight'": dict(good, **{"extra.weight": torch.ones(2)}),
        "shape of 'model.norm.weight': [7] in the file, [32] in the model": wrong,
    }
    for i, (message, tensors) in enumerate(cases.items()):
        resp = reload(server, write(tmp_path / str(i), tensors))
        assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text
    resp = reload(server, str(tmp_path / "nowhere"))
    assert resp.status_code == 400 and "model.safetensors" in resp.json()["error"]["message"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not safetensors")
    resp = reload(server, str(tmp_path / "broken"))
    assert resp.status_code == 400 and "safetensors" in resp.json()["error"]["message"]
    resp = reload(server, write(tmp_path / "ok", good), method="update_weights")
    assert resp.status_code == 400 and "unsupported collective_rpc method" in resp.json()["error"]["message"]
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "ok"), "layerwise": True}}
    resp = httpx.post(f"{root(server)}/collective_rpc", json=body)  # an argument it does not take
    assert resp.status_code == 400 and "layerwise" in resp.json()["error"]["message"]
    resp = httpx.post(f"{root(server)}/collective_rpc", json={"kwargs": {}})  # no method: a 400, not a 422
    assert resp.status_code == 400
    for name, p in policy.model.named_parameters():
        assert torch.equal(p, before[name]), name
    resp = reload(server, str(tmp_path / "ok"))  # the right file still loads afterwards
    assert resp.status_code == 200 and resp.json() == {"results": [None]}
    assert_weights(policy.model, learner)


def test_reset_prefix_cache_drops_the_kept_caches(serve: Any, chatml_tokenizer: Any, models: Any) -> None:
    policy = HFPolicy(models[0], chatml_tokenizer, reuse_kv=True)
    cleared: list[int] = []
    policy.clear_kv = lambda: cleared.append(1)  # type: ignore[method-assign]
    server = serve(policy, weight_updates=True)
    for query in ("", "?reset_running_requests=true"):
        resp = httpx.post(f"{root(server)}/reset_prefix_cache{query}")
        assert resp.status_code == 200 and resp.json() == {"success": True}
    assert cleared == [1, 1]


def test_without_the_flag_the_routes_are_404(serve: Any, tiny_policy: Any, tmp_path: Path) -> None:
    server = serve(tiny_policy)
    base = root(server)
    for path in ("/pause?mode=keep", "/resume", "/reset_prefix_cache", "/collective_rpc"):
        resp = httpx.post(f"{base}{path}", json={"method": "reload_weights", "kwargs": {"weights_path": "x"}})
        assert resp.status_code == 404, path
    assert httpx.get(f"{base}/is_paused").status_code == 404
    assert server.weights is None


# ----- the CLI ------------------------------------------------------------------------------------------------
def test_the_cli_flag_reaches_the_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import toolgym.agents
    import toolgym.agents.openai_server as openai_server
    from toolgym.cli import main

    seen: list[dict[str, Any]] = []

    class PolicyServer:
        url = "http://stub/v1"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(kwargs)

        def serve_forever(self) -> None:
            return None

    class Local:
        name, model = "hf", object()

    class Remote:
        name = "openai"

    monkeypatch.setattr(openai_server, "PolicyServer", PolicyServer)
    monkeypatch.setattr(toolgym.agents, "make_policy", lambda spec, **kw: Local())
    assert main(["serve", "--agent", "hf:x", "--weight-updates"]) == 0
    assert main(["serve", "--agent", "hf:x"]) == 0
    assert [kw["weight_updates"] for kw in seen] == [True, False]
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(toolgym.agents, "make_policy", lambda spec, **kw: made.append(kw) or Local())
    assert main(["serve", "--agent", "engine:x", "--max-model-len", "4096", "--max-batch", "128"]) == 0
    assert made == [{"slots": 128, "capacity": 4096}]  # (the engine's slots and each sequence's room)
    monkeypatch.setattr(toolgym.agents, "make_policy", lambda spec, **kw: Remote())
    assert main(["serve", "--agent", "openai:http://x/v1", "--weight-updates"]) != 0  # nothing to load into
    assert "needs a local model" in capsys.readouterr().err and len(seen) == 3
