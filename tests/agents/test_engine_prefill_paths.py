"""The engine's prefill (``varlen``, the default, and the earlier ``padded``) through what users run, on CPU in
float32: edge shapes (a 1-token prompt, a prompt at the engine's capacity and one over, very different lengths
in one pass), Qwen2's q/k/v biases and tied/untied embeddings, multi-turn episodes continuing a cached prefix
by a tool result, prefix-cache eviction then reuse, chunked prefill with forks and prefix hits, and the tree
rollout's branching (turn and token forks). The bar: every sampled token's logprob equals a teacher-forced HF
pass over the whole row (1e-5), and both modes give the same tokens. Every test runs under both modes
(``TOOLGYM_PREFILL``), and the engine's short continuations are forced through the prefill pass
(``inline_prefill = 0``) where they would otherwise run as decode rows."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from toolgym.agents import HFPolicy
from toolgym.agents.engine import Engine, EnginePolicy
from toolgym.agents.engine.engine import kernels_fit
from toolgym.agents.engine.sampling import SampleMode
from toolgym.agents.engine.scheduler import Scheduler
from toolgym.agents.policy import SamplingParams
from toolgym.errors import ConfigError
from toolgym.trainers.branching import TokenEntropyTopK, TurnBoundaryEntropy
from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
from toolgym.trainers.tree import flatten

if not torch.cuda.is_available():  # the Triton pass, where tested, runs in Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

MODES = ["varlen", "padded"]
TOL = 1e-5
ENV = "toolgym/Calculator-v0"
ENV_KW = {"prompt_format": "text", "max_turns": 3}


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The prefill every engine built in the test uses (engines built inside trainers read the variable)."""
    monkeypatch.setenv("TOOLGYM_PREFILL", request.param)
    return str(request.param)


def set_engine_knobs(monkeypatch: pytest.MonkeyPatch, **knobs: int) -> None:
    """Every engine built from now on starts with these scheduler settings (``inline_prefill``,
    ``prefill_chunk``): the engines that trainers and policies build inside themselves too."""
    init = Scheduler.__init__

    def patched(self: Scheduler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for k, v in knobs.items():
            setattr(self, k, v)

    monkeypatch.setattr(Scheduler, "__init__", patched)


def llama(vocab: int = 128, tied: bool = False, seed: int = 0, positions: int = 1024) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=positions, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def qwen2(vocab: int = 128, tied: bool = True, seed: int = 0) -> Any:
    """Qwen2's shape: q/k/v biases (made non-zero: they start at zero), a KV group of 2."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=tied,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def other_shape(kind: str) -> Any:
    """Llama with a head wider than hidden / heads, Llama 3's rope scaling with one KV head, Mistral."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    base = dict(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    if kind == "head_dim":
        return LlamaForCausalLM(LlamaConfig(**base, head_dim=32)).eval()
    if kind == "llama3_rope":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        rope["original_max_position_embeddings"] = 64
        return LlamaForCausalLM(LlamaConfig(**{**base, "num_key_value_heads": 1}, rope_scaling=rope)).eval()
    return MistralForCausalLM(MistralConfig(**base, sliding_window=None)).eval()


MODELS: dict[str, Callable[[], Any]] = {
    "llama_untied": lambda: llama(tied=False),
    "llama_tied": lambda: llama(tied=True),
    "qwen2_tied": lambda: qwen2(tied=True),
    "qwen2_untied": lambda: qwen2(tied=False),
    "llama_head_dim_32": lambda: other_shape("head_dim"),
    "llama3_rope_mqa": lambda: other_shape("llama3_rope"),
    "mistral": lambda: other_shape("mistral"),
}


def prompt(n: int, seed: int, vocab: int = 128) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n,), generator=g).tolist()


