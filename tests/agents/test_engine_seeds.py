"""Per-request reproducible sampling: a keyed turn's noise is a hash of (key, position, token), so the same
seeded request samples the same tokens alone, beside other requests, or joining them mid-flight; the keyed
race samples softmax; unkeyed rows draw from the engine's generator exactly as before."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import torch

from toolgym.agents.engine import EnginePolicy
from toolgym.agents.engine.sampling import (
    SampleMode,
    _i64,
    _mix,
    _mix_int,
    keyed_race,
    request_key,
    sample,
)
from toolgym.errors import ConfigError

MODE = SampleMode(temperature=1.0)
TARGET = [7, 8, 9, 10, 11, 12]


# ----- the hash and the race ---------------------------------------------------------------------------------
def test_the_int64_mix_is_splitmix64() -> None:
    rng = random.Random(0)
    xs = [rng.getrandbits(64) for _ in range(200)] + [0, 1, (1 << 63), (1 << 64) - 1]
    got = _mix(torch.tensor([_i64(x) for x in xs], dtype=torch.long)).tolist()
    assert got == [_i64(_mix_int(x)) for x in xs]  # (the masked shifts are logical, as on uint64)


def test_request_keys_are_nonzero_int64_and_differ_by_seed_and_choice() -> None:
    keys = {request_key(s, c) for s in (-3, 0, 1, 2, 10**30) for c in range(4)}
    assert len(keys) == 20 and 0 not in keys
    assert all(-(1 << 63) <= k < (1 << 63) for k in keys)
    assert request_key(5, 1) == request_key(5, 1)


def test_the_keyed_race_is_exp1_inside_its_bounds() -> None:
    keys = torch.tensor([request_key(i) for i in range(64)])
    race = keyed_race(keys, torch.arange(64), 997)
    assert torch.isfinite(race).all() and (race > 0).all()  # u never 0 or 1
    assert race.mean().item() == pytest.approx(1.0, abs=0.01)
    assert (race > 1).float().mean().item() == pytest.approx(float(torch.tensor(-1.0).exp()), abs=0.005)
    assert race.dtype == torch.float32 and race.shape == (64, 997)


@pytest.mark.parametrize("vary", ["keys", "positions"])
def test_keyed_samples_follow_softmax(vary: str) -> None:
    """Frequencies over many keys (or one key's positions) match the distribution sampled from."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2])
    n = 40000
    idx = torch.arange(n)
    if vary == "keys":
        keys, pos = torch.tensor([request_key(7, i) for i in range(n)]), torch.full((n,), 5)
    else:
        keys, pos = torch.full((n,), request_key(7)), idx
    for mode in (SampleMode(temperature=1.0), SampleMode(temperature=0.7, top_k=5)):
        tok, lp, _ = sample(logits.expand(n, -1).clone(), mode, None, keys, pos)
        z = logits / mode.temperature
        if mode.top_k:
            z = z.masked_fill(z < z.topk(mode.top_k).values[-1], float("-inf"))
        p = torch.softmax(z, -1)
        freq = torch.bincount(tok, minlength=len(logits)).float() / n
        tol = 4 * (p * (1 - p) / n).sqrt() + 1e-4
        assert ((freq - p).abs() <= tol).all(), (freq, p)
        assert torch.allclose(lp, p.log()[tok], atol=1e-5)


def test_unkeyed_rows_draw_from_the_generator_as_before() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    plain = sample(logits, MODE, torch.Generator().manual_seed(3))[0]
    zeros = sample(
        logits, MODE, torch.Generator().manual_seed(3), torch.zeros(6, dtype=torch.long), torch.arange(6)
    )
    assert torch.equal(plain, zeros[0])
    keys = torch.tensor([0, 11, 0, 12, 0, 0])
    mixed = sample(logits, MODE, torch.Generator().manual_seed(3), keys, torch.arange(6))[0]
    unkeyed = keys == 0
    assert torch.equal(mixed[unkeyed], plain[unkeyed])
    alone = sample(logits[1:2], MODE, torch.Generator().manual_seed(99), keys[1:2], torch.arange(1, 2))[0]
    assert alone.item() == mixed[1].item()  # a keyed row: the same token whatever the generator and the batch
    greedy = SampleMode(temperature=0)
    assert torch.equal(sample(logits, greedy, None, keys, torch.arange(6))[0], logits.argmax(-1))


# ----- the engine ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(chatml_tokenizer: Any, make_tiny_model: Any) -> Any:
    return make_tiny_model(len(chatml_tokenizer), seed=4)


def _policy(llama: Any, tokenizer: Any, block: int) -> EnginePolicy:
    policy = EnginePolicy(llama, tokenizer, slots=8, capacity=256)
    policy.engine.stop_ids = set()  # every turn runs to its allowance: more tokens to compare
    policy.engine.block = block
    return policy


def _run(policy: EnginePolicy, target: list[int], key: int, others: list[list[int]], join: int) -> list[int]:
    """The target turn's tokens (key ``key``, 24 tokens) with ``others`` in the engine: submitted ``join``
    steps before the target (negative: ``-join`` steps after it), every other one keyed too."""
    eng = policy.engine
    policy.clear_kv()
    eng.generator.manual_seed(len(others) * 31 + join)  # (the unkeyed rows' draws differ run to run)
    seq = eng.new(target)

    def start_others() -> None:
        for i, ids in enumerate(others):
            eng.submit(eng.new(ids), MODE, 12 + 7 * i, key=request_key(100 + i) if i % 2 else 0)

    if join >= 0:
        start_others()
        for _ in range(join):
            eng.step()
        eng.submit(seq, MODE, 24, key=key)
    else:
        eng.submit(seq, MODE, 24, key=key)
        for _ in range(-join):
            eng.step()
        start_others()
    eng.run()
    assert len(seq.out) == 24
    return list(seq.out)


@pytest.mark.parametrize("block", [1, 8], ids=["step", "block8"])
@pytest.mark.parametrize("target", [TARGET, list(range(3, 83))], ids=["inline", "prefilled"])
def test_a_keyed_turn_samples_the_same_tokens_whatever_shares_its_batch(
    llama: Any, chatml_tokenizer: Any, block: int, target: list[int]
) -> None:
    """Alone; beside others admitted with it; joining others mid-flight; others joining it mid-flight (a short
    prompt runs as rows of a decode step, an 80-token one through an eager prefill pass)."""
    policy = _policy(llama, chatml_tokenizer, block)
    key = request_key(1234)
    others = [[20, 21, 22], list(range(30, 100)), [40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [50]]
    alone = _run(policy, target, key, [], 0)
    assert _run(policy, target, key, others, 0) == alone
    assert _run(policy, target, key, others, 3) == alone
    assert _run(policy, target, key, others, -5) == alone
    assert _run(policy, target, key, others[:2], 1) == alone
    assert _run(policy, target, request_key(1235), others, 0) != alone  # another seed, other tokens


def test_the_key_is_the_turns_and_a_bad_one_is_refused(llama: Any, chatml_tokenizer: Any) -> None:
    policy = _policy(llama, chatml_tokenizer, 1)
    eng = policy.engine
    seq = eng.new(TARGET)
    with pytest.raises(ConfigError, match="int64"):
        eng.submit(seq, MODE, 4, key=1 << 63)
    eng.submit(seq, MODE, 4, key=request_key(1))
    eng.run()
    first = list(seq.out)
    eng.submit(seq, MODE, 4)  # the next turn: unkeyed unless keyed again
    assert seq.key == 0
    eng.run()
    again = eng.new(TARGET)
    eng.submit(again, MODE, 4, key=request_key(1))
    eng.run()
    assert again.out == first


def test_a_restarted_keyed_turn_goes_on_with_the_same_noise(llama: Any, chatml_tokenizer: Any) -> None:
    """A reload's restart (a fresh prefill of prompt + tokens so far) keeps the key: same weights, same turn."""
    from toolgym.agents.engine.engine_policy import restart_turn, with_carried

    policy = _policy(llama, chatml_tokenizer, 1)
    alone = _run(policy, TARGET, request_key(9), [], 0)
    eng = policy.engine
    policy.clear_kv()
    seq = eng.new(TARGET)
    eng.submit(seq, MODE, 24, key=request_key(9))
    for _ in range(6):
        eng.step()
    fresh, carried = restart_turn(eng, seq)
    assert fresh.key == request_key(9)
    eng.run()
    assert with_carried(policy.generation(fresh), carried).token_ids == alone


def test_greedy_and_unkeyed_turns_are_unchanged(llama: Any, chatml_tokenizer: Any) -> None:
    """A policy's generate (no keys) draws from the generator: its seeded runs are what they were."""
    from toolgym.agents import SamplingParams

    prompts = [[5, 6, 7, 8], [12, 13], [14, 15, 16, 17]]
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    a = _policy(llama, chatml_tokenizer, 1).generate(prompts, sp)
    b = _policy(llama, chatml_tokenizer, 1).generate(prompts, sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    policy = _policy(llama, chatml_tokenizer, 1)
    eng = policy.engine
    seqs = [eng.new(p) for p in prompts]
    eng.seed(3)
    for s in seqs:
        eng.submit(s, MODE, 10)
    eng.run()
    assert [s.out for s in seqs] == [g.token_ids for g in a]


# ----- toolgym serve ------------------------------------------------------------------------------------------
def test_the_continuous_server_answers_a_seeded_request_alike_beside_others(
    serve: Any, chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    policy = _policy(make_tiny_model(len(chatml_tokenizer), seed=3), chatml_tokenizer, 1)
    server = serve(policy)
    assert server.continuous

    def complete(prompt: list[int], seed: int | None, n: int = 1, max_tokens: int = 16) -> list[list[int]]:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "n": n}
        body.update(return_token_ids=True, **({"seed": seed} if seed is not None else {}))
        resp = httpx.post(f"{server.url}/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        return [c["token_ids"] for c in resp.json()["choices"]]

    alone = complete(TARGET, 42, n=2)
    assert alone[0] != alone[1]  # each choice its own key
    got: dict[int, list[list[int]]] = {}

    def other(i: int) -> None:
        got[i] = complete([20 + i, 21, 22, 23][: 1 + i], 7 if i % 2 else None, max_tokens=40)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    beside = complete(TARGET, 42, n=2)
    for t in threads:
        t.join(120)
    assert len(got) == 3
    assert beside == alone
    assert complete(TARGET, 43, n=2) != alone
