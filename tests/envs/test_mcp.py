"""MCP tools through the official SDK, against real servers: our shop (the SDK's MCPServer) over stdio and
streamable HTTP, a throwaway server that can crash, and mcp-server-time from PyPI."""

import json
import shutil
import sys
import textwrap

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.envs.mcp.attach import MCPTools
from toolgym.envs.mcp.client import ServerConfig, server_configs
from toolgym.errors import ConfigError, InfrastructureError

pytest.importorskip("mcp")
TIME_SERVER = shutil.which("mcp-server-time")


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play_expert(env, seed):
    env.reset(seed=seed)
    inner = env.unwrapped
    for _ in range(inner.max_turns):
        _, reward, term, trunc, info = env.step(inner.expert_action())
        if term or trunc:
            return reward, info
    raise AssertionError("no answer")


@pytest.mark.parametrize("server", ["stdio", "http"])
def test_mcp_v0_expert_over_both_transports(server):
    env = gym.make("toolgym/MCP-v0", server=server)
    try:
        _, info = env.reset(seed=0)
        names = [t["function"]["name"] for t in info["tools"]]
        assert names == ["search_products", "get_price", "get_stock", "answer"]
        price = info["tools"][1]["function"]["parameters"]
        assert price["properties"]["product"]["type"] == "string" and price["required"] == ["product"]
        results = [play_expert(env, seed) for seed in range(8)]
        assert all(reward == 1.0 and info["success"] for reward, info in results)
    finally:
        env.close()


def test_tool_errors_are_feedback_and_answers_are_checked():
    env = gym.make("toolgym/MCP-v0", kinds=["total"])
    try:
        env.reset(seed=3)
        obs, reward, term, trunc, info = env.step(call("get_price", product="caviar"))
        assert not (term or trunc) and not info["invalid_action"]
        assert obs[0]["content"].startswith("Error") and "no product named 'caviar'" in obs[0]["content"]
        obs, *_ = env.step(call("get_price", product="apple") + call("get_stock", product="apple"))
        assert [m["content"] for m in obs] == ["0.45", "120"]
        # the schema comes from the server: a missing argument is caught before the call, as a format error
        _, reward, _, _, info = env.step(call("get_price"))
        assert info["invalid_action"] and reward == -0.1
        _, reward, term, _, info = env.step("<answer>1.00</answer>")
        assert term and reward == 0.0 and info["success"] is False
    finally:
        env.close()


CRASHY = textwrap.dedent(
    """
    import os
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("crashy")

    @server.tool()
    def echo(text: str) -> str:
        \"\"\"Return the text.\"\"\"
        return text

    @server.tool()
    def die() -> str:
        \"\"\"Kill the server.\"\"\"
        os._exit(3)

    server.run("stdio")
    """
)


def test_dead_server_is_env_error(tmp_path):
    script = tmp_path / "crashy.py"
    script.write_text(CRASHY)
    env = gym.make("toolgym/Calculator-v0", mcp=[sys.executable, str(script)], max_turns=6)
    try:
        _, info = env.reset(seed=0)
        assert {"echo", "die"} <= {t["function"]["name"] for t in info["tools"]}
        obs, *_ = env.step(call("echo", text="hi"))
        assert obs[0]["content"] == "hi"
        obs, reward, term, trunc, info = env.step(call("die"))
        assert trunc and not term and info["truncation"] == "env_error" and reward == 0.0
        assert "crashy" in info["infra_error"]
        env.reset(seed=1)  # the env's own tools still work; the dead server's tools keep failing cleanly
        _, _, _, trunc, info = env.step(call("echo", text="again"))
        assert trunc and info["truncation"] == "env_error"
    finally:
        env.close()


def test_http_server_killed_mid_episode_is_env_error():
    env = gym.make("toolgym/MCP-v0", server="http", call_timeout_s=5)
    try:
        env.reset(seed=0)
        env.unwrapped._process.kill()
        env.unwrapped._process.wait()
        _, _, term, trunc, info = env.step(call("get_stock", product="milk"))
        assert trunc and not term and info["truncation"] == "env_error"
    finally:
        env.close()


@pytest.mark.skipif(TIME_SERVER is None, reason="mcp-server-time (PyPI) is not installed")
def test_pypi_server_tools_join_any_env():
    env = gym.make(
        "toolgym/Calculator-v0", mcp={"command": [TIME_SERVER], "prefix": "time_", "tools": ["convert_time"]}
    )
    try:
        _, info = env.reset(seed=0)
        names = [t["function"]["name"] for t in info["tools"]]
        assert names == ["calculator", "answer", "time_convert_time"]
        schema = info["tools"][2]["function"]["parameters"]
        assert {"source_timezone", "time", "target_timezone"} <= set(schema["properties"])
        obs, *_ = env.step(
            call("time_convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
        )
        assert '"time_difference": "+9.0h"' in obs[0]["content"]
        obs, _, _, trunc, _ = env.step(
            call("time_convert_time", source_timezone="Mars/Base", time="12:00", target_timezone="UTC")
        )
        assert obs[0]["content"].startswith("Error") and "Mars/Base" in obs[0]["content"] and not trunc
        # the calculator still works and the expert still wins
        assert play_expert(env, 5)[0] == 1.0
    finally:
        env.close()


@pytest.mark.skipif(TIME_SERVER is None, reason="mcp-server-time (PyPI) is not installed")
def test_wrapper_and_text_prompt_list_the_tools():
    env = MCPTools(gym.make("toolgym/Calculator-v0", prompt_format="text"), TIME_SERVER)
    try:
        obs, _ = env.reset(seed=0)
        assert "convert_time" in obs[0]["content"] and "get_current_time" in obs[0]["content"]
    finally:
        env.close()
    assert all(c.closed for c in env.attached.clients)


def test_server_configs_and_errors():
    assert server_configs("http://h:1/mcp")[0].url == "http://h:1/mcp"
    assert server_configs("python -m x")[0].command == ["python", "-m", "x"]
    assert server_configs(["python", "-m", "x"])[0].command == ["python", "-m", "x"]
    assert len(server_configs(["python -m a", "http://h/mcp"])) == 2
    with pytest.raises(ConfigError):
        server_configs({"command": ["x"], "url": "http://h"})
    with pytest.raises(ValueError):
        ServerConfig()


def test_name_clash_needs_a_prefix(tmp_path):
    script = tmp_path / "calc.py"
    script.write_text(
        "from mcp.server.mcpserver import MCPServer\ns = MCPServer('c')\n\n@s.tool()\n"
        "def calculator(expression: str) -> str:\n    '''Evaluate.'''\n    return '0'\n\ns.run('stdio')\n"
    )
    with pytest.raises(ConfigError, match="clashes"):
        gym.make("toolgym/Calculator-v0", mcp=[sys.executable, str(script)])
    env = gym.make(
        "toolgym/Calculator-v0", mcp={"command": [sys.executable, str(script)], "prefix": "remote_"}
    )
    env.close()
    # a server that exits at start: no answer to initialize (the SDK waits), an InfrastructureError here
    dead = {"command": [sys.executable, "-c", "raise SystemExit(2)"], "connect_timeout_s": 3}
    with pytest.raises(InfrastructureError, match="MCP server"):
        gym.make("toolgym/Calculator-v0", mcp=dead)
