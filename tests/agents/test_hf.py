"""The hf backend on a tiny random Llama: exact ids, logprobs equal to a teacher-forced pass, batching."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolgym.agents import HFPolicy, SamplingParams, make_policy, run_episodes
from toolgym.errors import ConfigError


def _teacher_forced(
    policy: HFPolicy, prompt: list[int], gen: list[int], temperature: float = 1.0
) -> list[float]:
    ids = torch.tensor([prompt + gen])
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(ids).logits.float() / temperature, -1)[0]  # [T, V]
    return [logp[len(prompt) + k - 1, t].item() for k, t in enumerate(gen)]


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]


def test_logprobs_match_a_teacher_forced_pass(tiny_policy: HFPolicy) -> None:
    # top_p = 1: the full distribution (under top_p < 1 the logprob is the nucleus's, tested in tests/trainers)
    sp = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=12, seed=3, return_entropies=True)
    for prompt, gen in zip(PROMPTS, tiny_policy.generate(PROMPTS, sp), strict=True):
        n = len(gen.token_ids)
        assert n == len(gen.logprobs) == len(gen.entropies or []) and 0 < n <= 12
        assert gen.finish_reason == ("length" if n == 12 else "stop")  # a random model may say <|im_end|>
        ref = _teacher_forced(tiny_policy, prompt, gen.token_ids, 0.8)
        assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) < 1e-4


def test_batched_greedy_equals_one_at_a_time(tiny_policy: HFPolicy) -> None:
    # a stop string makes rows finish at different steps, so rows leave the batch and the cache mid-way
    sp = SamplingParams(temperature=0, max_new_tokens=10, stop=("e",))
    batched = tiny_policy.generate(PROMPTS, sp)
    for prompt, gen in zip(PROMPTS, batched, strict=True):
        (alone,) = tiny_policy.generate([prompt], sp)
        assert alone.token_ids == gen.token_ids
        assert alone.finish_reason == gen.finish_reason
        assert max(abs(a - b) for a, b in zip(alone.logprobs, gen.logprobs, strict=True)) < 1e-4
        assert gen.logprobs == pytest.approx(_teacher_forced(tiny_policy, prompt, gen.token_ids), abs=1e-4)


def test_seeded_sampling_is_reproducible(tiny_policy: HFPolicy) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    a = tiny_policy.generate(PROMPTS, sp)
    b = tiny_policy.generate(PROMPTS, sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_stops_at_end_of_turn_token(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    model = make_tiny_model(len(chatml_tokenizer))
    stop = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
    head = torch.nn.Linear(32, len(chatml_tokenizer), bias=True)  # always says <|im_end|> after 2 tokens
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[stop] = 5.0
    model.lm_head = head
    policy = HFPolicy(model, chatml_tokenizer)
    (gen,) = policy.generate([[5, 6]], SamplingParams(temperature=0, max_new_tokens=5))
    assert gen.token_ids == [stop] and gen.finish_reason == "stop"
    assert policy.to_turn(gen, None).text == ""


def test_act_parses_tool_calls_and_reports_usage(tiny_policy: HFPolicy) -> None:
    conv = [{"role": "user", "content": "What is 2*3?"}]
    (turn,) = tiny_policy.act([conv], None, sampling=SamplingParams(temperature=0, max_new_tokens=4))
    assert turn.usage["completion_tokens"] == len(turn.token_ids) == 4
    assert turn.message.role == "assistant" and turn.text == turn.message.content


@pytest.mark.parametrize("which", ["tiny_policy", "qwen_policy"])
def test_runner_episode_logprobs_match_the_whole_sequence(which: str, request: Any) -> None:
    tiny_policy = request.getfixturevalue(which)
    fmt = "tools" if tiny_policy.renderer.renders_tools else "text"
    trajs = run_episodes(
        tiny_policy,
        "toolgym/Calculator-v0",
        2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=6, seed=0),
        env_kwargs={"prompt_format": fmt, "max_turns": 5},
    )
    for t in trajs:
        assert t.turns == 5 and t.truncation == "turn_limit"
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_policy.model(ids).logits.float(), -1)[0]  # [T, V]
        for i, m in enumerate(t.loss_mask):
            if m:
                assert abs(logp[i - 1, t.token_ids[i]].item() - t.logprobs[i]) < 1e-4
            else:
                assert t.logprobs[i] == 0.0


def test_load_from_a_local_folder(tmp_path: Any, tiny_policy: HFPolicy) -> None:
    tiny_policy.model.save_pretrained(tmp_path)
    tiny_policy.tokenizer.save_pretrained(tmp_path)
    policy = make_policy(f"hf:{tmp_path}")
    assert isinstance(policy, HFPolicy) and policy.name == f"hf:{tmp_path}"
    sp = SamplingParams(temperature=0, max_new_tokens=5)
    assert policy.generate([[5, 6]], sp)[0].token_ids == tiny_policy.generate([[5, 6]], sp)[0].token_ids


def test_engine_agent_runs_the_same_model_on_our_engine(tmp_path: Any, tiny_policy: HFPolicy) -> None:
    """``engine:PATH`` (the CLI's ``--agent``): our decode engine over the same weights, the same greedy turns."""
    from toolgym.agents.engine import EnginePolicy

    tiny_policy.model.save_pretrained(tmp_path)
    tiny_policy.tokenizer.save_pretrained(tmp_path)
    policy = make_policy(f"engine:{tmp_path}", slots=4, capacity=256)
    assert isinstance(policy, EnginePolicy)
    # what it can hold is its engine's capacity, below the model's positions (the runner and serve's
    # /v1/models read it: an episode past it ends as token_budget, a trainer's servers are checked against it)
    from toolgym.agents.policy import context_of

    assert tiny_policy.model.config.max_position_embeddings > 256 and context_of(policy) == 256
    sp = SamplingParams(temperature=0, max_new_tokens=5)
    assert policy.generate([[5, 6]], sp)[0].token_ids == tiny_policy.generate([[5, 6]], sp)[0].token_ids


def test_bad_model_name_says_what_to_do(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="cannot load model"):
        make_policy(f"hf:{tmp_path / 'nothing-here'}")


def test_generate_in_train_mode_with_checkpointing(tiny_policy: HFPolicy) -> None:
    sp = SamplingParams(temperature=0, max_new_tokens=5)
    ref = tiny_policy.generate(PROMPTS, sp)
    tiny_policy.model.gradient_checkpointing_enable()
    tiny_policy.model.train()
    try:
        got = tiny_policy.generate(PROMPTS, sp)
        assert tiny_policy.model.training
    finally:
        tiny_policy.model.gradient_checkpointing_disable()
        tiny_policy.model.eval()
    assert [g.token_ids for g in got] == [g.token_ids for g in ref]


def _generate_counting(
    policy: HFPolicy, prompts: list[list[int]], sp: SamplingParams, dim: int
) -> tuple[list[Any], list[int]]:
    """The generations, and the size along ``dim`` (0: rows, 1: tokens) of each forward pass's input ids."""
    sizes: list[int] = []
    hook = policy.model.register_forward_pre_hook(
        lambda m, a, kw: sizes.append(kw["input_ids"].shape[dim]), with_kwargs=True
    )
    try:
        return policy.generate(prompts, sp), sizes
    finally:
        hook.remove()


def test_shared_prefix_is_computed_once_with_the_same_result(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    shared = list(range(20, 60))
    prompts = [[*shared, 5, 6, 7], [*shared, 8], [*shared, 9, 10, 11, 12, 13]]
    sp = SamplingParams(temperature=0, max_new_tokens=8, stop=("e",))
    once = HFPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer)
    got, calls = _generate_counting(once, prompts, sp, dim=1)
    assert calls[0] == 40 and calls[1] == 5  # the prefix alone, then the rows' own tokens
    plain = HFPolicy(once.model, chatml_tokenizer, min_shared_prefix=10_000)
    ref = plain.generate(prompts, sp)
    for g, r, p in zip(got, ref, prompts, strict=True):
        assert g.token_ids == r.token_ids and g.finish_reason == r.finish_reason
        assert g.logprobs == pytest.approx(r.logprobs, abs=1e-4)
        assert g.logprobs == pytest.approx(_teacher_forced(plain, p, g.token_ids), abs=1e-4)


def test_cpu_sampler_draws_the_distribution() -> None:
    # the CPU path samples by inverse CDF (one uniform a row), not torch.multinomial: same distribution
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 2
    logits[:, 5] = -float("inf")  # probability 0: never drawn
    logp = torch.log_softmax(logits, -1)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(3, 40)
    for _ in range(8000):
        counts[torch.arange(3), HFPolicy._sample(logp, SamplingParams(), gen)] += 1
    assert counts[:, 5].sum() == 0
    assert (counts / 8000 - logp.exp()).abs().max() < 0.02


def test_equal_prompts_are_prefilled_once_with_the_same_result(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    # two GRPO groups of 3 samples: the prefill runs on 2 rows, then 6 rows sample (seeded, so comparable)
    prompts = [[5, 6, 7, 8]] * 3 + [[5, 6, 9]] * 3
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    policy = HFPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer)
    got, rows = _generate_counting(policy, prompts, sp, dim=0)
    assert rows[0] == 2 and rows[1] == 6
    for g, p in zip(got, prompts, strict=True):
        assert len(g.token_ids) == 8
        assert g.logprobs == pytest.approx(_teacher_forced(policy, p, g.token_ids), abs=1e-4)
    assert len({tuple(g.token_ids) for g in got}) > 2  # the copies sample on their own


def test_reuse_kv_across_turns_gives_the_same_episodes(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    model = make_tiny_model(len(chatml_tokenizer))
    sp = SamplingParams(temperature=0, max_new_tokens=6, stop=("e",))
    kw = {"prompt_format": "text", "max_turns": 4}
    plain = run_episodes(
        HFPolicy(model, chatml_tokenizer), "toolgym/Calculator-v0", 3, sampling=sp, env_kwargs=kw
    )
    reuse = HFPolicy(model, chatml_tokenizer, reuse_kv=True)
    again = run_episodes(reuse, "toolgym/Calculator-v0", 3, sampling=sp, env_kwargs=kw)
    assert reuse._store.hits == 9  # turns 2-4 of 3 episodes started from a kept cache
    for a, b in zip(plain, again, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    with torch.no_grad():
        reuse.model.model.norm.weight.add_(0.0)  # an in-place change of the weights drops the kept caches
    reuse.generate([[5, 6]], sp)
    assert len(reuse._store.entries) == 1
    # so does a fused optimizer step (CUDA training's AdamW), whose kernel bumps no version counter
    opt = torch.optim.AdamW(reuse.model.parameters(), lr=0.1, fused=True)
    for p in reuse.model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    reuse.generate([[7, 8]], sp)
    assert len(reuse._store.entries) == 1


def test_roomy_cache_layer_reads_like_a_dynamic_one() -> None:
    from transformers.cache_utils import DynamicCache

    from toolgym.agents.hf_cache import RoomyLayer, with_room

    g = torch.Generator().manual_seed(0)
    k0, v0 = torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g)
    plain, roomy = DynamicCache(), DynamicCache()
    plain.update(k0, v0, 0)
    roomy.update(k0, v0, 0)
    roomy = with_room(roomy, room=2)
    assert isinstance(roomy.layers[0], RoomyLayer)
    for _ in range(4):  # past its room of 2: the buffer grows
        k, v = torch.randn(3, 2, 1, 4, generator=g), torch.randn(3, 2, 1, 4, generator=g)
        a, b = plain.update(k, v, 0), roomy.update(k, v, 0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for cache in (plain, roomy):
        cache.batch_select_indices(torch.tensor([2, 0]))
        cache.batch_repeat_interleave(2)
    assert roomy.get_seq_length() == plain.get_seq_length() == 9
    assert torch.equal(roomy.layers[0].keys, plain.layers[0].keys)
    assert torch.equal(roomy.layers[0].values, plain.layers[0].values)
