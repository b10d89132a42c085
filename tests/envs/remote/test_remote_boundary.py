"""What Remote-v0 sends to another framework's env server (openenv-core's own ``create_app``, real WebSocket):
lone surrogates never reach it, a refused content is the model's invalid action, a refused message goes as text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import gymnasium as gym
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")
core = pytest.importorskip("openenv.core.env_server")

import toolgym  # noqa: E402, F401
from toolgym.errors import ConfigError  # noqa: E402
from toolgym.messages import Message, ToolCall  # noqa: E402
from toolgym.serving.base import AppServer  # noqa: E402


class EchoAction(core.Action):
    message: str


class MoveAction(core.Action):
    message: Literal["left", "right"]


class TextObservation(core.Observation):
    text: str


class EchoEnv(core.Environment):
    """Echoes each action back; a move of "right" ends the episode with reward 1."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        self.steps = 0
        return TextObservation(text="Say something.")

    def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
        self.steps += 1
        done = action.message == "right"
        return TextObservation(text=f"you said {action.message}", reward=float(done), done=done)

    @property
    def state(self) -> Any:
        return core.State(step_count=self.steps)


def serve(action: type) -> Any:
    return AppServer(core.create_app(EchoEnv, action, TextObservation, max_concurrent_envs=4), port=0)


@pytest.fixture
def echo() -> Iterator[Any]:
    with serve(EchoAction) as server:
        env = gym.make("toolgym/Remote-v0", url=server.url, read_timeout_s=10)
        try:
            env.reset(seed=0)
            yield env
        finally:
            env.close()


def test_lone_surrogates_are_replaced_before_they_leave(echo: Any) -> None:
    obs, _, _, trunc, info = echo.step("ok \ud800 x")  # the server failed to write it back: env_error
    assert (obs, trunc, "truncation" in info) == (
        [{"role": "user", "content": "you said ok \ufffd x"}],
        False,
        False,
    )
    assert echo.unwrapped.transcript[-2]["content"] == "ok \ufffd x"


def test_a_message_the_server_takes_only_as_text_is_sent_as_its_text(echo: Any) -> None:
    call = ToolCall(id="c0", name="move", arguments={"to": "left\udc00"})
    obs, *_, info = echo.step(Message(role="assistant", content="Moving.", tool_calls=(call,)))
    text = 'Moving.\n<tool_call>{"name": "move", "arguments": {"to": "left\\ufffd"}}</tool_call>'
    assert obs == [{"role": "user", "content": f"you said {text}"}] and not info["invalid_action"]
    assert echo.step({"role": "assistant", "content": "again"})[0][0]["content"] == "you said again"


def test_a_refused_content_is_an_invalid_action_and_the_episode_goes_on() -> None:
    with serve(MoveAction) as server:
        env = gym.make("toolgym/Remote-v0", url=server.url, format_penalty=-0.5)
        inner: Any = env.unwrapped
        try:
            env.reset(seed=0)
            obs, reward, term, trunc, info = env.step("up")
            assert (reward, term, trunc, info["invalid_action"]) == (-0.5, False, False, True)
            assert "Input should be 'left' or 'right'" in obs[0]["content"]
            assert env.step("left")[0] == [{"role": "user", "content": "you said left"}]
            *_, term, trunc, info = env.step("right")
            assert term and info["success"] is True and info["episode_reward"] == 0.5
            env.reset(seed=1)
            for _ in range(inner.max_turns - 1):
                assert env.step("down")[3] is False
            *_, trunc, info = env.step("down")  # refusals in a row end it: the server never saw a step
            assert trunc and info["truncation"] == "turn_limit" and info["success"] is False
        finally:
            env.close()


def test_a_refused_shape_is_still_a_setting_to_fix() -> None:
    with serve(EchoAction) as server:
        env = gym.make("toolgym/Remote-v0", url=server.url, action_key="msg")
        try:
            env.reset(seed=0)
            with pytest.raises(ConfigError, match="check action_key"):
                env.step("hello")
        finally:
            env.close()


def test_the_loopback_takes_surrogates_from_a_models_call() -> None:
    env = gym.make("toolgym/Remote-v0")
    try:
        env.reset(seed=0)
        call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+\ud800"}}</tool_call>'
        obs, _, _, trunc, _ = env.step(call)
        assert not trunc and obs and obs[0]["role"] == "tool"
    finally:
        env.close()
