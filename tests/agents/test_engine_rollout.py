"""``TreeRollout`` over the engine's continuous batching (trainers/rollout.py) on CPU with a tiny random
model: the same trees as the round-based path, forks and resumed turns equal to a pass over the whole
path, env faults ending one path only."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolgym.agents import HFPolicy
from toolgym.agents.engine import EnginePolicy
from toolgym.trainers.branching import TurnBoundaryEntropy
from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
from toolgym.trainers.tree import RolloutTree, flatten

ENV = "toolgym/Calculator-v0"
ENV_KW = {"prompt_format": "text", "max_turns": 3}


def arpo(**kw: Any) -> TurnBoundaryEntropy:
    return TurnBoundaryEntropy(**{"initial": 2, "beam_size": 2, "entropy_weight": 0.0, "tau": 0.5, **kw})


def grow(policy: Any, cfg: RolloutConfig, continuous: bool, branch: Any = None, seed: int = 0) -> Any:
    roller = TreeRollout(policy, branch or arpo(), cfg, ENV_KW, continuous=continuous, env_workers=3)
    try:
        return roller.run([RolloutTask(ENV, 3), RolloutTask(ENV, 4)], seed=seed)
    finally:
        roller.close()


def shape(tree: RolloutTree) -> list[tuple[Any, ...]]:
    """Everything a tree holds that training reads (ids in creation order, so node numbering too)."""
    return [
        (n.parent, n.kind, n.token_ids, n.turn, n.branch_reason, n.step_reward, n.reward, n.state_key,
         n.info.get("action"), n.info.get("episode"))
        for n in tree.nodes
    ]  # fmt: skip


def test_continuous_trees_equal_the_round_based_ones(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=2)
    cfg = RolloutConfig(budget=4, max_new_tokens=5, temperature=0.0, max_total_tokens=900, entropies=True)
    engine = EnginePolicy(model, chatml_tokenizer, slots=12, capacity=1024)
    ours, stats = grow(engine, cfg, continuous=True)
    theirs, _ = grow(HFPolicy(model, chatml_tokenizer), cfg, continuous=False)
    assert [t.uid for t in ours] == [t.uid for t in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert shape(a) == shape(b)
        assert len(a.leaves()) == 4
        for x, y in zip(a.nodes, b.nodes, strict=True):
            if x.logprobs is not None:
                assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    assert sum(t.branch_count() for t in ours) > 0 and stats.forks.get("entropy", 0) > 0
    assert stats.generated_tokens > 0 and stats.env_s > 0
    # forks and continued turns come from held caches: only new tokens are prefilled, not each turn's prompt
    eng = engine.engine
    assert eng.stats.forked_tokens > 0 and not eng.busy()
    recompute = sum(len(t.prefix_ids(n.parent)) for t in ours for n in t.nodes if n.kind == "model")  # type: ignore[arg-type]
    assert eng.stats.prefill_tokens < recompute / 3
    # the round-based driver over the engine grows the same trees too, and so does batched admission
    rounds, _ = grow(engine, cfg, continuous=False)
    assert [shape(t) for t in rounds] == [shape(t) for t in ours]
    eng.admit_wait = 3
    held, _ = grow(engine, cfg, continuous=True)
    assert [shape(t) for t in held] == [shape(t) for t in ours] and not eng.queue
    # short prefills (env replies, forks) run as rows of the decode step; a full prefill pass gives the same
    eng.admit_wait, eng.inline_prefill = 0, 0
    eager, _ = grow(engine, cfg, continuous=True)
    assert [shape(t) for t in eager] == [shape(t) for t in ours]


def test_token_level_forks_inside_turns_equal_the_round_based_ones(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    from toolgym.trainers.branching import TokenEntropyTopK

    model = make_tiny_model(len(chatml_tokenizer), seed=5)
    cfg = RolloutConfig(budget=4, max_new_tokens=6, temperature=0.0, max_total_tokens=900)
    branch = TokenEntropyTopK(initial=2, n_forks=1, n_children=2)
    engine = EnginePolicy(model, chatml_tokenizer, slots=12, capacity=1024)
    ours, stats = grow(engine, cfg, continuous=True, branch=branch)
    theirs, _ = grow(HFPolicy(model, chatml_tokenizer), cfg, continuous=False, branch=branch)
    assert stats.forks.get("token", 0) > 0
    assert [shape(t) for t in ours] == [shape(t) for t in theirs]
    assert any(n.branch_reason == "token" and ours[0].nodes[n.parent].kind == "model" for n in ours[0].nodes)  # type: ignore[index]


def test_sampled_forks_continue_exactly_as_the_recomputed_path(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=3)
    policy = EnginePolicy(
        model, chatml_tokenizer, slots=6, capacity=1024
    )  # fewer slots than paths: evictions
    cfg = RolloutConfig(budget=4, max_new_tokens=6, temperature=1.0, max_total_tokens=900, entropies=True)
    forest, stats = grow(policy, cfg, continuous=True, branch=arpo(tau=0.3), seed=1)
    assert stats.forks and all(len(t.leaves()) == 4 for t in forest)
    rows = flatten(forest)
    assert len(rows) == 8
    for r in rows:  # every sampled token's logprob is that of a teacher-forced pass over the whole row
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([r.token_ids])).logits.float(), -1)[0]  # [T, V]
        for i, m in enumerate(r.loss_mask):
            if m:
                assert abs(logp[i - 1, r.token_ids[i]].item() - r.logprobs[i]) < 1e-4
    assert not policy.engine.busy()


@pytest.mark.parametrize("continuous", [True, False])
def test_an_env_fault_mid_tree_ends_that_path_only(
    continuous: bool, chatml_tokenizer: Any, make_tiny_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.envs.base import ToolEnv

    original = ToolEnv.step
    calls = {"n": 0}

    def flaky(self: Any, action: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 4:  # the fourth env step of the run fails (a sandbox that died)
            raise RuntimeError("sandbox connection lost")
        return original(self, action)

    monkeypatch.setattr(ToolEnv, "step", flaky)
    model = make_tiny_model(len(chatml_tokenizer), seed=2)
    policy: Any = (
        EnginePolicy(model, chatml_tokenizer, slots=12, capacity=1024)
        if continuous
        else HFPolicy(model, chatml_tokenizer)
    )
    cfg = RolloutConfig(budget=4, max_new_tokens=5, temperature=0.0, max_total_tokens=900)
    forest, stats = grow(policy, cfg, continuous=continuous, branch=arpo(top_up=False))
    leaves = [(t, leaf) for t in forest for leaf in t.leaves()]
    faults = [(t, leaf) for t, leaf in leaves if t.nodes[leaf].info["episode"]["truncation"] == "env_error"]
    assert len(faults) == 1 and stats.env_errors == 1
    t, leaf = faults[0]
    assert "sandbox connection lost" in t.nodes[leaf].info["infra_error"]
    assert t.nodes[leaf].info["episode"]["truncated"] is True
    assert len(flatten(forest)) == len(leaves) - 1  # the faulty path gets no training row
    assert all(t.nodes[leaf].reward is not None for t, leaf in leaves)


def test_first_turns_of_all_trees_prefill_in_one_pass(
    chatml_tokenizer: Any, make_tiny_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a plan per tree ran one eager prefill pass per group (launch-bound on a GPU: ~40 ms each); the trees'
    # waiting turns are planned together, so the first turns of every tree cost one pass of their heads
    from toolgym.agents.engine import engine as engine_mod

    model = make_tiny_model(len(chatml_tokenizer), seed=2)
    cfg = RolloutConfig(budget=4, max_new_tokens=3, temperature=1.0, max_total_tokens=900)
    policy = EnginePolicy(model, chatml_tokenizer, slots=32, capacity=1024)
    passes: list[int] = []
    real = engine_mod.prefill

    def counted(w: Any, cache: Any, seqs: Any, want_logits: bool = True, **kw: Any) -> Any:
        passes.append(len(seqs))
        return real(w, cache, seqs, want_logits, **kw)

    monkeypatch.setattr(engine_mod, "prefill", counted)
    roller = TreeRollout(policy, arpo(), cfg, {**ENV_KW, "max_turns": 1}, continuous=True, env_workers=2)
    roller.plan_wait = 5.0  # not the 20 ms default: a loaded test machine may take longer for six resets
    try:
        roller.run([RolloutTask(ENV, s) for s in range(6)], seed=0)
    finally:
        roller.close()
    # the shared system prompt once, then the six trees' heads together (their resets finish one by one on
    # the env threads; an idle engine waits for them); a plan per tree made six passes of one head each
    assert passes == [1, 6], passes
