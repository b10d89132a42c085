"""The fast engine on CPU with tiny random Llama/Qwen2 models: same greedy ids as HF, logprobs as a
teacher-forced pass, forks and resumed turns equal to recomputing, sampling options, live weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolgym.agents import HFPolicy, SamplingParams
from toolgym.agents.engine import EnginePolicy, unsupported
from toolgym.agents.engine.sampling import SampleMode, sample
from toolgym.errors import ConfigError

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [5, 6, 7, 8, 9, 10, 11]]


def tiny_qwen2(vocab_size: int, seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # the q/k/v biases start at zero: make them count
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def teacher_forced(model: Any, prompt: list[int], gen: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + gen])).logits[0].float()  # [T, V]
    return torch.log_softmax(logits / temperature, -1)[len(prompt) - 1 : len(prompt) - 1 + len(gen)]


@pytest.fixture(scope="module")
def llama(chatml_tokenizer: Any, make_tiny_model: Any) -> Any:
    return make_tiny_model(len(chatml_tokenizer), seed=4)


@pytest.fixture(params=[1, 8], ids=["step", "block8"])
def engine_policy(llama: Any, chatml_tokenizer: Any, request: Any) -> EnginePolicy:
    policy = EnginePolicy(llama, chatml_tokenizer, slots=8, capacity=256)
    policy.engine.block = request.param  # decode steps between host reads (8 by default on CUDA)
    return policy


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("block", [1, 8])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_ids_equal_hf_generate(
    arch: str, block: int, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = (
        make_tiny_model(len(chatml_tokenizer), seed=4)
        if arch == "llama"
        else tiny_qwen2(len(chatml_tokenizer))
    )
    policy = EnginePolicy(model, chatml_tokenizer, slots=8, capacity=256)
    policy.engine.block = block
    policy.engine.stop_ids = set()  # run the whole allowance, as HF generate does without eos
    sp = SamplingParams(temperature=0, max_new_tokens=12)
    for prompt, gen in zip(PROMPTS, policy.generate(PROMPTS, sp), strict=True):
        assert gen.token_ids == hf_greedy(model, prompt, 12)
        ref = teacher_forced(model, prompt, gen.token_ids)
        got = torch.tensor(gen.logprobs)
        want = ref.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(got, want, atol=1e-4)


def test_sampled_logprobs_and_entropies_match_a_teacher_forced_pass(
    engine_policy: EnginePolicy, llama: Any
) -> None:
    sp = SamplingParams(temperature=0.8, max_new_tokens=12, seed=3, return_entropies=True)
    engine_policy.engine.stop_ids = set()
    for prompt, gen in zip(PROMPTS, engine_policy.generate(PROMPTS, sp), strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) == len(gen.entropies or []) == 12
        ref = teacher_forced(llama, prompt, gen.token_ids, 0.8)  # [n, V]
        want = ref.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-4)
        ent = -(ref.exp() * ref).sum(-1)
        assert torch.allclose(torch.tensor(gen.entropies), ent, atol=1e-4)


def test_same_greedy_turns_as_the_hf_policy(
    engine_policy: EnginePolicy, llama: Any, chatml_tokenizer: Any
) -> None:
    hf = HFPolicy(llama, chatml_tokenizer)
    sp = SamplingParams(temperature=0, max_new_tokens=10, stop=("e",))
    ours, theirs = engine_policy.generate(PROMPTS, sp), hf.generate(PROMPTS, sp)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_fork_continues_exactly_as_a_recomputed_prefix(engine_policy: EnginePolicy) -> None:
    eng = engine_policy.engine
    eng.stop_ids = set()
    greedy = SampleMode(temperature=0)
    parent = eng.new(list(range(20, 60)))
    eng.submit(parent, greedy, 8)
    eng.run()
    assert parent.kv == len(parent.ids) - 1 == 47
    before = eng.stats.prefill_tokens
    child = eng.fork(parent, [*parent.ids, 7, 8, 9])
    assert child.kv == 47 and eng.stats.forked_tokens >= 47
    fresh = eng.new([*parent.ids, 7, 8, 9])
    eng.submit(child, greedy, 10)
    eng.run()
    assert eng.stats.prefill_tokens - before == 4  # the parent's last id + the three new ones
    eng.submit(fresh, greedy, 10)
    eng.run()
    assert child.out == fresh.out
    assert child.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)


def test_fork_many_continues_as_single_forks(engine_policy: EnginePolicy) -> None:
    eng = engine_policy.engine
    eng.stop_ids = set()
    greedy = SampleMode(temperature=0)
    parent = eng.new(list(range(20, 60)))
    eng.prefill_only([parent], [39])
    ids = [[*parent.ids, 7], [*parent.ids, 8, 9], parent.ids[:25]]  # 7 of the 8 slots in all
    many = eng.fork_many(parent, ids)
    single = [eng.fork(parent, x) for x in ids]
    assert [c.kv for c in many] == [c.kv for c in single] == [39, 39, 24]
    for c in many + single:
        eng.submit(c, greedy, 6)
    eng.run()
    assert [c.out for c in many] == [c.out for c in single]


def test_a_resumed_turn_prefills_only_the_new_ids(
    engine_policy: EnginePolicy, llama: Any, chatml_tokenizer: Any
) -> None:
    engine_policy.engine.stop_ids = set()
    sp = SamplingParams(temperature=0, max_new_tokens=6)
    prompt = list(range(20, 45))  # cached prefixes are found by blocks of 16 ids
    (first,) = engine_policy.generate([prompt], sp)
    before = engine_policy.engine.stats.prefill_tokens
    second_prompt = prompt + first.token_ids + [30, 31, 32]
    (second,) = engine_policy.generate([second_prompt], sp)
    assert engine_policy.engine.stats.prefill_tokens - before == 4  # last sampled id + 3 env ids
    assert second.token_ids == hf_greedy(llama, second_prompt, 6)


def test_a_group_of_equal_prompts_prefills_once_and_branches_fork(engine_policy: EnginePolicy) -> None:
    eng = engine_policy.engine
    prompt = list(range(30, 100))
    sp = SamplingParams(temperature=1.0, max_new_tokens=5, seed=1)
    before = eng.stats.prefill_tokens
    gens = engine_policy.generate([prompt] * 6, sp)
    assert eng.stats.prefill_tokens - before == 69 + 6  # the prefix once, each row's last id
    assert len({tuple(g.token_ids) for g in gens}) > 1  # independent samples
    # branches from the middle of a sampled turn fork its cache
    forked = eng.stats.forked_tokens
    branch = prompt + gens[0].token_ids[:2]
    engine_policy.generate([branch, branch], sp)
    assert eng.stats.forked_tokens - forked >= len(branch) - 1


def test_more_prompts_than_slots(engine_policy: EnginePolicy, llama: Any) -> None:
    engine_policy.engine.stop_ids = set()
    prompts = [[i, i + 1, i + 2] for i in range(40, 52)]  # 12 prompts, 8 slots
    gens = engine_policy.generate(prompts, SamplingParams(temperature=0, max_new_tokens=4))
    for p, g in zip(prompts, gens, strict=True):
        assert g.token_ids == hf_greedy(llama, p, 4)


def test_top_k_top_p_logprob_is_that_of_the_truncated_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    mode = SampleMode(temperature=0.7, top_p=0.8, top_k=10)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        tok, lp, _ = sample(logits, mode, gen)
        for r in range(4):
            z = logits[r] / 0.7
            keep = z >= z.topk(10).values[-1]
            p = torch.softmax(z.masked_fill(~keep, float("-inf")), -1)
            order = p.argsort(descending=True)
            cum = p[order].cumsum(0) - p[order]
            allowed = torch.zeros(50, dtype=torch.bool)
            allowed[order[cum < 0.8]] = True
            assert allowed[tok[r]]
            q = p.masked_fill(~allowed, 0)
            assert lp[r].item() == pytest.approx((q[tok[r]] / q.sum()).log().item(), abs=1e-5)


def test_stop_token_and_stop_strings(engine_policy: EnginePolicy, chatml_tokenizer: Any) -> None:
    engine_policy.engine.stop_ids = engine_policy.renderer.stop_ids
    gens = engine_policy.generate(
        PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=30, seed=5, stop=("a",))
    )
    for g in gens:
        text = engine_policy.renderer.decode(g.token_ids)
        if g.finish_reason == "stop":
            assert "a" in text or g.token_ids[-1] in engine_policy.renderer.stop_ids
            assert "a" not in engine_policy.renderer.decode(g.token_ids[:-1])
        else:
            assert len(g.token_ids) == 30


def test_live_weights_are_picked_up(llama: Any, chatml_tokenizer: Any) -> None:
    import copy

    model = copy.deepcopy(llama)
    policy = EnginePolicy(model, chatml_tokenizer, slots=4, capacity=128)
    policy.engine.stop_ids = set()
    sp = SamplingParams(temperature=0, max_new_tokens=8)
    policy.generate(PROMPTS[:1], sp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # in place, as an optimizer step
    (gen,) = policy.generate(PROMPTS[:1], sp)
    assert gen.token_ids == hf_greedy(model, PROMPTS[0], 8)
    assert not policy.engine.idle or all(s.kv >= 0 for s in policy.engine.idle.values())


def test_weights_written_by_a_fused_optimizer_or_through_data_are_picked_up(
    llama: Any, chatml_tokenizer: Any
) -> None:
    # CUDA training uses fused AdamW, whose kernel bumps no version counter: the engine once kept serving the
    # initial weights for a whole run (every held-out evaluation equal to the first)
    import copy

    model = copy.deepcopy(llama)
    policy = EnginePolicy(model, chatml_tokenizer, slots=4, capacity=128)
    policy.engine.stop_ids = set()
    sp = SamplingParams(temperature=0, max_new_tokens=8)
    before = policy.generate(PROMPTS[:1], sp)[0].token_ids
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    versions = [p._version for p in model.parameters()]
    opt.step()
    assert [p._version for p in model.parameters()] == versions  # the fused kernel is invisible to them
    (gen,) = policy.generate(PROMPTS[:1], sp)
    assert gen.token_ids == hf_greedy(model, PROMPTS[0], 8) != before
    # a write through .data is invisible to every counter: refresh(force=True) picks it up
    with torch.no_grad():
        for p in model.parameters():
            p.data.copy_(torch.randn_like(p))
    policy.refresh(force=True)
    (gen,) = policy.generate(PROMPTS[:1], sp)
    assert gen.token_ids == hf_greedy(model, PROMPTS[0], 8)


def test_lora_adapters_are_merged(llama: Any, chatml_tokenizer: Any) -> None:
    peft = pytest.importorskip("peft")
    import copy

    model = peft.get_peft_model(
        copy.deepcopy(llama), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    policy = EnginePolicy(model, chatml_tokenizer, slots=4, capacity=128)
    policy.engine.stop_ids = set()
    (gen,) = policy.generate(PROMPTS[:1], SamplingParams(temperature=0, max_new_tokens=8))
    assert gen.token_ids == hf_greedy(model, PROMPTS[0], 8)


def test_unsupported_models_are_named(chatml_tokenizer: Any) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(chatml_tokenizer), n_embd=32, n_layer=1, n_head=2))
    assert "gpt2" in (unsupported(model) or "")
    with pytest.raises(ConfigError, match="hf backend"):
        EnginePolicy(model, chatml_tokenizer)


def test_act_renders_generates_and_parses(engine_policy: EnginePolicy) -> None:
    conv = [{"role": "user", "content": "What is 2*3?"}]
    (turn,) = engine_policy.act([conv], None, sampling=SamplingParams(temperature=0, max_new_tokens=4))
    assert turn.usage["completion_tokens"] == len(turn.token_ids) <= 4
    assert turn.message.role == "assistant" and turn.text == turn.message.content
    assert len(turn.logprobs) == len(turn.token_ids)


def test_a_decode_step_never_takes_more_rows_than_slots(llama: Any, chatml_tokenizer: Any) -> None:
    # long prompts prefilled eagerly join the active rows before the step in which short ones ride inline;
    # together they must fit the largest CUDA graph bucket (the slot count)
    policy = EnginePolicy(llama, chatml_tokenizer, slots=4, capacity=256)
    eng = policy.engine
    eng.stop_ids = set()
    greedy = SampleMode(temperature=0)
    seqs = [
        eng.new(list(range(20, 120))),
        eng.new([5, 6, 7]),
        eng.new([8, 9, 10]),
        eng.new(list(range(30, 110))),
    ]
    for s in seqs:
        eng.submit(s, greedy, 4)
    eng.run()
    for s in seqs:
        assert s.out == hf_greedy(llama, s.ids, 4)


def test_blocks_of_decode_steps_end_rows_where_single_steps_do(llama: Any, chatml_tokenizer: Any) -> None:
    # several decode steps between host reads: every row ends at its first stop string, stop token,
    # allowance or slot end inside a block, with the ids and logprobs of one step at a time
    prompts = [*PROMPTS, list(range(20, 70))]  # the last one reaches the slot's end (capacity 64)
    runs, steps = [], []
    for block in (1, 4):
        policy = EnginePolicy(llama, chatml_tokenizer, slots=8, capacity=64)
        policy.engine.block = block
        policy.engine.stop_ids = {int(hf_greedy(llama, PROMPTS[2], 3)[2])}  # a row stops on a token
        sp = SamplingParams(temperature=0, max_new_tokens=16, stop=("e",))
        runs.append(policy.generate(prompts, sp))
        steps.append(policy.engine.stats.decode_steps)
    one, blocked = runs
    assert [g.finish_reason for g in one] == [g.finish_reason for g in blocked]
    assert {g.finish_reason for g in one} == {"stop", "length"}
    assert len(one[-1].token_ids) == 63 - 50  # cut at the slot's end
    for a, b in zip(one, blocked, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert steps[0] == steps[1]  # the same steps ran, read from the host in blocks


def test_a_block_is_read_with_one_host_sync(llama: Any, chatml_tokenizer: Any) -> None:
    policy = EnginePolicy(llama, chatml_tokenizer, slots=8, capacity=256)
    eng = policy.engine
    eng.stop_ids, eng.block = set(), 8
    calls = []
    inner = eng._run_rows
    eng._run_rows = lambda *a: calls.append(a[4]) or inner(*a)  # type: ignore[method-assign]
    policy.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=20, seed=0))
    # the first step admits the rows (inline prefill), then blocks of 8, 8 and the 3 steps left
    assert calls == [1, 8, 8, 3]
