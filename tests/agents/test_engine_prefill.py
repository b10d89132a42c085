"""The engine's two prefills (model.py: ``varlen``, the default, and the earlier ``padded``) on CPU: the same
logits as each other and as HF's forward for mixed prompt lengths, prefix-cache hits (a continued sequence,
a fork) and GQA, in float32 and bfloat16; the same greedy tokens through the engine; the plan's indices;
the mode's choice. The Triton varlen pass is tested in test_engine_kernels.py (Triton's interpreter)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolgym.agents.engine import Engine
from toolgym.agents.engine.model import PrefillPlan, prefill
from toolgym.agents.engine.sampling import SampleMode
from toolgym.errors import ConfigError

LENGTHS = [5, 40, 70, 1, 17, 64]


def gqa_llama(seed: int = 0) -> Any:
    """SmolLM2's head layout (3 query heads a KV head) in a tiny model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=128, hidden_size=96, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (n,), generator=g).tolist() for n in lengths]


def hf_last_logits(model: Any, ids: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([model(torch.tensor([x])).logits[0, -1].float() for x in ids])


def run_prefill(model: Any, ids: list[list[int]], mode: str, dtype: torch.dtype, split: bool) -> torch.Tensor:
    """Last-token logits of ``ids`` prefilled in one pass, or (``split``) half of each first and the rest as
    a second pass that continues the cached prefix (a prefix-cache hit; a length-1 prompt runs whole)."""
    eng = Engine(model, slots=len(ids), capacity=160, dtype=dtype, cuda_graphs=False, kernels=False)
    w, cache = eng.weights, eng.cache
    cut = [len(x) // 2 if split else 0 for x in ids]
    first = [(i, 0, x[:c]) for i, (x, c) in enumerate(zip(ids, cut, strict=True)) if c > 0]
    if first:
        prefill(w, cache, first, False, mode=mode)
    logits = prefill(
        w, cache, [(i, c, x[c:]) for i, (x, c) in enumerate(zip(ids, cut, strict=True))], mode=mode
    )
    assert logits is not None
    return logits


@pytest.mark.parametrize("split", [False, True], ids=["fresh", "prefix_hit"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_prefill_matches_padded_and_hf(dtype: torch.dtype, split: bool) -> None:
    model = gqa_llama()
    ids = prompts(LENGTHS)
    want = hf_last_logits(model, ids)
    varlen = run_prefill(model, ids, "varlen", dtype, split)
    padded = run_prefill(model, ids, "padded", dtype, split)
    if dtype == torch.float32:
        assert (varlen - want).abs().max().item() < 1e-4
        assert (varlen - padded).abs().max().item() < 1e-5
    else:  # bf16 weights and activations: a few bf16 steps of the logits' scale (~1) apart from fp32
        assert (varlen - want).abs().max().item() < 0.1
        assert (varlen - padded).abs().max().item() < 0.05


def test_a_one_token_pass_and_a_long_prefix() -> None:
    """One new token after a long cached prefix (a resumed turn) beside fresh prompts in the same pass."""
    model = gqa_llama(seed=2)
    ids = prompts([120, 3, 9], seed=5)
    eng = Engine(model, slots=3, capacity=160, cuda_graphs=False, kernels=False)
    prefill(eng.weights, eng.cache, [(0, 0, ids[0][:119])], False, mode="varlen")
    got = prefill(eng.weights, eng.cache, [(0, 119, ids[0][119:]), (1, 0, ids[1]), (2, 0, ids[2])])
    assert got is not None
    assert (got - hf_last_logits(model, ids)).abs().max().item() < 1e-4


@pytest.mark.parametrize("mode", ["varlen", "padded"])
def test_engine_greedy_tokens_equal_hf_with_forks_and_eager_prefix_hits(mode: str) -> None:
    model = gqa_llama(seed=3)
    eng = Engine(model, slots=8, capacity=200, cuda_graphs=False, prefill=mode)
    assert eng.prefill_mode == mode
    eng.inline_prefill = 0  # every newcomer (a fork's tail too) goes through an eager prefill pass
    greedy = SampleMode(temperature=0)
    ids = prompts([7, 33, 50, 2], seed=6)
    seqs = [eng.new(x) for x in ids]
    for s in seqs:
        eng.submit(s, greedy, 6)
    eng.run()
    tail = prompts([11], seed=7)[0]
    child = eng.fork(seqs[2], [*seqs[2].ids, *tail])  # shares the parent's cached 55 positions
    assert child.kv == len(seqs[2].ids) - 1
    eng.submit(child, greedy, 6)
    eng.run()
    with torch.no_grad():
        for s in [*seqs, child]:
            prompt = s.ids[: len(s.ids) - len(s.out)]
            ref = model.generate(
                torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            assert s.out == ref[0, len(prompt) :].tolist()


def test_plan_indices() -> None:
    plan = PrefillPlan.build(
        [(3, 0, [7, 8, 9]), (1, 5, [4, 4]), (0, 2, list(range(9)))], torch.device("cpu"), 4
    )
    assert plan.tokens.tolist() == [7, 8, 9, 4, 4, *range(9)]
    assert plan.pos.tolist() == [0, 1, 2, 5, 6, *range(2, 11)]
    assert plan.slot.tolist() == [3, 3, 3, 1, 1, *[0] * 9]
    assert plan.cu.tolist() == [0, 3, 5, 14]
    assert plan.starts.tolist() == [0, 5, 2] and plan.slots.tolist() == [3, 1, 0]
    # blocks of 4 new tokens, the longest key run first: seq 2's (first keys 10, 6, 2), seq 1's (5), seq 0's
    blocks = list(zip(plan.blk_seq.tolist(), plan.blk_off.tolist(), strict=True))
    assert blocks == [(2, 8), (2, 4), (1, 0), (2, 0), (0, 0)]
    with pytest.raises(ConfigError, match="at least one new token"):
        PrefillPlan.build([(0, 0, [])], torch.device("cpu"))
    eng = Engine(gqa_llama(), slots=1, capacity=32)
    empty = prefill(eng.weights, eng.cache, [], mode="varlen")
    assert empty is not None and empty.shape == (0, 128)


def test_the_mode_comes_from_the_option_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    model = gqa_llama()
    monkeypatch.setenv("TOOLGYM_PREFILL", "padded")
    assert Engine(model, slots=1, capacity=32).prefill_mode == "padded"
    assert Engine(model, slots=1, capacity=32, prefill="varlen").prefill_mode == "varlen"
    monkeypatch.setenv("TOOLGYM_PREFILL", "flash")
    with pytest.raises(ConfigError, match="varlen, padded"):
        Engine(model, slots=1, capacity=32)
    monkeypatch.delenv("TOOLGYM_PREFILL")
    assert Engine(model, slots=1, capacity=32).prefill_mode == "varlen"


def test_chunked_prefill_lets_decode_rows_go_on_and_changes_no_token() -> None:
    model = gqa_llama(seed=4)
    greedy = SampleMode(temperature=0)
    short, long = prompts([6, 150], seed=8)

    def run(chunk: int) -> tuple[list[list[int]], int]:
        """(both rows' tokens, decode steps of the first row while the second one's prompt prefilled)"""
        eng = Engine(model, slots=2, capacity=200, cuda_graphs=False)
        eng.prefill_chunk = chunk
        first = eng.new(short)
        eng.submit(first, greedy, 12)
        eng.step()  # `first` decodes from here on
        late = eng.new(long)
        eng.submit(late, greedy, 4)
        before = len(first.out)
        while late.state == "queued":
            eng.step()
        during = len(first.out) - before
        eng.run()
        return [first.out, late.out], during

    (plain, during_plain), (chunked, during) = run(0), run(32)
    assert during_plain == 1  # the 150-token prompt in one pass, then one decode step
    assert during == 5  # chunks of 32 over 4 steps, the last 22 as rows of the 5th decode step (inline)
    assert chunked == plain
    with torch.no_grad():
        for prompt, out in zip((short, long), chunked, strict=True):
            ref = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=len(out),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            assert out == ref[0, len(prompt) :].tolist()