def hf_logprobs(model: Any, ids: list[int], n_out: int) -> list[float]:
    """Teacher-forced logprobs of the last ``n_out`` ids of ``ids`` given everything before them."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).logits[0].float(), -1)
    first = len(ids) - n_out
    return [logp[first - 1 + j, ids[first + j]].item() for j in range(n_out)]


def gap(model: Any, context: list[int], out: list[int], logprobs: list[float]) -> float:
    assert len(out) == len(logprobs)
    if not out:
        return 0.0
    want = hf_logprobs(model, context + out, len(out))
    return max(abs(a - b) for a, b in zip(want, logprobs, strict=True))


def run_engine(
    model: Any, lengths: list[int], *, capacity: int = 160, slots: int = 8, inline: int = 64, chunk: int = 0,
    temperature: float = 0.0, max_new: int = 8,
) -> list[tuple[list[int], list[int], list[float], str]]:  # fmt: skip
    """(prompt, sampled ids, logprobs, finish) of each prompt, all submitted at once (the engine's mode
    comes from ``TOOLGYM_PREFILL``)."""
    eng = Engine(model, slots=slots, capacity=capacity, cuda_graphs=False, kernels=False)
    eng.inline_prefill, eng.prefill_chunk = inline, chunk
    eng.seed(7)
    sm = SampleMode(temperature=temperature)  # 0: greedy; else seeded sampling
    seqs = [eng.new(prompt(n, i)) for i, n in enumerate(lengths)]
    prompts = [list(s.ids) for s in seqs]
    for s in seqs:
        eng.submit(s, sm, max_new)
    eng.run()
    assert not eng.busy()
    return [(p, s.out, s.logprobs, s.finish) for p, s in zip(prompts, seqs, strict=True)]


# ----- the engine alone: shapes of a pass ------------------------------------------------------------------------
WIDE = [1, 2, 15, 63, 64, 65, 150]  # very different lengths in one pass, around the inline limit and blocks


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize(
    "setting",
    [{}, {"inline": 0}, {"inline": 0, "chunk": 17}, {"temperature": 1.0}],
    ids=["default", "eager", "chunked", "sampled"],
)
def test_mixed_lengths_match_hf(mode: str, family: str, setting: dict[str, Any]) -> None:
    model = MODELS[family]()
    for p, out, lps, finish in run_engine(model, WIDE, **setting):
        assert len(out) == 8 and finish == "length"
        assert gap(model, p, out, lps) < TOL


def test_both_modes_give_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded sampling, chunked and eager: the two prefills draw the same tokens with the same logprobs."""
    model = qwen2(tied=False, seed=3)
    got = {}
    for m in MODES:
        monkeypatch.setenv("TOOLGYM_PREFILL", m)
        got[m] = [
            run_engine(model, WIDE, temperature=1.0, **s)
            for s in ({}, {"inline": 0}, {"inline": 0, "chunk": 9})
        ]
    for a, b in zip(got["varlen"], got["padded"], strict=True):
        assert [x[1] for x in a] == [y[1] for y in b]
        assert (
            max(abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x[2], y[2], strict=True)) < TOL
        )


@pytest.mark.parametrize("inline", [64, 0])
def test_a_prompt_at_the_capacity_and_one_over(mode: str, inline: int) -> None:
    """The longest prompt the engine takes (capacity - 2 tokens: one token is sampled, then the slot is full)
    beside short ones; one more token is refused with a ConfigError, not a crash."""
    model = llama(tied=True, seed=1)
    cap = 96
    res = run_engine(model, [cap - 2, 1, 40], capacity=cap, inline=inline)
    (p, out, lps, finish), *rest = res
    assert len(out) == 1 and finish == "length" and gap(model, p, out, lps) < TOL
    for p, out, lps, _ in rest:
        assert gap(model, p, out, lps) < TOL
    eng = Engine(model, slots=2, capacity=cap, cuda_graphs=False, kernels=False)
    with pytest.raises(ConfigError):
        eng.submit(eng.new(prompt(cap - 1, 0)), SampleMode(), 4)
    # a turn that fills the slot to its end, continued by one token (the next turn has no room): refused
    s = eng.new(prompt(cap - 12, 2))
    eng.submit(s, SampleMode(), 100)
    eng.run()
    assert s.finish == "length" and len(s.ids) == cap - 1
    eng.extend(s, [5])
    with pytest.raises(ConfigError):
        eng.submit(s, SampleMode(), 4)


