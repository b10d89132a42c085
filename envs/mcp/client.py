"""A connection to one MCP server, with the official ``mcp`` SDK, usable from synchronous env code.

The SDK is asyncio (anyio); an env's ``step`` is synchronous. Each ``MCPClient`` runs one event loop in a
daemon thread that owns the transport (``stdio``: the server as a child process; ``streamable HTTP``: a
URL) and the ``ClientSession``; ``call`` submits a coroutine to it and waits with a time limit.

Faults are sorted the way the env contract needs: a tool that reports an error (``is_error``) or a call the
server rejects (a JSON-RPC error such as invalid params) is the model's doing and comes back as text to show
it; a server that died, closed its connection or did not answer in time raises ``InfrastructureError`` (the
episode ends as ``env_error``, not scored as the model's failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import tempfile
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.optional import require

# JSON-RPC codes that mean the connection, not the request, failed
_TRANSPORT_CODES = {-32000, -32001}  # CONNECTION_CLOSED, REQUEST_TIMEOUT in the SDK


class ServerConfig(BaseModel):
    """One MCP server: a ``command`` to start over stdio, or the ``url`` of a streamable-HTTP endpoint."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(
        default=None, description="argv of a stdio server, e.g. ['mcp-server-time']"
    )
    url: str | None = Field(
        default=None, description="a streamable-HTTP endpoint, e.g. http://127.0.0.1:8000/mcp"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of a stdio server")
    cwd: str | None = None
    tools: list[str] | None = Field(default=None, description="keep only these of the server's tools")
    prefix: str = Field(
        default="", description="prepended to each tool's name (two servers with one tool name)"
    )
    call_timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError("command is empty")
        return self

    @property
    def label(self) -> str:
        return self.url or " ".join(self.command or [])


def server_configs(spec: Any) -> list[ServerConfig]:
    """``mcp=`` as given: a URL, a command line (a string or argv list), a dict of ``ServerConfig``
    fields, a ``ServerConfig``, or a list of these (one server each)."""
    if spec is None:
        return []
    if isinstance(spec, ServerConfig):
        return [spec]
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            return [ServerConfig(url=spec)]
        return [ServerConfig(command=shlex.split(spec))]
    if isinstance(spec, dict):
        try:
            return [ServerConfig(**spec)]
        except Exception as exc:
            raise ConfigError(f"bad MCP server config {spec!r}: {exc}") from exc
    if isinstance(spec, (list, tuple)):
        if _is_argv(spec):
            return [ServerConfig(command=list(spec))]
        return [c for item in spec for c in server_configs(item)]
    raise ConfigError(f"mcp= takes a URL, a command, a dict, or a list of these; got {type(spec).__name__}")


def _is_argv(spec: list[Any] | tuple[Any, ...]) -> bool:
    """``["python", "-m", "server"]``: one server's argv (words without spaces, not URLs), not a list of
    servers (each a command line or URL of its own)."""
    words = [x for x in spec if isinstance(x, str)]
    return (
        len(spec) > 1
        and len(words) == len(spec)
        and not any(" " in x or x.startswith(("http://", "https://")) for x in words)
    )


def _field(obj: Any, *names: str) -> Any:
    """A result field under its SDK 2 (snake_case) or SDK 1 (camelCase) name."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def result_text(result: Any) -> str:
    """A ``CallToolResult``'s content as text (text parts joined; other parts named)."""
    parts = []
    for item in _field(result, "content") or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        else:
            parts.append(f"[{kind} content]")
    if not parts:
        structured = _field(result, "structured_content", "structuredContent")
        if structured is not None:
            import json

            parts.append(json.dumps(structured))
    return "\n".join(parts)


def _describe(exc: BaseException) -> str:
    group = getattr(exc, "exceptions", None)  # an anyio task group's ExceptionGroup: say what is inside
    if isinstance(group, (list, tuple)) and group:
        return "; ".join(_describe(e) for e in group)
    return f"{type(exc).__name__}: {exc}"


class MCPClient:
    """One live connection; ``tools`` lists the server's tools (the SDK's ``Tool`` objects)."""

    def __init__(self, config: ServerConfig) -> None:
        require("mcp", why="MCP servers' tools are reached through its client")
        self.config = config
        self.tools: list[Any] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the server's stderr, kept for errors)
        self.closed = False
        ready = asyncio.run_coroutine_threadsafe(self._ready_future(), self._loop).result()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            self.tools = asyncio.run_coroutine_threadsafe(self._wait(ready), self._loop).result(
                config.connect_timeout_s
            )
        except FutureTimeout as exc:
            self.close()
            raise InfrastructureError(
                f"MCP server {config.label} did not answer within {config.connect_timeout_s:g} s"
            ) from exc
        except Exception as exc:
            self.close()
            raise InfrastructureError(
                f"could not connect to MCP server {config.label}: {self._why(exc)}"
            ) from exc

    async def _ready_future(self) -> asyncio.Future[list[Any]]:
        self._stop = asyncio.Event()
        return self._loop.create_future()

    async def _wait(self, ready: asyncio.Future[list[Any]]) -> list[Any]:
        return await ready

    def _transport(self) -> Any:
        cfg = self.config
        if cfg.url is not None:
            try:
                from mcp.client.streamable_http import streamable_http_client

                return streamable_http_client(cfg.url)
            except ImportError:  # SDK 1
                from mcp.client.streamable_http import streamablehttp_client  # type: ignore[attr-defined]

                return streamablehttp_client(cfg.url)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert cfg.command is not None
        params = StdioServerParameters(
            command=cfg.command[0], args=cfg.command[1:], env={**os.environ, **cfg.env}, cwd=cfg.cwd
        )
        return stdio_client(params, errlog=self._stderr)

    async def _serve(self, ready: asyncio.Future[list[Any]]) -> None:
        from mcp import ClientSession

        assert self._stop is not None
        try:
            async with self._transport() as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                listed = await session.list_tools()
                self._session = session
                ready.set_result(list(listed.tools))
                await self._stop.wait()
        except BaseException as exc:  # the connection is gone: every later call is an infrastructure fault
            self._failure = exc
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        finally:
            self._session = None

    def _why(self, exc: BaseException) -> str:
        text = _describe(exc)
        with contextlib.suppress(Exception):
            self._stderr.seek(0)
            tail = self._stderr.read()[-500:].strip()
            if tail:
                text += f" (server stderr: {tail})"
        return text

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Calls one tool; (its text, whether it is an error the model should see)."""
        if self.closed:
            raise InfrastructureError(f"the connection to MCP server {self.config.label} is closed")
        session = self._session
        if session is None or self._main.done():
            why = self._why(self._failure) if self._failure else "it stopped"
            raise InfrastructureError(f"MCP server {self.config.label} is gone: {why}")
        future = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), self._loop)
        try:
            result = future.result(self.config.call_timeout_s)
        except FutureTimeout as exc:
            future.cancel()
            raise InfrastructureError(
                f"MCP server {self.config.label} did not answer {name} within {self.config.call_timeout_s:g} s"
            ) from exc
        except Exception as exc:
            code = getattr(exc, "code", None)
            if isinstance(code, int) and code not in _TRANSPORT_CODES and not self._main.done():
                return f"Error: {getattr(exc, 'message', exc)}", True  # the server rejected the call
            raise InfrastructureError(f"MCP server {self.config.label} failed: {self._why(exc)}") from exc
        return result_text(result), bool(_field(result, "is_error", "isError"))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        with contextlib.suppress(Exception):
            self._main.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self._stderr.close()
