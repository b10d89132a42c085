"""The rollout engine on a deterministic fake token policy: tree shapes, env forking and replay, CLI config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tests.trainers.conftest import FAKE_ENV, register_fake_env
from toolgym.agents.policy import Generation
from toolgym.errors import ConfigError
from toolgym.trainers.branching import NoBranching, TurnBoundaryEntropy
from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
from toolgym.trainers.tree import flatten


class FakeRenderer:
    def prompt_ids(self, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        return [1, 2, 3]

    def close_turn(self, generated: list[int]) -> list[int]:
        return [9]

    def env_suffix(self, messages: list[dict[str, Any]]) -> list[int]:
        return [8, 8]

    def decode(self, ids: list[int]) -> str:
        return "".join("ae"[i % 2] if i % 3 else "x" for i in ids)

    def strip_stop(self, ids: list[int]) -> list[int]:
        return list(ids)


class FakePolicy:
    """Turn tokens depend on the prompt length and the seed, entropies rise after the first turn."""

    name = "fake"
    renderer = FakeRenderer()

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, prompts: list[list[int]], sampling: Any = None) -> list[Generation]:
        self.calls.append(len(prompts))
        out = []
        for j, p in enumerate(prompts):
            first = len(p) == 3
            tok = [10 + (len(p) + j + (sampling.seed or 0)) % 5, 11, 12]
            out.append(Generation(tok, [-0.5] * 3, "stop", [1.0 if first else 2.0] * 3))
        return out


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()


def test_independent_sampling_builds_depth_one_trees() -> None:
    policy = FakePolicy()
    roller = TreeRollout(policy, NoBranching(), RolloutConfig(budget=3), {})
    forest, stats = roller.run([RolloutTask(FAKE_ENV, 0), RolloutTask(FAKE_ENV, 1)], seed=0)
    assert [len(t.leaves()) for t in forest] == [3, 3]
    t = forest[0]
    assert len(t.nodes[t.root].children) == 3
    # prompt, turn 0, tool node, turn 1 per path; the tool node holds close_turn + env_suffix ids
    rows = flatten(forest)
    assert rows[0].token_ids[:3] == [1, 2, 3] and rows[0].token_ids[6:9] == [9, 8, 8]
    assert rows[0].loss_mask == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    assert all(t.nodes[leaf].info["episode"]["turns"] == 2 for t in forest for leaf in t.leaves())
    assert policy.calls == [6, 6]  # one batched generate call per round
    assert stats.generated_tokens == 36


@pytest.mark.parametrize("forkable", [True, False])
def test_arpo_forks_restore_or_replay_the_env(forkable: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium as gym

    env_cls = gym.spec(FAKE_ENV).entry_point
    monkeypatch.setattr(env_cls, "supports_fork", forkable)
    pol = TurnBoundaryEntropy(initial=2, beam_size=2, entropy_weight=10.0, consecutive_penalty=0.0)
    roller = TreeRollout(FakePolicy(), pol, RolloutConfig(budget=4, entropies=True), {})
    forest, stats = roller.run([RolloutTask(FAKE_ENV, 0)], seed=0)
    t = forest[0]
    assert len(t.leaves()) == 4 and t.branch_count() == 2 and stats.forks == {"entropy": 2}
    # every path, forked or not, ends after exactly two model turns: the fork saw the env after turn 0
    assert all(t.nodes[leaf].info["episode"]["turns"] == 2 for leaf in t.leaves())
    assert all(t.nodes[leaf].reward is not None for leaf in t.leaves())
    assert ("snapshot" in t.nodes[t.root].info) is forkable


def test_token_budget_truncates_paths() -> None:
    roller = TreeRollout(FakePolicy(), None, RolloutConfig(budget=2, max_total_tokens=8), {})
    forest, _ = roller.run([RolloutTask(FAKE_ENV, 0)], seed=0)
    eps = [forest[0].nodes[leaf].info["episode"] for leaf in forest[0].leaves()]
    assert all(e["truncation"] == "token_budget" and e["turns"] == 1 for e in eps)


def test_cli_resolves_yaml_then_flags(tmp_path: Path) -> None:
    from toolgym.cli import build_parser
    from toolgym.cli.train import resolve

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("algorithm: grpo\nsteps: 7\nbudget: 4\nbranching: turn_entropy\n")
    args = build_parser().parse_args(["train", "--config", str(cfg_file), "--budget", "6", "--no-progress"])
    algorithm, cfg = resolve(args)
    assert algorithm == "grpo" and (cfg.steps, cfg.budget, cfg.branching, cfg.progress) == (
        7,
        6,
        "turn_entropy",
        False,
    )
    cfg_file.write_text("algorithm: ppo\n")
    args = build_parser().parse_args(["train", "--config", str(cfg_file), "--estimator", "gigpo"])
    with pytest.raises(ConfigError, match="do not apply to ppo"):
        resolve(args)
    cfg_file.write_text("stepz: 3\n")
    with pytest.raises(ConfigError, match="unknown config keys"):
        resolve(argparse.Namespace(config=str(cfg_file), algorithm=None, print_config=False))


def test_token_level_forks_continue_the_cut_turn() -> None:
    from toolgym.trainers.branching import TokenEntropyTopK

    pol = TokenEntropyTopK(initial=2, n_forks=1, n_children=2)
    roller = TreeRollout(FakePolicy(), pol, RolloutConfig(budget=8, max_new_tokens=5), {})
    forest, stats = roller.run([RolloutTask(FAKE_ENV, 0)], seed=0)
    t = forest[0]
    assert len(t.leaves()) == 4 and stats.forks == {"token": 2}
    for leaf in t.leaves():
        assert t.nodes[leaf].reward is not None and t.nodes[leaf].info["episode"]["turns"] == 2
    # the forked continuations are pieces of a cut model turn: the env saw the whole turn's text
    forked = [n for n in t.nodes if n.branch_reason == "token"]
    for n in forked:
        parent = t.nodes[n.parent]  # type: ignore[index]
        assert parent.kind == "model" and parent.turn == n.turn
        assert len(n.token_ids) <= 5 - len(parent.token_ids)  # the turn's token allowance is shared
        assert n.info["action"] == FakeRenderer().decode(parent.token_ids + n.token_ids)


def test_arpo_tops_up_with_global_samples() -> None:
    # entropy falls after the first turn: no fork, so the tree is filled with fresh samples up to the budget
    pol = TurnBoundaryEntropy(initial=2, entropy_weight=-10.0)
    forest, stats = TreeRollout(FakePolicy(), pol, RolloutConfig(budget=5, entropies=True), {}).run(
        [RolloutTask(FAKE_ENV, 0)], 0
    )
    t = forest[0]
    assert len(t.leaves()) == 5 and len(t.nodes[t.root].children) == 5 and not stats.forks
    pol.top_up = False
    forest, _ = TreeRollout(FakePolicy(), pol, RolloutConfig(budget=5, entropies=True), {}).run(
        [RolloutTask(FAKE_ENV, 0)], 0
    )
    assert len(forest[0].leaves()) == 2


def test_each_turn_is_parsed_once_by_its_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env call reads the turn (read_action) and steps with that reading: one parse per stepped turn,
    and the model node keeps the calls the env read (saved_rollouts shows them without parsing again)."""
    import gymnasium as gym

    env_cls = gym.spec(FAKE_ENV).entry_point
    parse = env_cls.parse
    calls: list[str] = []

    def counted(self: Any, action: Any) -> Any:
        calls.append(str(action))
        return parse(self, action)

    monkeypatch.setattr(env_cls, "parse", counted)
    forest, _ = TreeRollout(FakePolicy(), NoBranching(), RolloutConfig(budget=3), {}).run(
        [RolloutTask(FAKE_ENV, 0), RolloutTask(FAKE_ENV, 1)], seed=0
    )
    model = [n for t in forest for n in t.nodes if n.kind == "model"]
    assert len(model) == 12 and len(calls) == 12
    assert sorted(calls) == sorted(n.info["action"] for n in model)
    assert [n.info["calls"] for n in model if n.turn == 0] == [[{"name": "look", "arguments": {}}]] * 6
    assert all(n.info["calls"] == [] for n in model if n.turn == 1)  # the answer turn


