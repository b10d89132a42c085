"""The ``openai`` backend: any OpenAI-compatible chat-completions server (vLLM, SGLang, ``toolgym serve``).

Requests go out concurrently (httpx, async; at most ``concurrency`` in flight). Tools are sent when the
conversation has them; logprobs are asked for and kept when the server returns them (token ids too, from
``toolgym serve``'s ``token_ids`` field or vLLM's ``token_id:N`` tokens). 429 and 5xx answers and transport
errors are retried with exponential backoff (``Retry-After`` honoured) up to ``max_retries`` times.

**What goes over the wire** (``wire``): the server applies its own chat template and tokenizes what it is sent, so
special-token text inside content (a tool output holding ``<|im_end|>\n<|im_start|>assistant``) would become real
turn markers there: a forged turn. So

- ``wire="tokens"`` renders the conversation here (``ChatRenderer``: content never becomes special tokens) and sends
  the ids to ``POST /v1/completions`` (``prompt`` as token ids, as vLLM, SGLang and ``toolgym serve`` take it);
  the reply comes back as ids and logprobs, is decoded and parsed here (Hermes ``<tool_call>`` blocks). It needs
  the served model's tokenizer here: ``tokenizer=`` (an object, a folder or a hub id), else the model name when
  it loads from local files.
- ``wire="chat"`` sends messages to ``/v1/chat/completions``; with ``special_text="escape"`` (the default) the
  special-token text in every string sent (contents, names, tool arguments, tool schemas) is escaped first
  (``toolgym.special_text``: a zero-width space after its first character; text without any goes unchanged):
  the tokenizer's special tokens when it loads here, else a conservative list of chat markers (ChatML,
  Llama 3, Qwen, Mistral, Gemma, DeepSeek). ``special_text="keep"`` sends the text as it is.
- ``wire="auto"`` (default): chat with nothing escaped for ``toolgym serve`` (``/v1/models`` says
  ``owned_by: toolgym``; it renders with ``ChatRenderer`` itself); otherwise chat with escaping. It never picks
  tokens on its own: that wire parses replies as Hermes calls here, where the server's tool parser may read
  another format (Llama 3, Mistral). ``wire_used`` says which. Ask for ``wire="tokens"`` for exact ids (RL
  against a Hermes-style model on vLLM).

Every body sent has lone surrogates replaced (``toolgym.parsing.clean_json``): a JSON ``\\ud800`` in a model's
action decodes to one, and no UTF-8 encoder takes it (the request raised before it left).

Errors: a wrong URL, key or model (401/403/404) raises ``ConfigError`` at once; a request that still fails
after its retries (or a 400 such as a too-long context) comes back as a turn with
``finish_reason="error"``, so the runner ends that episode as an infrastructure failure and goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

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
from toolgym.parsing import clean_text
from toolgym.special_text import SpecialText, SpecialTextEscaper, escaper_for, outgoing

if TYPE_CHECKING:
    import httpx

    from toolgym.agents.rendering import ChatRenderer, ToolRole
    from toolgym.envs.base import ToolEnv

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
Wire = Literal["auto", "chat", "tokens"]
log = logging.getLogger(__name__)


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
        wire: Wire = "auto",
        special_text: SpecialText = "escape",
        tokenizer: Any = None,
        chat_template: str | None = None,
        tool_role: ToolRole = "auto",
    ) -> None:
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the server URL must start with http:// or https://, got {base_url!r}")
        if wire not in ("auto", "chat", "tokens"):
            raise ConfigError(f"wire must be 'auto', 'chat' or 'tokens', got {wire!r}")
        if special_text not in ("escape", "keep"):
            raise ConfigError(f"special_text must be 'escape' or 'keep', got {special_text!r}")
        self.wire: Wire = wire
        self.special_text: SpecialText = special_text
        self.tokenizer = (
            tokenizer  # an object, a folder or hub id, or None (the model name, local files only)
        )
        self.chat_template = chat_template
        self.tool_role: ToolRole = tool_role
        self.wire_used: Literal["chat", "tokens"] | None = None  # what ``wire`` resolved to (first request)
        self.renderer: ChatRenderer | None = None  # the tokens wire's
        self.escaper: SpecialTextEscaper | None = None  # the chat wire's (None: nothing escaped)
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
            if self.model is None or self.wire_used is None:
                await self._resolve(client)
            gate = asyncio.Semaphore(self.concurrency)

            async def one(conv: Conversation, tl: ToolDicts | None) -> AssistantTurn:
                async with gate:
                    try:
                        if self.wire_used == "tokens":
                            return await self._tokens_turn(client, conv, tl, sampling)
                        data = await self._post(client, self._body(conv, tl, sampling))
                    except BackendError as exc:
                        return AssistantTurn(
                            text=str(exc),
                            message=Message(role="assistant", content=""),
                            finish_reason="error",
                        )
                    return self._turn(data, tl)

            return list(await asyncio.gather(*(one(c, t) for c, t in zip(conversations, tools, strict=True))))

    # ----- the wire ----------------------------------------------------------------------------------------
    async def _resolve(self, client: httpx.AsyncClient) -> None:
        """The model name (the server's first when not given) and the wire (module docstring), once."""
        owner = None
        if self.model is None:
            self.model, owner = await self._first_model(client)
        elif self.wire == "auto":
            owner = await self._owner(client)
        if self.wire_used is not None:
            return
        ours = owner == "toolgym"  # toolgym serve renders with ChatRenderer: its chat endpoint is token-safe
        tok = None
        if self.wire == "tokens" or (not ours and (self.wire == "auto" or self.special_text == "escape")):
            tok = self._load_tokenizer(required=self.wire == "tokens")
        # auto never picks tokens: the reply would be parsed here as Hermes calls, and a model with another
        # call format (Llama 3, Mistral) that the server's own tool parser reads would lose its tool calls
        if self.wire == "tokens":  # (the tokenizer is there: loading it was required)
            from toolgym.agents.rendering import ChatRenderer

            self.renderer = ChatRenderer(tok, tool_role=self.tool_role, chat_template=self.chat_template)
            self.wire_used = "tokens"
            return
        if not ours:  # the tokenizer's specials when it loaded here, else the known markers; None: "keep"
            self.escaper = escaper_for(self.special_text, tok)
        self.wire_used = "chat"
        if self.wire == "auto" and not ours:
            log.info(
                "%s: chat messages, special-token text %s (%s)", self.name, "escaped" if self.escaper else "kept",
                "the tokenizer's special tokens" if tok is not None else "no tokenizer here: the known markers",
            )  # fmt: skip

    def _load_tokenizer(self, required: bool) -> Any:
        """``tokenizer`` (loaded when a name), else the model name's from local files; None when neither."""
        spec = self.tokenizer if self.tokenizer is not None else self.model
        if spec is None:
            if required:
                raise ConfigError("wire='tokens' needs the served model's tokenizer: pass tokenizer=")
            return None
        if not isinstance(spec, str):
            return spec
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(spec, local_files_only=self.tokenizer is None)
        except Exception as exc:  # not installed, not a local model, not a tokenizer
            if required or self.tokenizer is not None:
                raise ConfigError(f"cannot load the tokenizer {spec!r}: {type(exc).__name__}: {exc}") from exc
            return None

    async def _owner(self, client: httpx.AsyncClient) -> str | None:
        """``owned_by`` of the model in ``/v1/models`` (None when the server does not say)."""
        try:
            resp = await client.get(self.base_url + "/models")
            models = (resp.json().get("data") or []) if resp.status_code == 200 else []
        except Exception:  # a server without /models, or an odd answer: not needed to talk to it
            return None
        mine = [m for m in models if isinstance(m, dict) and m.get("id") == self.model] or models[:1]
        return _owned_by(mine[0]) if mine else None

    def _ids_body(self, ids: list[int], sp: SamplingParams) -> dict[str, Any]:
        from toolgym.agents.vllm_policy import sampling_body

        assert self.renderer is not None
        body = sampling_body(sp, sp.max_new_tokens, sp.stop, sorted(self.renderer.stop_ids), 0)
        body.update(model=self.model, prompt=ids, return_token_ids=True, return_tokens_as_token_ids=True)
        body.update(skip_special_tokens=False)
        if sp.seed is not None:
            body["seed"] = sp.seed
        return body

    async def _tokens_turn(
        self, client: httpx.AsyncClient, conv: Conversation, tools: ToolDicts | None, sp: SamplingParams
    ) -> AssistantTurn:
        """One turn over ``/v1/completions``: ids rendered here in, sampled ids and logprobs out."""
        from toolgym.agents.openai_tokens import stop_at
        from toolgym.agents.vllm_policy import completed_from_answer

        renderer = self.renderer
        assert renderer is not None
        ids = renderer.prompt_ids(outgoing(conv), outgoing(tools) if tools else None)
        body = self._ids_body(ids, sp)
        body.update(self.extra_body)
        resp = await self._request_raw(client, "POST", "/completions", body)
        try:
            done = completed_from_answer(resp.content, sp.max_new_tokens, len(renderer.tokenizer), ids)
        except InfrastructureError as exc:
            raise BackendError(f"{self.base_url}/completions: {exc}") from exc
        text = renderer.decode(renderer.strip_stop(done.token_ids))
        finish = done.finish
        cut = stop_at(text, sp.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
        return AssistantTurn(
            text=text,
            message=parse_turn(text, tools),
            token_ids=list(done.token_ids),
            logprobs=list(done.logprobs) if self.logprobs else [],
            finish_reason=finish,
            usage={"prompt_tokens": len(ids), "completion_tokens": len(done.token_ids)},
        )

    # ----- HTTP --------------------------------------------------------------------------------------------
    def _body(self, conv: Conversation, tools: ToolDicts | None, sp: SamplingParams) -> dict[str, Any]:
        if self.escaper is not None:  # (lone surrogates: every body, in _request_raw)
            conv, tools = self.escaper(conv), self.escaper(tools) if tools else tools
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

    async def _first_model(self, client: httpx.AsyncClient) -> tuple[str, str | None]:
        """The server's first model and its ``owned_by``."""
        data = await self._request(client, "GET", "/models", None)
        models = data.get("data") or []
        if not models:
            raise ConfigError(f"{self.base_url}/models lists no model: pass one as openai:URL@MODEL")
        return str(models[0]["id"]), _owned_by(models[0])

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request(client, "POST", "/chat/completions", body)

    async def _request(
        self, client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        return dict((await self._request_raw(client, method, path, body, parse=True)).json())

    async def _request_raw(
        self,
        client: httpx.AsyncClient,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        parse: bool = False,
    ) -> httpx.Response:
        """The 200 answer (``parse``: one whose body is a JSON object), retried as the module docstring says."""
        import httpx

        url = self.base_url + path
        body = outgoing(body)  # no lone surrogate reaches the JSON encoder (it raised: a crash, not a turn)
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
                        if not parse or isinstance(resp.json(), dict):
                            return resp
                        last = f"the server answered 200 with a non-object: {resp.text[:200]!r}"
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
        content = clean_text(str(msg.get("content") or ""))  # (a server's JSON may hold "\\ud800" too)
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


def _owned_by(entry: Any) -> str | None:
    """``owned_by`` of a ``/v1/models`` entry (``toolgym serve`` says "toolgym"), None when it does not say."""
    owner = entry.get("owned_by") if isinstance(entry, dict) else None
    return None if owner is None else str(owner)
