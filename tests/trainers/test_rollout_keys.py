"""Keyed rollouts (`RolloutConfig.keys`, the trainers' `rollout_keys`): with our engine on CPU and the tiny random
Llama, a step's trees are the same token for token whatever the envs' latency and however the batch is split
(fewer engine slots: another admission order); the paths of one node (global samples, forks) draw different
noise; turns are unkeyed by default; engines without keys are refused with a ConfigError."""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_async import SLOW_ENV, SlowVowelEnv
from toolgym.agents.engine.engine_policy import EnginePolicy
from toolgym.agents.engine.sampling import request_key
from toolgym.errors import ConfigError
from toolgym.trainers.branching import Fork, NoBranching, make_branch_policy
from toolgym.trainers.grpo_config import GRPOConfig
from toolgym.trainers.ppo_config import PPOConfig
from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
from toolgym.trainers.tree import RolloutTree

CFG = RolloutConfig(budget=4, max_new_tokens=6, max_total_tokens=256, entropies=True, keys=True)
TASKS = [RolloutTask(SLOW_ENV, s) for s in (0, 1, 2)]


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()
    if SLOW_ENV not in gym.registry:
        gym.register(SLOW_ENV, entry_point=SlowVowelEnv, disable_env_checker=True)


def _policy(tokenizer: Any, slots: int, uniform: bool = False) -> EnginePolicy:
    model = tiny_model(len(tokenizer))
    if uniform:  # every logit 0: what a turn samples is its noise alone
        with torch.no_grad():
            model.lm_head.weight.zero_()
    return EnginePolicy(model, tokenizer, slots=slots, capacity=300)


def _grow(
    policy: Any, branch: Any, cfg: RolloutConfig = CFG, latency: int = 0, tasks: list[RolloutTask] = TASKS
) -> list[RolloutTree]:
    random.seed(latency)  # SlowVowelEnv's sleeps: another env timing per value
    roller = TreeRollout(policy, branch, cfg, {}, env_workers=4)
    try:
        return roller.run(tasks, seed=11)[0]
    finally:
        roller.close()


def _shape(forest: list[RolloutTree]) -> list[list[tuple[Any, ...]]]:
    """Every node of every tree: (parent, kind, tokens)."""
    return [[(n.parent, n.kind, n.token_ids) for n in t.nodes] for t in forest]


def _arpo() -> Any:  # 2 global samples, then a fork at every tool result while there is room (tau 0)
    return make_branch_policy("turn_entropy", initial=2, tau=0.0)


def _treerl() -> Any:  # 2 chains, then 2 continuations at the most surprising token of the tree
    return make_branch_policy("token_entropy", initial=2, n_forks=1, n_children=2)


@pytest.mark.parametrize("branch", [NoBranching, _arpo, _treerl])
def test_keyed_trees_do_not_depend_on_env_timing_or_batch_split(tokenizer: Any, branch: Any) -> None:
    forest = _grow(_policy(tokenizer, 32), branch())
    base = _shape(forest)
    again = _shape(_grow(_policy(tokenizer, 32), branch(), latency=1))  # other env latencies
    split = _shape(_grow(_policy(tokenizer, 3), branch(), latency=2))  # 3 rows at a time: other admission
    assert again == base
    assert split == base
    assert all(len(t.leaves()) == 4 and len(t.nodes) > 4 for t in forest)  # (paths of two turns grew)
    forked = [t for t in forest if t.branch_count() > 0]
    assert bool(forked) == (branch is not NoBranching)  # (the branched runs did fork)


def test_unkeyed_trees_do_depend_on_the_batch_split(tokenizer: Any) -> None:
    """What the test above rules out does happen without keys (the comparison can see it)."""
    off = RolloutConfig(**{**CFG.__dict__, "keys": False})
    assert _shape(_grow(_policy(tokenizer, 32), NoBranching(), off)) != _shape(
        _grow(_policy(tokenizer, 3), NoBranching(), off)
    )


class _ForkEverywhere(NoBranching):
    """One global sample; once it ended: 3 forks inside its first turn (after 2 tokens) and 2 at its tool
    node, then nothing (no forks while turns come in: NoBranching's)."""

    name = "test"

    def global_samples(self, budget: int) -> int:
        return 1

    def on_complete(
        self, tree: RolloutTree, iteration: int, room: int, rng: np.random.Generator
    ) -> list[Fork]:
        if iteration:
            return []
        first = tree.nodes[tree.root].children[0]
        tool = next(c for c in tree.nodes[first].children if tree.nodes[c].kind == "tool")
        return [Fork(first, 2, 3, "token"), Fork(tool, len(tree.nodes[tool].token_ids), 2, "entropy")]


