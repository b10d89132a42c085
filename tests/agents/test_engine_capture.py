"""The engine's graph policy: with ``capture_new`` off, a decode step whose (bucket, mode) has no CUDA graph runs
eager (same ids as a plain engine) and never captures one; on a GPU, precaptured graphs are replayed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from toolgym.agents.engine import EnginePolicy
from toolgym.agents.engine.sampling import SampleMode

PROMPTS = [[5, 6, 7, 8, 9], [12, 13], [14, 15, 16, 17]]


def greedy_outs(policy: EnginePolicy, n: int = 6) -> list[list[int]]:
    eng = policy.engine
    eng.stop_ids = set()
    seqs = [eng.new(list(p)) for p in PROMPTS]
    for s in seqs:
        eng.submit(s, SampleMode(temperature=0), n)
    eng.run()
    return [list(s.out) for s in seqs]


@pytest.fixture(scope="module")
def llama(chatml_tokenizer: Any, make_tiny_model: Any) -> Any:
    return make_tiny_model(len(chatml_tokenizer), seed=3)


def test_without_capture_new_a_missing_graph_runs_eager(llama: Any, chatml_tokenizer: Any) -> None:
    plain = greedy_outs(EnginePolicy(llama, chatml_tokenizer, slots=4, capacity=128))
    policy = EnginePolicy(llama, chatml_tokenizer, slots=4, capacity=128)
    runner = policy.engine.runner
    runner.cuda_graphs = True  # as on a GPU: graphs on, but none captured for this mode
    runner.capture_new = False

    def no_capture(*args: Any) -> Any:
        raise AssertionError("captured a graph with capture_new off")

    runner._capture = no_capture  # type: ignore[method-assign]
    assert greedy_outs(policy) == plain
    assert runner._graphs == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graphs)")
def test_precaptured_graphs_are_replayed_and_no_new_ones_made(llama: Any, chatml_tokenizer: Any) -> None:
    model = copy.deepcopy(llama).to("cuda")
    plain = greedy_outs(EnginePolicy(model, chatml_tokenizer, slots=4, capacity=128, cuda_graphs=False))
    policy = EnginePolicy(model, chatml_tokenizer, slots=4, capacity=128)
    runner = policy.engine.runner
    greedy = SampleMode(temperature=0)
    for b in runner.buckets:
        runner._graphs[(b, greedy)] = runner._capture(b, greedy)
    made = policy.engine.stats.graphs
    runner.capture_new = False
    assert greedy_outs(policy) == plain
    assert policy.engine.stats.graphs == made
    sampled = SampleMode(temperature=1.0)  # no graph for this mode: eager, none captured
    eng = policy.engine
    s = eng.new([5, 6, 7])
    eng.submit(s, sampled, 4)
    eng.run()
    assert len(s.out) == 4 and policy.engine.stats.graphs == made