def test_a_one_token_prompt_alone_and_repeated(mode: str) -> None:
    model = llama(seed=4)
    for lengths in ([1], [1, 1, 1], [1, 200]):
        for p, out, lps, _ in run_engine(model, lengths, capacity=256, inline=0):
            assert gap(model, p, out, lps) < TOL


# ----- EnginePolicy: multi-turn, eviction, chunked prefill with forks and prefix hits ---------------------------
def policy_of(model: Any, tokenizer: Any, **kw: Any) -> EnginePolicy:
    return EnginePolicy(model, tokenizer, slots=kw.pop("slots", 6), capacity=kw.pop("capacity", 512), **kw)


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def episodes(policy: EnginePolicy, model: Any, turns: int, starts: list[list[int]], reply: int = 9) -> float:
    """Multi-turn episodes in lockstep: each turn's prompt is the last prompt + the model's answer + a tool
    result (``reply`` ids), so it extends a cached prefix; the worst logprob gap to HF."""
    worst = 0.0
    prompts = [list(s) for s in starts]
    for t in range(turns):
        gens = policy.generate(prompts, GREEDY)
        for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
            worst = max(worst, gap(model, p, g.token_ids, g.logprobs))
            prompts[i] = p + g.token_ids + prompt(reply, 100 * i + t, vocab=len(policy.tokenizer))
    return worst


@pytest.mark.parametrize("inline", [64, 0])
def test_multi_turn_episodes_continue_their_cache(
    mode: str, inline: int, chatml_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_engine_knobs(monkeypatch, inline_prefill=inline)
    model = qwen2(vocab=len(chatml_tokenizer), tied=False, seed=2)
    policy = policy_of(model, chatml_tokenizer)
    starts = [prompt(n, 50 + n, len(chatml_tokenizer)) for n in (40, 70, 33)]
    assert episodes(policy, model, 4, starts) < TOL
    # only the tool results and the last sampled ids are prefilled after the first turn
    assert policy.engine.stats.prefill_tokens < sum(map(len, starts)) + 3 * 3 * (9 + 7) + 1


def test_eviction_under_memory_pressure_then_reuse(
    mode: str, chatml_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More episodes than slots, interleaved: held caches are evicted (least recently used first) and the
    episodes that lost theirs are prefilled again; the ones that kept theirs continue. Same logprobs as HF."""
    set_engine_knobs(monkeypatch, inline_prefill=0)
    model = llama(vocab=len(chatml_tokenizer), tied=True, seed=6)
    policy = policy_of(model, chatml_tokenizer, slots=3)
    vocab = len(chatml_tokenizer)
    a = [prompt(n, n, vocab) for n in (35, 48)]
    b = [prompt(n, n, vocab) for n in (52, 20, 41)]
    evicted: list[int] = []
    drop = policy.engine.on_evict
    assert drop is not None

    def on_evict(seq: Any) -> None:
        evicted.append(seq.id)
        drop(seq)

    policy.engine.on_evict = on_evict
    worst = episodes(policy, model, 2, a)  # a's two episodes hold 2 of 3 slots
    worst = max(worst, episodes(policy, model, 2, b))  # b's three evict them
    assert evicted
    held = len(evicted)
    worst = max(worst, episodes(policy, model, 2, a))  # a again: from scratch, b's caches evicted
    assert worst < TOL and len(evicted) > held


@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_chunked_prefill_with_forks_and_prefix_hits(
    mode: str, chunk: int, chatml_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group of prompts sharing a long prefix (prefilled once, then forked), the same prompt several times
    (forked from one head), then every path continued by a tool result (a prefix hit), with chunked prefill
    and every short continuation through the prefill pass."""
    set_engine_knobs(monkeypatch, inline_prefill=0, prefill_chunk=chunk)
    model = qwen2(vocab=len(chatml_tokenizer), tied=True, seed=8)
    policy = policy_of(model, chatml_tokenizer, slots=10)
    vocab = len(chatml_tokenizer)
    system = prompt(80, 1, vocab)
    starts = [system + prompt(n, 10 + n, vocab) for n in (3, 30, 17)] + [system + prompt(5, 99, vocab)] * 3
    assert episodes(policy, model, 3, starts) < TOL
    assert policy.engine.stats.forked_tokens > 0


# ----- the tree rollout over the engine: turn and token forks, evictions, chunks -------------------------------
def rollout_rows_gap(
    model: Any, policy: Any, branch: Any, cfg: RolloutConfig, seed: int = 1
) -> tuple[Any, float]:
    roller = TreeRollout(policy, branch, cfg, ENV_KW, continuous=True, env_workers=3)
    try:
        forest, stats = roller.run([RolloutTask(ENV, 3), RolloutTask(ENV, 4)], seed=seed)
    finally:
        roller.close()
    worst = 0.0
    for r in flatten(forest):  # every sampled token's logprob is that of a teacher-forced pass over the row
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([r.token_ids])).logits.float(), -1)[0]
        for i, m in enumerate(r.loss_mask):
            if m:
                worst = max(worst, abs(logp[i - 1, r.token_ids[i]].item() - r.logprobs[i]))
    return (forest, stats), worst


