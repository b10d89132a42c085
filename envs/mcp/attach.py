"""Any MCP server's tools as tools of any toolgym env: ``gym.make(id, mcp=...)`` or ``MCPTools(env, ...)``.

``mcp=`` takes what ``client.server_configs`` reads: a URL (streamable HTTP), a command line (stdio), a
dict of ``ServerConfig`` fields (``tools`` to keep a subset, ``prefix`` to rename), or a list of servers.
Each server's tools join the env's own: their JSON schemas go to ``info["tools"]`` on reset (and to the
text prompt format's tool list), the parser accepts calls of them, and a call runs on the server. A tool
that reports an error is feedback (``"Error: …"``); a server that dies or stops answering ends the episode
as ``truncation="env_error"``. The connections close with ``MCPTools.close()``, the env's ``close()`` for
MCP-v0, or when the env is garbage-collected or the process exits.
"""

from __future__ import annotations

import weakref
from typing import Any

import gymnasium as gym

from toolgym.envs.mcp.client import MCPClient, ServerConfig, server_configs
from toolgym.errors import ConfigError
from toolgym.tools import Tool, ToolSpec


def _schema(tool: Any) -> dict[str, Any]:
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}
    schema = {k: v for k, v in dict(schema).items() if k != "title"}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


class _Call:
    """A tool's function: one call on the server. Errors the server reports are returned as text."""

    def __init__(self, client: MCPClient, name: str) -> None:
        self.client, self.name = client, name

    def __call__(self, **arguments: Any) -> str:
        text, is_error = self.client.call(self.name, arguments)
        if is_error and not text.startswith("Error"):
            text = f"Error: {text}"
        return text


def mcp_tools(client: MCPClient, config: ServerConfig) -> list[Tool]:
    """The server's tools (those named in ``config.tools``, or all) as ``Tool`` objects."""
    names = [t.name for t in client.tools]
    if config.tools is not None:
        missing = sorted(set(config.tools) - set(names))
        if missing:
            raise ConfigError(f"MCP server {config.label} has no tool(s) {missing}; it has {names}")
    out = []
    for listed in client.tools:
        if config.tools is not None and listed.name not in config.tools:
            continue
        tool = Tool(_Call(client, listed.name).__call__, name=config.prefix + listed.name)
        tool.spec = ToolSpec(
            name=config.prefix + listed.name,
            description=(listed.description or "").strip(),
            parameters=_schema(listed),
        )
        out.append(tool)
    return out


def _close_all(clients: list[MCPClient]) -> None:
    for client in clients:
        client.close()


class Attached:
    """The MCP connections an env holds; ``close()`` ends them."""

    def __init__(self, clients: list[MCPClient]) -> None:
        self.clients = clients

    def close(self) -> None:
        _close_all(self.clients)


def attach_mcp(env: Any, spec: Any) -> Attached:
    """Connects to each server of ``spec`` and adds its tools to ``env`` (a ``ToolEnv``). A tool name the
    env already has is a ConfigError (use the server's ``prefix``)."""
    configs = server_configs(spec)
    clients: list[MCPClient] = []
    try:
        tools: list[Tool] = []
        for config in configs:
            clients.append(MCPClient(config))
            tools += mcp_tools(clients[-1], config)
        taken = set(env._tools)
        for tool in tools:
            if tool.name in taken:
                raise ConfigError(
                    f"MCP tool {tool.name!r} clashes with a tool of the env: give its server a prefix"
                )
            taken.add(tool.name)
    except Exception:
        _close_all(clients)
        raise
    for tool in tools:
        env._tools[tool.name] = tool
    env._specs = [t.spec for t in env._tools.values()]
    env._tool_dicts = [s.to_dict() for s in env._specs]
    attached = Attached(clients)
    weakref.finalize(env, _close_all, clients)
    return attached


class MCPTools(gym.Wrapper[Any, Any, Any, Any]):
    """A wrapper that adds MCP servers' tools to the toolgym env inside it; ``close()`` ends the connections.

    >>> # env = MCPTools(gym.make("toolgym/Calculator-v0"), "mcp-server-time")
    """

    def __init__(self, env: gym.Env[Any, Any], servers: Any) -> None:
        super().__init__(env)
        from toolgym.envs.base import tool_env

        self.attached = attach_mcp(tool_env(env), servers)

    def close(self) -> None:
        self.attached.close()
        super().close()
