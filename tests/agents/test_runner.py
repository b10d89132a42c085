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
from toolgym.agents.policy import Generation, RenderedTokenPolicy, SamplingParams
from toolgym.agents.rendering import ChatRenderer
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


# ----- each token-level turn is parsed once, by the env ---------------------------------------------------
COUNTER_SCRIPT = [
    '<tool_call>{"name": oops}</tool_call>',  # malformed: an observation and a penalty
    '<tool_call>{"name": "add", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {}}</tool_call>',
    "<answer>2</answer>",
]


class CannedTokenPolicy(RenderedTokenPolicy):
    """A token policy without a model: turn k of an episode (k assistant turns in the prompt) is
    ``COUNTER_SCRIPT[k]`` encoded, ending with the end-of-turn token."""

    name = "canned"

    def __init__(self, tokenizer: Any) -> None:
        self._renderer = ChatRenderer(tokenizer)
        self.sampling = SamplingParams()
        self.stop = min(self._renderer.stop_ids)

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        out = []
        for p in prompts:
            k = self._renderer.decode(p).count("<|im_start|>assistant") - 1
            ids = [*self._renderer.encode(COUNTER_SCRIPT[k]), self.stop]
            out.append(Generation(ids, [-0.1] * len(ids), "stop"))
        return out


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every parse of a model turn: the env's (``ToolEnv.parse``) and the policy's (``parse_turn``)."""
    import toolgym.agents.policy as policy_module
    from toolgym.envs.base import ToolEnv

    calls: list[str] = []
    env_parse, policy_parse = ToolEnv.parse, policy_module.parse_turn

    def counted_env(self: Any, action: Any) -> Any:
        calls.append("env")
        return env_parse(self, action)

    def counted_policy(*args: Any, **kwargs: Any) -> Any:
        calls.append("policy")
        return policy_parse(*args, **kwargs)

    monkeypatch.setattr(ToolEnv, "parse", counted_env)
    monkeypatch.setattr(policy_module, "parse_turn", counted_policy)
    return calls


def test_token_level_turns_are_parsed_once_by_the_env(
    chatml_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.testing_env import COUNTER, register

    register()
    specs = episode_specs([COUNTER], 3, target=2)
    calls = count_parses(monkeypatch)
    with EpisodeRunner(CannedTokenPolicy(chatml_tokenizer), concurrency=2) as runner:
        once = runner.run(specs)
        turns = runner.stats["model_turns"]
    assert turns == 12 and calls == ["env"] * 12  # one parse per turn, by the env, passed on to its step
    calls.clear()
    with monkeypatch.context() as mp:  # the path without ParsedAction: the policy parses, the env again
        mp.setattr("toolgym.agents.runner.action_reader", lambda env: None)
        with EpisodeRunner(CannedTokenPolicy(chatml_tokenizer), concurrency=2) as runner:
            twice = runner.run(specs)
    assert sorted(calls) == ["env"] * 12 + ["policy"] * 12
    for a, b in zip(once, twice, strict=True):
        assert a.success and a.reward == b.reward and a.rewards == b.rewards and a.infos == b.infos
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.turn_texts == b.turn_texts
        assert [m["role"] for m in a.messages] == [m["role"] for m in b.messages]
        assert [m["content"] for m in a.messages] == [m["content"] for m in b.messages]
        # the recorded calls carry the ids the env's tool results answer (the policy's own parse numbered
        # every turn's calls from call_0, so the second call's record said call_0 and its result call_1)
        for m, reply in zip(a.messages[:-1], a.messages[1:], strict=True):
            if m.get("tool_calls"):
                assert m["tool_calls"][0]["id"] == reply["tool_call_id"]
        assert [m["tool_calls"][0]["id"] for m in b.messages if m.get("tool_calls")] == ["call_0", "call_0"]


def test_engine_runner_parses_each_turn_once(
    chatml_tokenizer: Any, make_tiny_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.agents.engine import EnginePolicy

    policy = EnginePolicy(
        make_tiny_model(len(chatml_tokenizer), seed=2), chatml_tokenizer, slots=2, capacity=512
    )
    calls = count_parses(monkeypatch)
    with EpisodeRunner(policy, concurrency=3, sampling=SamplingParams(temperature=0, max_new_tokens=6)) as r:
        trajs = r.run(episode_specs(["toolgym/Calculator-v0"], 3, max_turns=2))
        assert r.continuous and calls == ["env"] * int(r.stats["model_turns"]) and len(calls) == 6
    assert all(t.turns == 2 and t.error is None for t in trajs)