def test_forks_of_one_node_draw_different_noise(tokenizer: Any) -> None:
    """Under a uniform model a fork sampled with its parent's key would repeat the parent's continuation; each
    child of a node has its own key, so every continuation of a fork point differs."""
    cfg = RolloutConfig(**{**CFG.__dict__, "budget": 8})
    forest = _grow(_policy(tokenizer, 32, uniform=True), _ForkEverywhere(), cfg, tasks=TASKS[:1])
    (tree,) = forest
    points = [n for n in tree.nodes if len(n.children) > 1]
    assert sorted(len(n.children) for n in points) == [3, 4]  # the tool node's 1 + 2, the cut turn's 1 + 3
    for n in points:
        turns = [tuple(tree.nodes[c].token_ids) for c in n.children]
        assert len(set(turns)) == len(turns), turns
    again = _grow(_policy(tokenizer, 2, uniform=True), _ForkEverywhere(), cfg, tasks=TASKS[:1], latency=3)
    assert _shape(again) == _shape(forest)  # (and still reproducible: the keys name paths, not moments)


def _submitted(policy: Any) -> list[int]:
    """The keys of every turn `policy`'s engine is given from now on."""
    keys: list[int] = []
    original = policy.engine.submit

    def submit(seq: Any, *args: Any, **kwargs: Any) -> None:
        original(seq, *args, **kwargs)
        keys.append(seq.key)

    policy.engine.submit = submit
    return keys


def test_turns_are_unkeyed_by_default_and_each_path_has_its_own_key(tokenizer: Any) -> None:
    policy = _policy(tokenizer, 32)
    keys = _submitted(policy)
    _grow(
        policy,
        NoBranching(),
        RolloutConfig(budget=3, max_new_tokens=4, max_total_tokens=256),
        tasks=TASKS[:2],
    )
    assert keys and set(keys) == {0}  # default: the engine's generator, as before
    keys.clear()
    _grow(policy, NoBranching(), RolloutConfig(budget=3, max_new_tokens=4, max_total_tokens=256, keys=True))
    # 3 trees x 3 paths, each path one key over its two turns; tree ti's path j: request_key(tree key, j)
    assert len(keys) == 18 and len(set(keys)) == 9 and 0 not in keys
    want = {request_key(request_key(11, ti), j) for ti in range(3) for j in range(3)}
    assert set(keys) == want


def test_greedy_turns_are_never_keyed(tokenizer: Any) -> None:
    policy = _policy(tokenizer, 8)
    keys = _submitted(policy)
    _grow(
        policy, None, RolloutConfig(budget=1, max_new_tokens=4, temperature=0.0, keys=True), tasks=TASKS[:1]
    )
    assert keys and set(keys) == {0}


# ----- engines without keys ----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [GRPOConfig, PPOConfig])
def test_rollout_keys_refuse_the_hf_engine(config: Any) -> None:
    with pytest.raises(ConfigError, match=r"rollout_keys.*engine hf"):
        config(rollout_keys=True, engine="hf")
    assert config(rollout_keys=True, engine="vllm").rollout_config().keys
    assert config(rollout_keys=True, engine="fast").rollout_config().keys
    assert not config().rollout_config().keys
    assert any("rollout_keys" in w for w in config(rollout_keys=True, temperature=0.0).inert_options())


def test_rollout_keys_refuse_selfplay() -> None:
    with pytest.raises(ConfigError, match="rollout_keys with selfplay"):
        GRPOConfig(rollout_keys=True, selfplay={"learner_seats": 2})


def test_a_rounds_policy_is_refused_when_the_run_starts(tokenizer: Any) -> None:
    """`engine: auto` picks the HF policy on CPU: keys are refused when the rollout is built, naming it."""
    from toolgym.agents.hf import HFPolicy

    hf = HFPolicy(tiny_model(len(tokenizer)), tokenizer, batch_size=8)
    with pytest.raises(ConfigError, match=r"rollout_keys.*HFPolicy"):
        TreeRollout(hf, None, CFG, {})
    with pytest.raises(ConfigError, match="rollout_keys"):  # our engine driven in rounds has no keys either
        TreeRollout(_policy(tokenizer, 4), None, CFG, {}, continuous=False)
    TreeRollout(hf, None, RolloutConfig(temperature=0.0, keys=True), {}).close()  # greedy: nothing to key


