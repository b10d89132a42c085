"""``ToolEnv.read_action`` + ``step(ParsedAction)``: one parse per turn, the same results as stepping on the text
in every env family, and a ParsedAction is only trusted by the env, state and format that made it."""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from tests.testing_env import COUNTER, VOWEL_COUNT, register
from toolgym.envs import ENVS
from toolgym.envs.base import ParsedAction, ToolEnv, action_reader
from toolgym.parsing import ParseResult

register()


def family_ids() -> list[str]:
    """The first registered id of each env family (entry-point module), and the test envs."""
    seen: dict[str, str] = {}
    for env_id in sorted(ENVS):
        module = str(gym.spec(env_id).entry_point).split(":")[0]
        seen.setdefault(module, env_id)
    ids = [i for i in seen.values() if i != "toolgym/Remote-v0"]  # a proxy: its server parses (below)
    gem = importlib.util.find_spec("gem") is not None  # gem-llm is opt-in (tests/interop/test_gem.py)
    return [i for i in ids if gem or not i.startswith("toolgym/GEM-")] + [VOWEL_COUNT, COUNTER]


class CountingParse:
    """Counts an env's ``parse`` calls (an instance attribute: ``self.parse(...)`` finds it first)."""

    def __init__(self, env: ToolEnv) -> None:
        self.calls = 0
        self.inner = env.parse
        env.parse = self  # type: ignore[method-assign]

    def __call__(self, action: Any) -> ParseResult:
        self.calls += 1
        return self.inner(action)


# a malformed turn of each kind first (an observation and a format penalty, never a crash), then the expert
MALFORMED = ['<tool_call>{"name": oops}</tool_call>', "", "<answer>1</answer><answer>2</answer>"]


def play(env: Any, seed: int, preparsed: bool, turns: int = 8) -> tuple[list[Any], list[Any], int, int]:
    """Steps with the text, or with the env's ParsedAction; returns the steps, the transcript, the parse
    count and the number of steps."""
    inner = env.unwrapped
    counter = CountingParse(inner)
    out: list[Any] = [env.reset(seed=seed)]
    reader = action_reader(env)
    assert reader is not None
    steps = 0
    for i in range(turns):
        text = MALFORMED[i] if i < len(MALFORMED) else inner.expert_action()
        action = reader(text) if preparsed else text
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        info = {k: v for k, v in info.items() if k not in ("elapsed_s", "step_s")}
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return out, inner.transcript, counter.calls, steps


@pytest.mark.parametrize("env_id", family_ids())
def test_preparsed_steps_equal_text_steps_with_one_parse_each(env_id: str) -> None:
    kwargs: dict[str, Any] = {"max_turns": 8} if env_id.startswith("toolgym/") else {}
    a, b = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs)
    try:
        for seed in (0, 1):
            text_run, text_transcript, _, _ = play(a, seed, preparsed=False)
            parsed_run, parsed_transcript, parses, steps = play(b, seed, preparsed=True)
            assert parsed_run == text_run
            assert parsed_transcript == text_transcript
            assert parses == steps  # read_action parsed each turn; step took it as it was
    finally:
        a.close()
        b.close()


def counter_env() -> tuple[Any, ToolEnv, CountingParse]:
    env = gym.make(COUNTER, target=3)
    env.reset(seed=0)
    return env, env.unwrapped, CountingParse(env.unwrapped)


CALL = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'


def test_a_stale_parse_is_read_again() -> None:
    """Call ids count on in an episode: a turn read before another step would carry an old id. Step
    renews the env's stamp, so the stale ParsedAction is parsed again from its raw text."""
    env, inner, counter = counter_env()
    stale = inner.read_action(CALL)
    env.step(inner.read_action(CALL))
    obs = env.step(stale)[0]
    assert counter.calls == 3  # read, read, and the stale one again
    assert obs[0]["tool_call_id"] == "call_1"  # not the stale call_0
    assert [m["tool_calls"][0]["id"] for m in inner.transcript if m.get("tool_calls")] == ["call_0", "call_1"]


def test_another_envs_or_formats_parse_is_read_again() -> None:
    env, inner, counter = counter_env()
    other = gym.make(COUNTER, target=3).unwrapped
    other.reset(seed=0)
    foreign = other.read_action(CALL)
    forged = ParsedAction(CALL, ParseResult(text=CALL, answer="3"), "hermes")  # no stamp: never trusted
    wrong_format = ParsedAction(
        CALL, ParseResult(text=CALL, answer="3"), "tags", inner.read_action(CALL).stamp
    )
    counter.calls = 0
    for action in (foreign, forged, wrong_format):
        _, _, terminated, _, info = env.step(action)
        assert not terminated and info["tool_calls"] == 1  # the text's call ran, not the forged answer
    assert counter.calls == 3
    assert inner.episode.value == 3


def test_set_state_and_reset_renew_the_stamp() -> None:
    env, inner, counter = counter_env()
    state = inner.get_state()
    read = inner.read_action(CALL)
    inner.set_state(state)
    env.step(read)
    assert counter.calls == 2
    read = inner.read_action("<answer>1</answer>")
    env.reset(seed=0)
    env.step(read)
    assert counter.calls == 4


def test_malformed_preparsed_turn_is_an_observation_and_a_penalty() -> None:
    env, inner, _ = counter_env()
    obs, reward, terminated, truncated, info = env.step(inner.read_action("<tool_call>{oops</tool_call>"))
    assert info["invalid_action"] and info["parse_error"] == "bad_json" and reward == inner.format_penalty
    assert (
        not (terminated or truncated) and obs[0]["role"] == "user" and "Invalid action" in obs[0]["content"]
    )


def test_no_reader_where_a_parsed_action_would_not_reach_the_base_step() -> None:
    class Upper(gym.ActionWrapper):  # type: ignore[type-arg]
        def action(self, action: Any) -> Any:
            return action.upper()

    assert action_reader(gym.make(COUNTER)) is not None
    assert action_reader(Upper(gym.make(COUNTER))) is None
    assert action_reader(gym.make("toolgym/Remote-v0")) is None  # a proxy: its server parses
