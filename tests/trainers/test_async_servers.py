"""Asynchronous rollouts on vLLM servers (trainers/async_servers.py), on CPU against ``toolgym serve`` (the request
vLLM's server takes; with ``--weight-updates`` the weight-update routes ``weight_sync: disk`` posts): the worker
loses no sample, stays within the bound, and each turn's logprobs are those of a version no older than its tag;
GRPO trains with the servers ending on the learner's weights."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from tests.agents.test_serve_weight_updates import rounded
from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_async import SLOW_ENV, SlowVowelEnv, _turn_logprobs, whole_turns
from tests.trainers.test_train import SMALL, records
from toolgym.agents.hf import HFPolicy
from toolgym.agents.vllm_policy import DiskSync, ServerBackend, VLLMPolicy
from toolgym.errors import ConfigError
from toolgym.trainers.async_rollout import AsyncRollout
from toolgym.trainers.async_servers import ServerWeights
from toolgym.trainers.episodes import next_tasks
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.rollout import RolloutConfig, TreeRollout

pytest.importorskip("fastapi")


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()
    if SLOW_ENV not in gym.registry:
        gym.register(SLOW_ENV, entry_point=SlowVowelEnv, disable_env_checker=True)


def _server(model: Any, tokenizer: Any, weight_updates: bool = True) -> Any:
    from toolgym.agents.openai_server import PolicyServer

    return PolicyServer(
        HFPolicy(model, tokenizer, reuse_kv=True), port=0, weight_updates=weight_updates
    ).start()


def test_async_on_vllm_needs_servers_and_no_rollout_ranks() -> None:
    with pytest.raises(ConfigError, match="needs rollout_servers"):
        GRPOConfig(**dict(SMALL, engine="vllm", max_staleness=1))
    with pytest.raises(ConfigError, match="rollout_ranks"):
        GRPOConfig(
            **dict(SMALL, engine="vllm", max_staleness=1, rollout_servers=["http://a:1"], rollout_ranks=1)
        )
    assert GRPOConfig(
        **dict(SMALL, engine="vllm", max_staleness=2, rollout_servers=["http://a:1"])
    ).max_staleness


@pytest.fixture
def served(tokenizer: Any, tmp_path: Path) -> Iterator[tuple[Any, Any, Any]]:
    """(learner model, the server's model, the learner's policy pushing to it by disk)."""
    learner = tiny_model(len(tokenizer))
    held = copy.deepcopy(learner)
    server = _server(held, tokenizer)
    policy = VLLMPolicy(
        learner, tokenizer, ServerBackend([server.url]), capacity=300,
    )  # fmt: skip
    policy.sync = DiskSync(policy.backend, tmp_path / "weights")
    policy.backend.track_weights = True
    try:
        yield learner, held, policy
    finally:
        policy.close()
        server.close()


def test_worker_on_servers_loses_no_sample_and_each_turn_is_no_older_than_its_tag(
    served: tuple[Any, Any, Any], tokenizer: Any
) -> None:
    """A fake learner perturbs the weights and publishes (a disk push to the server) while the worker grows
    batches there: every batch comes once, in order, within the bound; a turn's tokens all carry one version
    (the one published when it was submitted) and its logprobs are those of that version or a later one
    published before the batch was taken (the server answers a turn whole, between its pushes)."""
    learner, held, policy = served
    steps, max_staleness = 5, 1
    rollout = policy.twin()
    gate = ServerWeights(policy, rollout, 0)
    versions = {0: rounded(learner)}
    assert all(torch.equal(a, b) for a, b in zip(held.parameters(), versions[0].parameters(), strict=True))
    cfg = RolloutConfig(budget=3, max_new_tokens=6, max_total_tokens=256)
    roller = TreeRollout(rollout, cfg=cfg, gate=gate, env_workers=4)
    pipe = AsyncRollout(
        roller, gate, first=1, last=steps, max_staleness=max_staleness,
        draw=lambda s: next_tasks([SLOW_ENV], 0, (s - 1) * 2, 2), seed=lambda s: 1000 + s,
    ).start()  # fmt: skip
    got = []
    rng = random.Random(0)
    try:
        for step in range(1, steps + 1):
            got.append(pipe.take(step))
            time.sleep(rng.uniform(0.0, 0.03))
            with torch.no_grad():
                for p in learner.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            versions[step] = rounded(learner)
            pipe.publish(step)
    finally:
        pipe.close()
        roller.close()
        rollout.close()
    for b, tree, n, tag in whole_turns(got, pipe, steps, max_staleness):
        # the version that sampled it: the tag or one published later, before the batch was taken
        fits = [
            v
            for v in range(tag, b.step)
            if _turn_logprobs(versions[v], tree, n.id) == pytest.approx(n.logprobs, abs=2e-4)
        ]
        assert fits, (b.step, tag)
    # the server ends on the last published weights
    for a, b in zip(held.parameters(), versions[steps].parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(gate.push_s) == steps + 1  # the start weights, then one push a step


def test_grpo_async_on_a_toolgym_serve_rollout_server(tokenizer: Any, tmp_path: Path) -> None:
    """``toolgym train`` with ``engine: vllm``, ``rollout_servers``, ``weight_sync: disk`` and ``max_staleness``:
    it trains within the bound, evaluates on the server too, and the server ends on the learner's weights."""
    model = tiny_model(len(tokenizer))
    held = copy.deepcopy(model)
    server = _server(held, tokenizer)
    try:
        cfg = GRPOConfig(
            steps=4, max_staleness=2, engine="vllm", rollout_servers=[server.url], weight_sync="disk",
            weight_sync_folder=str(tmp_path / "weights"), output_dir=str(tmp_path / "run"), eval_every=2,
            **dict(SMALL, env_ids=[SLOW_ENV]),
        )  # fmt: skip
        metrics = train_grpo(cfg, model, tokenizer)
    finally:
        server.close()
    rows = [r for r in records(tmp_path / "run") if r["step"] > 0]  # (step 0: the first evaluation)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(0 <= r["rollout/staleness_max"] <= 2 for r in rows)
    assert rows[0]["rollout/staleness_max"] == 0
    assert any(k.startswith("eval/") for k in metrics)  # (evaluated on the server too)
    for a, b in zip(held.parameters(), rounded(model).parameters(), strict=True):
        assert torch.equal(a, b)
    assert not [t for t in threading.enumerate() if t.name == "async-rollout"]