def test_episodes_count_the_observations_the_env_cut() -> None:
    """An observation cut at the env's max_observation_chars (here the task prompt) is counted in the episode
    record and in charts/observation_cut_fraction; a run without cuts reports 0."""
    import gymnasium as gym

    from tests.envs.test_observation_cap import EchoEnv
    from toolgym.trainers.episodes import episode_metrics, leaf_episodes

    if "tests/EchoCut-v0" not in gym.registry:
        gym.register("tests/EchoCut-v0", entry_point=EchoEnv, disable_env_checker=True)
    cfg = RolloutConfig(budget=2, max_new_tokens=3, max_total_tokens=256)
    long = TreeRollout(FakePolicy(), NoBranching(), cfg, {"prompt": "y" * 2000, "max_observation_chars": 500})
    forest, stats = long.run([RolloutTask("tests/EchoCut-v0", 0)], seed=0)
    long.close()
    assert all(e["observations_cut"] >= 1 for e in leaf_episodes(forest))
    assert episode_metrics(forest, stats)["charts/observation_cut_fraction"] == 1.0
    short = TreeRollout(FakePolicy(), NoBranching(), cfg, {"prompt": "Play."})
    forest, stats = short.run([RolloutTask("tests/EchoCut-v0", 0)], seed=0)
    short.close()
    assert episode_metrics(forest, stats)["charts/observation_cut_fraction"] == 0.0
