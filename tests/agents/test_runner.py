"""The runner: concurrency, batching, fault isolation, JSONL round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.agents import (
    AssistantTurn,
    EpisodeRunner,
    EpisodeSpec,
    ScriptedPolicy,
    episode_specs,
    load_trajectories,
    run_episodes,
    save_trajectories,
)
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.messages import Message


class CountingScripted(ScriptedPolicy):
    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def act(self, conversations: Sequence[Any], *args: Any, **kwargs: Any) -> list[AssistantTurn]:
        self.batch_sizes.append(len(conversations))
        return super().act(conversations, *args, **kwargs)


def test_scripted_solves_and_calls_are_batched_across_episodes() -> None:
    policy = CountingScripted()
    trajs = run_episodes(policy, ["toolgym/Calculator-v0"], 10, concurrency=4)
    assert [t.seed for t in trajs] == list(range(10))
    assert all(t.success and t.turns == 2 and t.tool_calls == 1 for t in trajs)
    assert max(policy.batch_sizes) == 4 and sum(policy.batch_sizes) == 20
    assert len(policy.batch_sizes) < 20


def test_same_seed_same_trajectory_whatever_the_concurrency() -> None:
    a = run_episodes(ScriptedPolicy(), "toolgym/Calculator-v0", 6, concurrency=1)
    b = run_episodes(ScriptedPolicy(), "toolgym/Calculator-v0", 6, concurrency=6)
    assert [t.messages for t in a] == [t.messages for t in b]


class FlakyEnv(gym.Wrapper):  # type: ignore[type-arg]
    """Fails in reset on seed 1, in step on seed 2 (an exception) and seed 3 (an infrastructure error)."""

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.seed_ = seed
        if seed == 1:
            raise RuntimeError("browser crashed")
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        if self.seed_ == 2:
            raise OSError("sandbox died")
        if self.seed_ == 3:
            raise InfrastructureError("docker daemon went away")
        return self.env.step(action)


def test_env_faults_end_only_their_episode() -> None:
    made: list[Any] = []

    def make_env(spec: EpisodeSpec) -> Any:
        made.append(spec)
        return FlakyEnv(gym.make(spec.env_id))

    with EpisodeRunner(ScriptedPolicy(), concurrency=3, make_env=make_env) as runner:
        trajs = runner.run(episode_specs(["toolgym/Calculator-v0"], 6))
    assert [t.infra_failure for t in trajs] == [False, True, True, True, False, False]
    assert trajs[1].error == "reset: RuntimeError: browser crashed"
    assert "OSError" in (trajs[2].error or "") and "docker daemon" in (trajs[3].error or "")
    assert all(t.truncation == "env_error" for t in trajs[1:4])
    assert all(t.success for t in (trajs[0], trajs[4], trajs[5]))
    assert len(made) >= 4  # broken envs were replaced


def test_env_reported_infrastructure_error_is_recorded() -> None:
    class Reporting(gym.Wrapper):  # type: ignore[type-arg]
        def step(self, action: Any) -> Any:
            obs, _r, _term, _trunc, info = self.env.step(action)
            return obs, 0.0, False, True, {**info, "truncation": "env_error", "infra_error": "timeout"}

    runner = EpisodeRunner(ScriptedPolicy(), make_env=lambda s: Reporting(gym.make(s.env_id)))
    (t,) = runner.run([EpisodeSpec("toolgym/Calculator-v0", 0)])
    assert t.infra_failure and t.error == "timeout"


def test_backend_error_turn_is_an_infrastructure_failure() -> None:
    class Down:
        name = "down"

        def act(self, conversations: Sequence[Any], *a: Any, **k: Any) -> list[AssistantTurn]:
            return [AssistantTurn("503", Message(role="assistant", content=""), finish_reason="error")] * len(
                conversations
            )

    trajs = run_episodes(Down(), "toolgym/Calculator-v0", 2)
    assert all(t.infra_failure and t.error == "policy: RuntimeError: 503" for t in trajs)


def test_wrong_number_of_turns_is_a_config_error() -> None:
    class Short:
        name = "short"

        def act(self, conversations: Sequence[Any], *a: Any, **k: Any) -> list[AssistantTurn]:
            return []

    with pytest.raises(ConfigError, match="returned 0 turns for 2"):
        run_episodes(Short(), "toolgym/Calculator-v0", 2)


def test_unknown_env_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="toolgym list"):
        run_episodes(ScriptedPolicy(), "toolgym/Nope-v0", 1)


def test_jsonl_round_trip(tmp_path: Any, tiny_policy: Any) -> None:
    from toolgym.agents import SamplingParams

    trajs = run_episodes(ScriptedPolicy(), "toolgym/Calculator-v0", 3)
    trajs += run_episodes(
        tiny_policy,
        "toolgym/Calculator-v0",
        2,
        sampling=SamplingParams(max_new_tokens=4, seed=0, return_entropies=True),
        env_kwargs={"max_turns": 2},
    )
    path = save_trajectories(tmp_path / "t.jsonl", trajs)
    again = load_trajectories(path)
    assert [t.to_dict() for t in again] == [t.to_dict() for t in trajs]
    assert again[-1].turn_spans and isinstance(again[-1].turn_spans[0], tuple)
    assert len(again[-1].entropies) == len(again[-1].token_ids)
    (tmp_path / "bad.jsonl").write_text('{"env_id": "x", "seed": 0}\n{"trunc')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        load_trajectories(tmp_path / "bad.jsonl")