def tree_shape(forest: Any) -> list[Any]:
    return [[(n.parent, n.kind, n.token_ids, n.branch_reason) for n in t.nodes] for t in forest]


BRANCHES: dict[str, Callable[[], Any]] = {
    "turn": lambda: TurnBoundaryEntropy(initial=2, beam_size=2, entropy_weight=0.0, tau=0.3),
    "token": lambda: TokenEntropyTopK(initial=2, n_forks=1, n_children=2),
}


@pytest.fixture
def knobs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    set_engine_knobs(monkeypatch, **request.param)
    yield request.param


@pytest.mark.parametrize("branch", list(BRANCHES))
@pytest.mark.parametrize(
    "knobs", [{}, {"inline_prefill": 0}, {"inline_prefill": 0, "prefill_chunk": 13}], indirect=True,
    ids=["default", "eager", "chunked"],
)  # fmt: skip
def test_branching_rollouts_match_teacher_forcing(
    mode: str, branch: str, knobs: dict[str, int], chatml_tokenizer: Any
) -> None:
    """Sampled tree rollouts with forks at turns or inside turns, fewer slots than paths (evictions): every
    row's logprobs are HF's; greedy trees equal HF's round-based ones."""
    model = llama(vocab=len(chatml_tokenizer), seed=3)
    cfg = RolloutConfig(budget=4, max_new_tokens=6, temperature=1.0, max_total_tokens=900, entropies=True)
    policy = EnginePolicy(model, chatml_tokenizer, slots=5, capacity=1024)
    (forest, stats), worst = rollout_rows_gap(model, policy, BRANCHES[branch](), cfg)
    assert stats.forks and all(len(t.leaves()) == 4 for t in forest)
    assert worst < 1e-4 and not policy.engine.busy()  # (1e-4: a row's forward spans up to ~300 positions)
    greedy = RolloutConfig(budget=4, max_new_tokens=6, temperature=0.0, max_total_tokens=900, entropies=True)
    (ours, _), worst = rollout_rows_gap(model, policy, BRANCHES[branch](), greedy)
    hf = TreeRollout(HFPolicy(model, chatml_tokenizer), BRANCHES[branch](), greedy, ENV_KW, continuous=False)
    try:
        theirs, _ = hf.run([RolloutTask(ENV, 3), RolloutTask(ENV, 4)], seed=1)
    finally:
        hf.close()
    assert tree_shape(ours) == tree_shape(theirs) and worst < 1e-4


def test_a_policy_prompt_at_the_capacity_and_one_over(mode: str, chatml_tokenizer: Any) -> None:
    """EnginePolicy.generate: the longest prompt the engine takes samples its one token beside a short prompt;
    one token more is a ConfigError that leaves nothing behind (it used to be raised after the batch's
    other prompts were queued: the engine stayed busy, their slots taken, and the next call ran them)."""
    model = llama(vocab=len(chatml_tokenizer), seed=2)
    policy = policy_of(model, chatml_tokenizer, slots=3, capacity=64)
    short = prompt(10, 1, len(chatml_tokenizer))
    for n in (62, 63, 64):
        long = prompt(n, n, len(chatml_tokenizer))
        if n > 62:
            with pytest.raises(ConfigError):
                policy.generate([short, long], GREEDY)
            assert not policy.engine.busy() and not policy.engine.queue
            continue
        a, b = policy.generate([short, long], GREEDY)
        assert len(b.token_ids) == 1 and b.finish_reason == "length"
        assert (
            gap(model, short, a.token_ids, a.logprobs) < TOL
            and gap(model, long, b.token_ids, b.logprobs) < TOL
        )
    (again,) = policy.generate([short], GREEDY)
    assert again.token_ids == a.token_ids and not policy.engine.busy()


