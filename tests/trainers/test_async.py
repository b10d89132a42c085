"""Asynchronous rollouts (trainers/async_rollout.py) on CPU with the tiny random Llama: max_staleness 0 is the
synchronous loop; a worker under random env latency loses, repeats and reorders no sample, keeps staleness
within its bound, and tags every token with the version whose weights gave its logprob."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from tests.testing_env import VowelCountEnv
from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, assert_namespaced, records, snapshot
from toolgym.agents.hf import HFPolicy
from toolgym.errors import ConfigError
from toolgym.tools import Tool
from toolgym.trainers import grpo
from toolgym.trainers.async_rollout import ActorWeights, AsyncRollout, staleness
from toolgym.trainers.episodes import next_tasks
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.rollout import RolloutConfig, TreeRollout
from toolgym.trainers.tree import RolloutTree

SLOW_ENV = "tests/SlowVowel-v0"


class SlowVowelEnv(VowelCountEnv):
    """VowelCount whose tool and scoring take a random 0-15 ms (a real sleep: the worker's envs overlap)."""

    def tools(self) -> list[Tool]:
        def look() -> str:
            """Look around."""
            time.sleep(random.uniform(0.0, 0.015))
            return "ok"

        return [Tool(look)]

    def check_answer(self, answer: str) -> dict[str, float]:
        time.sleep(random.uniform(0.0, 0.015))
        return super().check_answer(answer)


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()
    if SLOW_ENV not in gym.registry:
        gym.register(SLOW_ENV, entry_point=SlowVowelEnv, disable_env_checker=True)


def test_max_staleness_zero_is_the_synchronous_loop(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same metrics (times aside) and the same weights, bit for bit; no worker is ever made."""
    m1, m2 = tiny_model(len(tokenizer)), tiny_model(len(tokenizer))
    train_grpo(GRPOConfig(steps=2, output_dir=str(tmp_path / "a"), **SMALL), m1, tokenizer)

    def no_worker(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("max_staleness 0 made an asynchronous worker")

    monkeypatch.setattr(grpo, "start_worker", no_worker)
    monkeypatch.setattr(grpo, "rollout_side", no_worker)
    train_grpo(GRPOConfig(steps=2, max_staleness=0, output_dir=str(tmp_path / "b"), **SMALL), m2, tokenizer)
    for a, b in zip(records(tmp_path / "a"), records(tmp_path / "b"), strict=True):
        assert {k for k in a if not k.startswith("time/")} == {k for k in b if not k.startswith("time/")}
        for k in a:
            if not k.startswith(("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s")):
                assert a[k] == b[k], k
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2), n


@pytest.mark.parametrize("admission", ["batch", "tree"])
def test_async_training_runs_within_the_bound(tmp_path: Path, tokenizer: Any, admission: str) -> None:
    model = tiny_model(len(tokenizer))
    before = snapshot(model)
    cfg = GRPOConfig(
        steps=4, max_staleness=2, async_admission=admission, output_dir=str(tmp_path),
        **dict(SMALL, env_ids=[SLOW_ENV]),
    )  # fmt: skip
    metrics = train_grpo(cfg, model, tokenizer)
    assert not [n for n in before if torch.equal(before[n], snapshot(model)[n])]
    rows = records(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(0 <= r["rollout/staleness_max"] <= 2 for r in rows)
    assert rows[0]["rollout/staleness_max"] == 0  # nothing is older than the initial policy at step 1
    for key in ("losses/is_masked_fraction", "losses/is_ratio_spread", "rollout/staleness_mean"):
        assert key in metrics, key
    assert_namespaced(tmp_path, metrics)
    assert not [t for t in threading.enumerate() if t.name == "async-rollout"]  # the worker ended


@pytest.mark.parametrize("admission", ["batch", "tree"])
def test_ppo_async_trains_within_the_bound(tmp_path: Path, tokenizer: Any, admission: str) -> None:
    """PPO takes the worker's batches as GRPO does: trained within the bound, the worker ended, and its
    asynchronous metrics logged; its config refuses what GRPO's refuses (a task pool drawn ahead)."""
    from toolgym.trainers.ppo import PPOConfig
    from toolgym.trainers.ppo import train as train_ppo

    model = tiny_model(len(tokenizer))
    before = snapshot(model)
    cfg = PPOConfig(
        steps=3, max_staleness=1, async_admission=admission, is_mode="token_mask", is_min=0.5, is_max=5.0,
        output_dir=str(tmp_path), **dict(SMALL, env_ids=[SLOW_ENV]),
    )  # fmt: skip
    metrics = train_ppo(cfg, model, tokenizer)
    assert not [n for n in before if torch.equal(before[n], snapshot(model)[n])]
    rows = [r for r in records(tmp_path) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(0 <= r["rollout/staleness_max"] <= 1 for r in rows) and rows[0]["rollout/staleness_max"] == 0
    assert "losses/is_masked_fraction" in metrics and "time/weight_publish_s" in metrics
    assert_namespaced(tmp_path, metrics)
    assert not [t for t in threading.enumerate() if t.name == "async-rollout"]
    with pytest.raises(ConfigError, match="task_pool"):
        PPOConfig(**dict(SMALL, max_staleness=1, task_pool=4))
    with pytest.raises(ConfigError, match="needs rollout_servers"):
        PPOConfig(**dict(SMALL, max_staleness=1, engine="vllm"))


def test_async_resume_continues(tmp_path: Path, tokenizer: Any) -> None:
    opts = dict(SMALL, env_ids=[SLOW_ENV], max_staleness=1, output_dir=str(tmp_path))
    train_grpo(GRPOConfig(steps=2, **opts), tiny_model(len(tokenizer)), tokenizer)
    train_grpo(GRPOConfig(steps=4, resume=True, **opts), tiny_model(len(tokenizer), seed=5), tokenizer)
    rows = records(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["rollout/staleness_max"] == 0  # the resumed worker starts from the checkpoint's version


@pytest.mark.parametrize(
    "bad",
    [
        dict(refill=True),
        dict(task_pool=4),
        dict(curriculum={"knobs": {"digits": [1, 2]}}),
        dict(max_staleness=-1),
    ],
)
def test_unsupported_combinations_are_config_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        GRPOConfig(**dict(SMALL, max_staleness=bad.pop("max_staleness", 2)), **bad)


# ----- the worker alone, against a fake learner that perturbs the weights and keeps every version ---------------
def _turn_logprobs(model: Any, tree: RolloutTree, nid: int) -> list[float]:
    ids = tree.prefix_ids(nid)
    n = len(tree.nodes[nid].token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()  # [L - 1, V]
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(ids) - n - 1 + j, ids[len(ids) - n + j]]) for j in range(n)]


def _fake_learner(
    tokenizer: Any, *, max_staleness: int, steps: int, continuous: bool, per_tree: bool = False
) -> tuple[list[Any], dict[int, Any], AsyncRollout]:
    learner = tiny_model(len(tokenizer))
    gate = ActorWeights(learner, ActorWeights.copy_of(learner), 0)
    if continuous:
        from toolgym.agents.engine.engine_policy import EnginePolicy

        policy: Any = EnginePolicy(gate.actor, tokenizer, slots=32, capacity=300)
    else:
        policy = HFPolicy(gate.actor, tokenizer, batch_size=64, reuse_kv=True)
    cfg = RolloutConfig(budget=3, max_new_tokens=6, max_total_tokens=256)
    roller = TreeRollout(policy, cfg=cfg, gate=gate, env_workers=4)
    pipe = AsyncRollout(
        roller, gate, first=1, last=steps, max_staleness=max_staleness,
        draw=lambda s: next_tasks([SLOW_ENV], 0, (s - 1) * 2, 2), seed=lambda s: 1000 + s, per_tree=per_tree,
    ).start()  # fmt: skip
    versions = {0: ActorWeights.copy_of(learner)}
    got = []
    rng = random.Random(0)
    try:
        for step in range(1, steps + 1):
            batch = pipe.take(step)
            got.append(batch)
            time.sleep(rng.uniform(0.0, 0.03))  # the "update"
            with torch.no_grad():
                for p in learner.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            versions[step] = ActorWeights.copy_of(learner)
            pipe.publish(step)
    finally:
        pipe.close()
        roller.close()
    return got, versions, pipe


def whole_turns(got: list[Any], pipe: AsyncRollout, steps: int, max_staleness: int) -> list[tuple[Any, ...]]:
    """(batch, tree, node, version) of every model turn of a worker's batches `got`, each sampled under one
    version, after the checks every worker test makes: each batch trained once, in order, none lost or
    repeated, every sample back, the bound kept (and reached: the worker ran ahead of the learner)."""
    assert pipe.taken == list(range(1, steps + 1))
    assert [t.seed for b in got for t in b.tasks] == [t.seed for t in next_tasks([SLOW_ENV], 0, 0, 2 * steps)]
    out = []
    for b in got:
        assert len(b.forest) == 2 and all(len(t.leaves()) == 3 for t in b.forest)
        assert 0 <= staleness(b.forest, b.step)[1] <= max_staleness
        for tree in b.forest:
            for n in tree.nodes:
                if n.kind == "model":
                    assert n.versions is not None and len(set(n.versions)) == 1
                    assert b.step - 1 - max_staleness <= n.versions[0] <= b.step - 1
                    out.append((b, tree, n, n.versions[0]))
    assert any(staleness(b.forest, b.step)[1] > 0 for b in got)  # the worker did run ahead of the learner
    return out


@pytest.mark.parametrize("max_staleness,per_tree", [(1, False), (3, False), (2, True)])
def test_worker_loses_no_sample_and_tags_each_token_with_its_version(
    tokenizer: Any, max_staleness: int, per_tree: bool
) -> None:
    steps = 6
    got, versions, pipe = _fake_learner(
        tokenizer, max_staleness=max_staleness, steps=steps, continuous=False, per_tree=per_tree
    )
    for b, tree, n, v in whole_turns(got, pipe, steps, max_staleness):  # rounds: a turn, one version
        want = _turn_logprobs(versions[v], tree, n.id)
        assert n.logprobs == pytest.approx(want, abs=2e-4), (b.step, v)
    if per_tree:  # some batch's trees started while the batch before it still grew
        assert sum(b.early for b in got) > 0


@pytest.mark.parametrize("per_tree", [False, True])
def test_continuous_worker_switches_weights_inside_turns(tokenizer: Any, per_tree: bool) -> None:
    """Our engine (on CPU): a turn in flight at a version change goes on under the new weights (versions never
    go back inside a turn), and every token's logprob is that of the version it is tagged with, given the
    whole context (the turn is prefilled again under the new weights). Per-tree admission: the same, with
    the trees of several batches in one episode loop."""
    steps = 5
    switched = False
    for _attempt in range(4):  # a version arriving mid-turn is a matter of timing: a few runs to see one
        got, versions, pipe = _fake_learner(
            tokenizer, max_staleness=2, steps=steps, continuous=True, per_tree=per_tree
        )
        assert pipe.taken == list(range(1, steps + 1))
        for b in got:
            assert staleness(b.forest, b.step)[1] <= 2
            for tree in b.forest:
                assert len(tree.leaves()) == 3
                for n in tree.nodes:
                    if n.kind != "model":
                        continue
                    assert n.versions is not None and n.versions == sorted(n.versions)
                    assert b.step - 3 <= n.versions[0] <= n.versions[-1] <= b.step - 1
                    switched |= n.versions[0] != n.versions[-1]
                    by_version = {v: _turn_logprobs(versions[v], tree, n.id) for v in set(n.versions)}
                    want = [by_version[v][j] for j, v in enumerate(n.versions)]
                    assert n.logprobs == pytest.approx(want, abs=2e-3), (b.step, n.versions)
        if switched:
            break
    # some turn was in flight at a version change (per tree the worker often runs so far ahead that versions
    # arrive between trees, so it is not required there)
    assert switched or per_tree
    assert (sum(b.early for b in got) > 0) == per_tree  # per tree: batches overlap in the engine


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the worker's own stream)")
def test_the_worker_stream_reads_one_whole_version_while_the_learner_publishes() -> None:
    """On a GPU the worker reads the actor on its own stream while the learner overwrites it at each publish on
    the default stream: every read (under `hold`, and a re-pack under `sync`) sees the weights of exactly one
    version, never a mix, and never one older than the version it was told."""
    from toolgym.trainers.async_rollout import worker_stream

    learner = torch.nn.Linear(4096, 4096, bias=False).cuda()
    actor = ActorWeights.copy_of(learner)
    gate = ActorWeights(learner, actor, version=0)
    with torch.no_grad():
        learner.weight.fill_(0.0)
    gate.publish(0)
    seen: list[tuple[int, float, float]] = []
    stop = threading.Event()

    class Packer:  # a stand-in engine: its re-pack copies the actor into its own buffer
        def __init__(self) -> None:
            self.packed = torch.empty_like(actor.weight)

        def refresh(self, force: bool = False) -> None:
            self.packed.copy_(actor.weight)

    packer = Packer()

    def worker() -> None:
        with torch.no_grad(), worker_stream(actor):
            while not stop.is_set():
                with gate.hold() as version:
                    w = actor.weight @ torch.ones(4096, 1, device="cuda")  # a long read
                    seen.append((version, float(w.min()) / 4096, float(w.max()) / 4096))
                v = gate.sync(packer)
                seen.append((v, float(packer.packed.min()), float(packer.packed.max())))

    t = threading.Thread(target=worker)
    t.start()
    try:
        for v in range(1, 40):
            with torch.no_grad():
                learner.weight.fill_(float(v))
                learner.weight.mul_(1.0)  # more queued work before the copy
            gate.publish(v)
            time.sleep(0.002)
    finally:
        stop.set()
        t.join()
    assert len(seen) > 10
    for version, lo, hi in seen:
        assert lo == hi == float(version), (version, lo, hi)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the engines' graphs)")
def test_async_on_cuda_evaluates_with_graphs_captured_before_the_worker(
    tmp_path: Path, tokenizer: Any
) -> None:
    """On a GPU both engines capture their graphs before the worker starts (the learner's: the greedy
    evaluations'), and no engine captures one while the worker decodes: the run ends with its evaluations."""
    from toolgym.agents.engine.engine import ModelRunner

    captured: list[int] = []
    real = ModelRunner._capture

    def counting(self: Any, b: int, mode: Any) -> Any:
        captured.append(b)
        if any(t.name == "async-rollout" for t in threading.enumerate()):
            raise AssertionError("a graph was captured while the worker runs")
        return real(self, b, mode)

    model = tiny_model(len(tokenizer))
    cfg = GRPOConfig(
        steps=3, max_staleness=2, eval_every=1, output_dir=str(tmp_path),
        **dict(SMALL, env_ids=[SLOW_ENV], device="cuda", engine="fast"),
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelRunner, "_capture", counting)
        train_grpo(cfg, model, tokenizer)
    rows = [r for r in records(tmp_path) if r["step"] > 0]  # (step 0: the initial policy's evaluation)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("eval/success" in r and "time/eval_s" in r for r in rows)
    assert captured  # the graphs were made (before the worker)
