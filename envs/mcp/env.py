"""toolgym/MCP-v0: shopping questions answered with the tools of an MCP server."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from typing import Any, ClassVar

from toolgym.envs.base import Task, ToolEnv
from toolgym.envs.mcp import expert, tasks
from toolgym.envs.mcp.attach import mcp_tools
from toolgym.envs.mcp.client import MCPClient, ServerConfig
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.rewards.numeric import numeric_match
from toolgym.tools import Tool

SHOP = [sys.executable, "-m", "toolgym.envs.mcp.shop"]


def answer(answer: str) -> str:
    """Give the final answer and end the episode.

    Args:
        answer: the final answer (a number, a product name, or yes/no).
    """
    return answer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http_shop(timeout_s: float = 60.0) -> tuple[subprocess.Popen[bytes], str]:
    """The shop server over streamable HTTP on a free local port: the process and its endpoint URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [*SHOP, "--http", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise InfrastructureError(f"the shop MCP server exited at start (code {proc.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc, f"http://127.0.0.1:{port}/mcp"
        time.sleep(0.1)
    proc.kill()
    raise InfrastructureError(f"the shop MCP server did not listen on port {port} within {timeout_s:g} s")


class MCPEnv(ToolEnv):
    """Shopping questions answered with the tools of an MCP server (the shop, over stdio or HTTP).

    ## Description
    Each episode is one question about a small shop (the total of a basket, the cheapest of three products,
    whether the stock covers an order, how many products of a category are under a price). The facts are
    behind the tools of an MCP server, reached with the official ``mcp`` SDK: ``search_products``,
    ``get_price``, ``get_stock`` (``envs/mcp/shop.py``, written with the SDK's ``MCPServer``).

    ## Action Space
    Text (or an assistant message with ``tool_calls``). Hermes format by default:
    ``<tool_call>{"name": "get_price", "arguments": {"product": "apple"}}</tool_call>`` (several calls per
    turn allowed); the final answer is ``<answer>…</answer>`` or the ``answer`` tool.

    ## Observation Space
    ``Messages``: on reset the system prompt and the question; ``info["tools"]`` holds the server's tool
    schemas as it lists them. Each step returns the tools' results (``"Error: …"`` for a tool error).

    ## Tools
    The server's tools, as listed by ``tools/list`` (schemas kept as the server gives them), and ``answer``.

    ## Rewards
    ``correct``: 1.0 for the right answer (numbers compared as numbers, names and yes/no case-insensitively).
    ``format``: ``format_penalty`` (default -0.1) on each invalid action.

    ## Starting State
    A question drawn with ``np_random`` from ``kinds``.

    ## Episode End
    Terminated by an answer. Truncated after ``max_turns`` (``turn_limit``), by ``token_budget`` /
    ``time_limit_s``, or when the server dies or stops answering (``env_error``: not the model's failure).

    ## Arguments
    ``server`` ("stdio": the shop as a child process; "http": the shop on a local port over streamable
    HTTP; or the URL of a shop server already running), ``kinds`` (total, cheapest, stock, category),
    ``max_turns`` (6), ``call_timeout_s`` (30). Any env also takes ``mcp=`` to add other MCP servers' tools.

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "mcp"
    expert_success_rate: ClassVar[float] = 1.0
    supports_fork: ClassVar[bool] = False  # the server is outside: its state is not forked
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")

    def __init__(
        self,
        *,
        server: str = "stdio",
        kinds: tuple[str, ...] | list[str] = tasks.KINDS,
        max_turns: int = 6,
        call_timeout_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kinds) - set(tasks.KINDS))
        if unknown or not kinds:
            raise ConfigError(f"kinds must be a non-empty subset of {tasks.KINDS}, got {list(kinds)}")
        self.kinds = tuple(kinds)
        self.server = server
        self._process: subprocess.Popen[bytes] | None = None
        if server == "stdio":
            config = ServerConfig(command=SHOP, call_timeout_s=call_timeout_s)
        elif server == "http":
            self._process, url = start_http_shop()
            config = ServerConfig(url=url, call_timeout_s=call_timeout_s)
        elif server.startswith(("http://", "https://")):
            config = ServerConfig(url=server, call_timeout_s=call_timeout_s)
        else:
            raise ConfigError(f"server must be 'stdio', 'http' or a URL, got {server!r}")
        try:
            self.client = MCPClient(config)
        except Exception:
            self._stop_process()
            raise
        self._config = config
        super().__init__(max_turns=max_turns, **kwargs)

    def tools(self) -> list[Tool]:
        return [*mcp_tools(self.client, self._config), Tool(answer)]

    def instructions(self) -> str:
        return (
            "You answer questions about a shop. Its facts are only available through the tools: look them up, "
            "then give the final answer."
        )

    def make_task(self) -> Task:
        return tasks.make_task(self.np_random, self.kinds)

    def check_answer(self, answer: str) -> dict[str, float]:
        truth = str(self.task.answer)
        if self.task.data["kind"] in ("total", "category"):
            score = numeric_match([answer.replace("$", "")], answer=[truth])[0] or 0.0
        else:
            score = float(answer.strip().strip(".").lower() == truth.lower())
        return {"correct": float(score)}

    def expert_action(self) -> str:
        """The task's plan, one turn of calls at a time, then the answer."""
        return expert.expert_action(self.task, self._transcript)

    def _stop_process(self) -> None:
        if self._process is not None:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(10)
            if self._process.poll() is None:
                self._process.kill()
            self._process = None

    def close(self) -> None:
        self.client.close()
        self._stop_process()
        super().close()