# ----- forks whose ids leave the source's ------------------------------------------------------------------------
def test_a_fork_copies_only_the_prefix_its_ids_share(mode: str) -> None:
    """``fork(src, ids)`` with ids that leave ``src``'s after 40 positions (and a ``shared`` claim longer than
    what they share) copies only the common prefix; the rest is prefilled. It used to copy all that ``src``
    had cached: the child then attended to the other branch's K/V (logprobs off by ~0.05 here)."""
    model = llama(seed=9)
    eng = Engine(model, slots=6, capacity=256, cuda_graphs=False, kernels=False)
    eng.inline_prefill = 0
    src = eng.new(prompt(90, 1))
    eng.submit(src, SampleMode(temperature=0.0), 4)
    eng.run()
    kids = [
        eng.fork(src, src.ids[:40] + prompt(30, 2)),  # default: all it shares
        eng.fork(src, src.ids[:40] + prompt(30, 3), shared=80),  # a claim past the shared part
        eng.fork(src, src.ids + prompt(3, 4)),  # everything src holds (its last sampled id is not cached)
        eng.fork(src, prompt(50, 5)),  # nothing in common
    ]
    assert [k.kv for k in kids] == [40, 40, src.kv, 0]
    base = [list(k.ids) for k in kids]
    for k in kids:
        eng.submit(k, SampleMode(temperature=0.0), 5)
    eng.run()
    for p, k in zip(base, kids, strict=True):
        assert gap(model, p, k.out, k.logprobs) < TOL


def test_kernels_only_for_head_sizes_they_take() -> None:
    """The Triton kernels index a head with ``tl.arange(0, D)``: a power of two. An 80-wide head (divisible by
    16, which was the only check) failed in the kernels; it now runs the torch path."""
    assert [d for d in (16, 32, 48, 64, 80, 96, 128, 256, 512, 8) if kernels_fit(d)] == [16, 32, 64, 128, 256]


