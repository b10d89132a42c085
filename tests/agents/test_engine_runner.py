"""The episode runner's continuous batching over the engine: same records as the round-based runner,
logprobs equal to a pass over the whole sequence, env steps on threads, slot pressure."""

from __future__ import annotations

from typing import Any

import torch

from toolgym.agents import HFPolicy, SamplingParams, run_episodes
from toolgym.agents.engine import EnginePolicy

ENV = "toolgym/Calculator-v0"


def test_greedy_episodes_equal_the_round_based_runner(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=2)
    sp = SamplingParams(temperature=0, max_new_tokens=6)
    kw = dict(sampling=sp, env_kwargs={"prompt_format": "text", "max_turns": 3}, concurrency=3)
    ours = run_episodes(EnginePolicy(model, chatml_tokenizer, slots=4, capacity=1024), ENV, 4, **kw)
    theirs = run_episodes(HFPolicy(model, chatml_tokenizer), ENV, 4, **kw)
    for a, b in zip(ours, theirs, strict=True):
        assert a.seed == b.seed and a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.turn_spans == b.turn_spans and a.rewards == b.rewards and a.turn_texts == b.turn_texts


def test_sampled_episodes_logprobs_match_the_whole_sequence(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=3)
    policy = EnginePolicy(model, chatml_tokenizer, slots=2, capacity=1024)  # fewer slots than episodes
    trajs = run_episodes(
        policy, ENV, 5, concurrency=5, env_workers=3,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=6, seed=0),
        env_kwargs={"prompt_format": "text", "max_turns": 4},
    )  # fmt: skip
    assert len(trajs) == 5
    for t in trajs:
        assert t.turns == 4 and t.truncation == "turn_limit" and t.error is None
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([t.token_ids])).logits.float(), -1)[0]  # [T, V]
        for i, m in enumerate(t.loss_mask):
            if m:
                assert abs(logp[i - 1, t.token_ids[i]].item() - t.logprobs[i]) < 1e-4
            else:
                assert t.logprobs[i] == 0.0
    assert policy.engine.stats.decode_tokens > 0
    assert not policy.engine.busy() and not policy.engine.idle  # every slot came back
