"""``toolgym/Remote-v0`` against ``toolgym serve-env`` (a real process, killed mid-episode) and against a server
built with openenv-core's own ``create_app``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")

import toolgym  # noqa: F401
from tests.processes import start, stop
from toolgym.envs.calculator.env import CalculatorEnv
from toolgym.errors import InfrastructureError
from toolgym.serving.base import AppServer
from toolgym.serving.env_server import EnvServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m toolgym serve-env toolgym/Calculator-v0 --expert`` on a free port."""
    port = free_port()
    log = open(tmp_path / "serve-env.log", "wb")  # noqa: SIM115 - read back on failure
    cmd = [sys.executable, "-m", "toolgym", "serve-env", "toolgym/Calculator-v0", "--port", str(port)]
    proc = start([*cmd, "--expert"], stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # imports are slow on a loaded machine
        while True:
            assert proc.poll() is None, (tmp_path / "serve-env.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve-env.log").read_text()
            time.sleep(0.3)
        yield proc, url
    finally:
        stop(proc)
        log.close()


def test_the_expert_succeeds_through_serve_env_and_a_dead_server_is_an_env_error(
    served: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, url = served
    env = gym.make("toolgym/Remote-v0", url=url.replace("http://", "ws://"), retries=1, retry_backoff_s=0.1)
    inner: Any = env.unwrapped
    local = gym.make("toolgym/Calculator-v0")
    try:
        obs, info = env.reset(seed=5)
        local_obs, local_info = local.reset(seed=5)
        assert obs == local_obs and info["task_id"] == local_info["task_id"]
        assert [s.name for s in inner.tool_specs] == ["calculator", "answer"]
        assert inner.max_turns == CalculatorEnv().max_turns and inner.expert_success_rate == 1.0  # /metadata
        total, steps = 0.0, 0
        while True:
            obs, reward, term, trunc, info = env.step(inner.expert_action())
            total, steps = total + reward, steps + 1
            if term or trunc:
                break
        assert term and not trunc and info["success"] is True and total == 1.0
        assert inner.transcript[-1]["role"] == "assistant" and len(inner.transcript) == 2 + 2 * steps - 1
        assert inner.server_state()["step_count"] == steps

        env.reset(seed=6)
        env.step(inner.expert_action())  # the calculator call
        proc.kill()
        proc.wait(timeout=30)
        obs, reward, term, trunc, info = env.step("<answer>42</answer>")
        assert (obs, reward, term, trunc) == ([], 0.0, False, True)
        assert info["truncation"] == "env_error" and info["success"] is False
        assert "Remote-v0" in info["infra_error"]
        t0 = time.monotonic()
        with pytest.raises(InfrastructureError, match="did not answer reset after 2 tries"):
            env.reset(seed=7)
        assert time.monotonic() - t0 < 30
    finally:
        env.close()
        local.close()


class _SlowCalculator(CalculatorEnv):
    """Calculator-v0 whose tool takes 3 s: longer than the client's read timeout."""

    def run_tool(self, call: Any) -> str:
        time.sleep(3)
        return super().run_tool(call)


def test_a_reply_past_the_read_timeout_is_an_env_error() -> None:
    gym.register("toolgym-test/SlowCalculator-v0", entry_point=_SlowCalculator, disable_env_checker=True)
    try:
        with EnvServer("toolgym-test/SlowCalculator-v0", port=0) as server:
            env = gym.make("toolgym/Remote-v0", url=server.url, read_timeout_s=0.5)
            try:
                env.reset(seed=1)
                call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
                _, reward, term, trunc, info = env.step(call)
                assert (reward, term, trunc, info["truncation"]) == (0.0, False, True, "env_error")
                assert "no reply within 0.5 s" in info["infra_error"]
                env.reset(seed=2)  # a fresh connection: the next episode starts normally
                assert env.step("<answer>1</answer>")[2] is True
            finally:
                env.close()
    finally:
        gym.registry.pop("toolgym-test/SlowCalculator-v0", None)


def test_remote_drives_a_server_built_with_openenv_core() -> None:
    """Any OpenEnv server: its observation becomes a user message, its reward and done pass through."""
    core = pytest.importorskip("openenv.core.env_server")
    from pydantic import Field

    class GuessAction(core.Action):
        message: str = Field(description="a digit")

    class GuessObservation(core.Observation):
        text: str

    class GuessEnv(core.Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            self.target, self.steps = (seed or 0) % 10, 0
            return GuessObservation(text="Guess my digit (0-9).")

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            self.steps += 1
            right = action.message.strip() == str(self.target)
            return GuessObservation(text="right" if right else "wrong", reward=float(right), done=right)

        @property
        def state(self) -> Any:
            return core.State(step_count=self.steps)

    app = core.create_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=4)
    with AppServer(app, port=0) as server:
        env = gym.make("toolgym/Remote-v0", url=server.url)
        try:
            obs, info = env.reset(seed=13)
            assert obs == [{"role": "user", "content": "Guess my digit (0-9)."}]
            assert info["openenv_observation"] == {"text": "Guess my digit (0-9)."}
            assert env.step("5")[:4] == ([{"role": "user", "content": "wrong"}], 0.0, False, False)
            obs, reward, term, trunc, info = env.step("3")
            assert (reward, term, trunc) == (1.0, True, False) and info["episode_reward"] == 1.0
            assert info["success"] is True  # the server sends no success: a positive final reward is one
            env.reset(seed=13)
            *_, info = env.step("3")
            assert info["success"] is True
        finally:
            env.close()
        # a higher bar, or a game that ends without a win, is not a success
        env = gym.make("toolgym/Remote-v0", url=server.url, success_reward=1.0)
        try:
            env.reset(seed=13)
            assert env.step("3")[-1]["success"] is False
        finally:
            env.close()


def test_loopback_needs_no_server_and_settings_belong_to_the_server() -> None:
    env = gym.make("toolgym/Remote-v0", serve="toolgym/CalculatorChain-v0")
    inner: Any = env.unwrapped
    try:
        env.reset(seed=0)
        for _ in range(inner.max_turns):
            *_, term, trunc, info = env.step(inner.expert_action())
            if term or trunc:
                break
        assert info["success"] is True
        with pytest.raises(Exception, match="cannot fork"):
            inner.get_state()
    finally:
        env.close()
    with pytest.raises(Exception, match="belong to the server"):
        gym.make("toolgym/Remote-v0", max_turns=3)