# ----- the Triton varlen pass through the engine (Triton's interpreter on CPU) ---------------------------------
@pytest.mark.parametrize("family", ["llama_untied", "qwen2_tied"])
def test_triton_prefill_through_the_engine(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine with ``kernels=True`` (the CUDA default) against ``kernels=False``: mixed lengths with a
    1-token prompt, chunked prefill, the longest prompt the slot takes, then every sequence continued by a
    tool result and forked (prefix hits). The decode step stays plain torch: this tests the prefill."""
    pytest.importorskip("triton")
    import toolgym.agents.engine.engine as engine_module
    from toolgym.agents.engine.model import decode_torch

    def decode(w: Any, cache: Any, t: Any, sl: Any, ps: Any, nsplit: int) -> torch.Tensor:
        return decode_torch(w, cache, t, sl, ps)

    monkeypatch.setattr(engine_module, "decode_triton", decode)
    reference = MODELS[family]()  # (HF's forward on CPU: float32 without TF32)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = copy.deepcopy(reference).to(dev)
    if dev == "cuda":  # tl.dot on float32 in full precision (Triton's default is TF32), as the torch path
        monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    cap = 128

    def run(kernels: bool) -> list[tuple[list[int], list[int], list[float]]]:
        eng = Engine(model, slots=8, capacity=cap, cuda_graphs=False, kernels=kernels, dtype=torch.float32)
        eng.inline_prefill, eng.prefill_chunk = 0, 13
        seqs = [eng.new(prompt(n, i)) for i, n in enumerate([1, 17, 70, cap - 2])]
        for s in seqs:
            eng.submit(s, SampleMode(temperature=0.0), 3)
        eng.run()
        seqs.pop()  # (its slot is full)
        for i, s in enumerate(seqs):
            eng.extend(s, prompt(6, 50 + i))
        kids = eng.fork_many(seqs[-1], [seqs[-1].ids + prompt(2, 60), seqs[-1].ids[:30] + prompt(20, 61)])
        base = [list(s.ids) for s in seqs + kids]
        for s in seqs + kids:
            eng.submit(s, SampleMode(temperature=0.0), 3)
        eng.run()
        return [(p, s.out, s.logprobs) for p, s in zip(base, seqs + kids, strict=True)]

    got, want = run(True), run(False)
    tol = TOL if dev == "cpu" else 1e-4  # float32 either way; the sums run in another order
    for (p, out, lps), (_, out2, lps2) in zip(got, want, strict=True):
        assert out == out2 and max(abs(a - b) for a, b in zip(lps, lps2, strict=True)) < tol
        assert gap(reference, p, out, lps) < tol


# ----- random sessions: every engine operation in random order --------------------------------------------------
def random_session(seed: int, model: Any, capacity: int = 128) -> tuple[float, int]:
    """Random turns over few slots: new prompts (1 to 70 ids), continued ones (a tool result appended), forks
    from inside a held sequence (with and without a too-long ``shared``), releases, evictions; random
    inline/chunk/admission settings and greedy or seeded sampling. (the worst logprob gap to HF, turns)."""
    import random

    rng = random.Random(seed)
    eng = Engine(model, slots=rng.choice([1, 2, 3, 5]), capacity=capacity, cuda_graphs=False, kernels=False)
    eng.inline_prefill, eng.prefill_chunk = rng.choice([0, 4, 64]), rng.choice([0, 0, 5, 20])
    eng.admit_wait = rng.choice([0, 0, 2])
    eng.seed(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1, 128) for _ in range(n)]

    held: list[Any] = []
    worst, turns = 0.0, 0
    for _ in range(10):
        batch: list[Any] = []
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.35 or not held:
                s = eng.new(ids(rng.choice([1, 2, 10, 40, 70])))
            elif op < 0.6:
                s = held.pop(rng.randrange(len(held)))
                eng.extend(s, ids(rng.choice([1, 3, 20])))
            elif op < 0.9:
                src = rng.choice(held)
                cut = rng.randint(1, len(src.ids))
                s = eng.fork(src, src.ids[:cut] + ids(rng.choice([1, 5, 30])), rng.choice([None, cut + 3]))
            else:
                eng.release(held.pop(rng.randrange(len(held))))
                continue
            if len(s.ids) < capacity - 1 and s not in batch:
                batch.append(s)
        prompts = {s.id: list(s.ids) for s in batch}
        for s in batch:
            eng.submit(s, SampleMode(temperature=rng.choice([0.0, 1.0])), rng.choice([1, 3, 8]))
        eng.run()
        for s in batch:
            worst = max(worst, gap(model, prompts[s.id], s.out, s.logprobs))
            turns += 1
            if s not in held:
                held.append(s)
        held = [s for s in held if s.state in ("idle", "new")]
    return worst, turns


@pytest.mark.parametrize("seed", range(6))
def test_random_sessions_match_hf(mode: str, seed: int) -> None:
    worst, turns = random_session(seed, qwen2(tied=False, seed=seed))
    assert turns > 10 and worst < TOL


def test_a_prompt_id_outside_the_vocabulary_is_a_config_error(chatml_tokenizer: Any) -> None:
    """A tokenizer with more ids than the model's embedding: a typed error before anything is queued (it was an
    IndexError on CPU and a device-side assert on CUDA), and the policy still serves the next call."""
    vocab = len(chatml_tokenizer)
    policy = policy_of(llama(vocab=vocab, seed=2), chatml_tokenizer, slots=3, capacity=64)
    short = prompt(10, 1, vocab)
    for bad in (vocab, -1):
        with pytest.raises(ConfigError, match="outside the model's vocabulary"):
            policy.generate([short, [*short[:5], bad]], GREEDY)
        assert not policy.engine.busy() and not policy.engine.queue
    assert len(policy.generate([short], GREEDY)) == 1