class _Backend:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def submit(self, rid: str, ids: list[int], body: dict[str, Any]) -> None:
        self.bodies.append(body)


def test_vllm_turns_get_a_seed_from_their_key_and_start() -> None:
    from toolgym.agents.policy import SamplingParams
    from toolgym.agents.vllm_policy import VLLMEngine

    backend = _Backend()
    engine = VLLMEngine(backend, capacity=64, stop_ids=[2], vocab=100)  # type: ignore[arg-type]
    sp = SamplingParams(temperature=1.0, max_new_tokens=4)
    for ids, key in (([5, 6], 0), ([5, 6], 77), ([5, 6], 77), ([5, 6, 7], 77), ([5, 6], 78)):
        engine.submit(engine.new(ids), sp, 4, key=key)
    seeds = [b.get("seed") for b in backend.bodies]
    assert seeds[0] is None  # unkeyed and not `seeded`: as before
    assert seeds[1] == seeds[2] == request_key(77, 2) & (2**63 - 1)  # the same turn: the same seed
    assert len(set(seeds[1:])) == 3 and all(
        0 <= s < 2**63 for s in seeds[1:]
    )  # another start or key: another


def test_trees_admitted_one_by_one_are_keyed_too(tokenizer: Any) -> None:
    """Asynchronous per-tree admission grows each tree outside `run`: its turns get the same keys."""
    from toolgym.trainers.async_rollout import ActorWeights, AsyncRollout
    from toolgym.trainers.episodes import next_tasks

    learner = tiny_model(len(tokenizer))
    gate = ActorWeights(learner, ActorWeights.copy_of(learner), 0)
    policy = EnginePolicy(gate.actor, tokenizer, slots=8, capacity=300)
    keys = _submitted(policy)
    cfg = RolloutConfig(budget=3, max_new_tokens=4, max_total_tokens=256, keys=True)
    roller = TreeRollout(policy, cfg=cfg, gate=gate, env_workers=4)
    pipe = AsyncRollout(
        roller, gate, first=1, last=2, max_staleness=1,
        draw=lambda s: next_tasks([SLOW_ENV], 0, (s - 1) * 2, 2), seed=lambda s: 1000 + s, per_tree=True,
    ).start()  # fmt: skip
    try:
        for step in (1, 2):
            pipe.take(step)
            pipe.publish(step)
    finally:
        pipe.close()
        roller.close()
    want = {request_key(request_key(1000 + s, ti), j) for s in (1, 2) for ti in range(2) for j in range(3)}
    assert set(keys) == want  # (a turn restarted under new weights keeps its key)


# ----- the trainers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_keyed_run_samples_the_same_episodes_whatever_the_env_timing(
    tmp_path: Any, tokenizer: Any, algorithm: str
) -> None:
    """Two runs under other env latencies sample the same episodes (rewards, lengths) at every step; their
    weights agree up to the float rounding of the logprobs, which depends on the batch's make-up (the keys fix
    the tokens, not the rounding)."""
    from tests.trainers.test_train import SMALL, records
    from toolgym.trainers.grpo import train as train_grpo
    from toolgym.trainers.ppo import train as train_ppo

    config, train = (GRPOConfig, train_grpo) if algorithm == "grpo" else (PPOConfig, train_ppo)
    small = {**SMALL, "env_ids": [SLOW_ENV]}
    models = []
    for run in range(2):
        random.seed(run)  # SlowVowelEnv's sleeps
        model = tiny_model(len(tokenizer))
        cfg = config(steps=2, engine="fast", rollout_keys=True, output_dir=str(tmp_path / str(run)), **small)
        train(cfg, model, tokenizer)
        models.append(model)
    same = ("charts/episode_reward", "charts/tokens_per_episode", "charts/turns", "rollout/generated_tokens")
    got = [[{k: r[k] for k in same if k in r} for r in records(tmp_path / str(run))] for run in range(2)]
    assert got[0] == got[1] and any(got[0])
    for (n, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0.0, atol=1e-5), n
    with pytest.raises(ConfigError, match=r"rollout_keys.*HFPolicy"):  # engine auto on CPU: the HF policy
        train(
            config(steps=1, rollout_keys=True, output_dir=str(tmp_path / "auto"), **small), model, tokenizer
        )
