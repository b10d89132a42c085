"""The ``openai`` backend: any OpenAI-compatible chat-completions server (vLLM, SGLang, ``toolgym serve``).

Requests go out concurrently (httpx, async; at most ``concurrency`` in flight). Tools are sent when the
conversation has them; logprobs are asked for and kept when the server returns them (token ids too, from
``toolgym serve``'s ``token_ids`` field or vLLM's ``token_id:N`` tokens). 429 and 5xx answers and transport
errors are retried with exponential backoff (``Retry-After`` honoured) up to ``max_retries`` times.

Errors: a wrong URL, key or model (401/403/404) raises ``ConfigError`` at once; a request that still fails
after its retries (or a 400 such as a too-long context) comes back as a turn with
``finish_reason="error"``, so the runner ends that episode as an infrastructure failure and goes on.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolgym.agents.policy import (
    AssistantTurn,
    Conversation,
    FinishReason,
    SamplingParams,
    ToolDicts,
    broadcast_tools,
    parse_turn,
)
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.messages import Message, ToolCall

if TYPE_CHECKING:
    import httpx

    from toolgym.envs.base import ToolEnv

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class BackendError(InfrastructureError):
    """The server failed (after retries): not the model's failure."""


class OpenAIPolicy:
    """Chat completions over HTTP behind the ``Policy`` protocol."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        concurrency: int = 16,
        sampling: SamplingParams | None = None,
        logprobs: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the server URL must start with http:// or https://, got {base_url!r}")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.sampling = sampling or SamplingParams()
        self.logprobs = logprobs
        self.extra_body = extra_body or {}
        self.name = f"openai:{self.base_url}" + (f"@{model}" if model else "")

    # ----- Policy ------------------------------------------------------------------------------------------
    def act(
        self,
        conversations: Sequence[Conversation],
        tools: Sequence[ToolDicts | None] | None = None,
        *,
        sampling: SamplingParams | None = None,
        envs: Sequence[ToolEnv | None] | None = None,
    ) -> list[AssistantTurn]:
        coro_args = (
            list(conversations),
            broadcast_tools(tools, len(conversations)),
            sampling or self.sampling,
        )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.aact(*coro_args))
        box: dict[str, Any] = {}  # called from inside an event loop: run ours in a thread

        def target() -> None:
            try:
                box["out"] = asyncio.run(self.aact(*coro_args))
            except BaseException as exc:
                box["err"] = exc

        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
        if "err" in box:
            raise box["err"]
        return list(box["out"])

    async def aact(
        self, conversations: list[Conversation], tools: list[ToolDicts | None], sampling: SamplingParams
    ) -> list[AssistantTurn]:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers, limits=limits) as client:
            if self.model is None:
                self.model = await self._first_model(client)
            gate = asyncio.Semaphore(self.concurrency)

            async def one(conv: Conversation, tl: ToolDicts | None) -> AssistantTurn:
                async with gate:
                    try:
                        data = await self._post(client, self._body(conv, tl, sampling))
                    except BackendError as exc:
                        return AssistantTurn(
                            text=str(exc),
                            message=Message(role="assistant", content=""),
                            finish_reason="error",
                        )
                    return self._turn(data, tl)

            return list(await asyncio.gather(*(one(c, t) for c, t in zip(conversations, tools, strict=True))))

    # ----- HTTP --------------------------------------------------------------------------------------------
    def _body(self, conv: Conversation, tools: ToolDicts | None, sp: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": conv,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_tokens": sp.max_new_tokens,
        }
        if tools:
            body["tools"] = tools
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.seed is not None:
            body["seed"] = sp.seed
        if self.logprobs:
            body["logprobs"] = True
        body.update(self.extra_body)
        return body

    async def _first_model(self, client: httpx.AsyncClient) -> str:
        data = await self._request(client, "GET", "/models", None)
        models = data.get("data") or []
        if not models:
            raise ConfigError(f"{self.base_url}/models lists no model: pass one as openai:URL@MODEL")
        return str(models[0]["id"])

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request(client, "POST", "/chat/completions", body)

    async def _request(
        self, client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        import httpx

        url = self.base_url + path
        last = ""
        for attempt in range(self.max_retries + 1):
            wait = self.backoff_s * (2**attempt) * (0.5 + random.random())
            try:
                resp = await client.request(method, url, json=body)
            except httpx.TransportError as exc:  # connection refused, timeouts, resets
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    try:
                        return dict(resp.json())
                    except json.JSONDecodeError:
                        last = f"the server answered 200 with non-JSON: {resp.text[:200]!r}"
                elif resp.status_code in (401, 403):
                    raise ConfigError(f"{url} refused the key ({resp.status_code}): set OPENAI_API_KEY")
                elif resp.status_code == 404:
                    raise ConfigError(
                        f"{url} answered 404 ({resp.text[:200]}): check the URL (…/v1) and the model name"
                    )
                elif resp.status_code in RETRY_STATUS:
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    retry_after = resp.headers.get("retry-after")
                    if retry_after and retry_after.replace(".", "", 1).isdigit():
                        wait = min(float(retry_after), 60.0)
                else:
                    raise BackendError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
            if attempt < self.max_retries:
                await asyncio.sleep(wait)
        raise BackendError(f"{url} failed after {self.max_retries + 1} attempts: {last}")

    # ----- parsing -----------------------------------------------------------------------------------------
    def _turn(self, data: dict[str, Any], tools: ToolDicts | None) -> AssistantTurn:
        try:
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (KeyError, IndexError, TypeError):
            return AssistantTurn(
                text=f"malformed response: {str(data)[:300]}",
                message=Message(role="assistant", content=""),
                finish_reason="error",
            )
        content = msg.get("content") or ""
        calls = msg.get("tool_calls") or []
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        logprobs, token_ids = _logprobs(choice)
        if calls:
            try:
                tool_calls = tuple(ToolCall.from_dict(c) for c in calls)
            except (ValueError, KeyError, TypeError):
                tool_calls = ()
            if tool_calls:
                message = Message(role="assistant", content=content, tool_calls=tool_calls)
                return AssistantTurn(
                    text=content,
                    message=message,
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=finish,
                    structured=True,
                    usage=data.get("usage") or {},
                )
        return AssistantTurn(
            text=content,
            message=parse_turn(content, tools),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            usage=data.get("usage") or {},
        )


def _logprobs(choice: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Per-token logprobs, and token ids when the server gives them (else empty)."""
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(c.get("logprob", 0.0)) for c in content]
    ids = choice.get("token_ids")
    if isinstance(ids, list) and len(ids) == len(logprobs):
        return logprobs, [int(i) for i in ids]
    tokens = [str(c.get("token", "")) for c in content]
    if tokens and all(t.startswith("token_id:") for t in tokens):
        return logprobs, [int(t.split(":", 1)[1]) for t in tokens]
    return logprobs, []
