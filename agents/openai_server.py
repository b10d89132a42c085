"""``toolgym serve``: any ``Policy`` behind the OpenAI chat-completions API, on FastAPI + uvicorn.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health`` (and the OpenAPI docs at
``/docs``). Requests are pydantic models: a malformed one (unknown role, missing content, ``n`` out of
range, image parts, a ``tool_choice`` naming a function not in ``tools``) is answered 400, as OpenAI does,
with an OpenAI-style ``{"error": {"message", "type", "param"}}`` (never FastAPI's 422).

- **Tools** go through the model's chat template when it renders ``tools``; otherwise their JSON schemas
  and the ``<tool_call>`` syntax are written into the system prompt (what the envs' ``prompt_format="text"``
  does), so they always reach the model. Calls in the reply come back as ``message.tool_calls`` with
  ``finish_reason: "tool_calls"``; ``tool_choice: "none"`` hides the tools, and a named function
  (``{"type": "function", "function": {"name": …}}``) leaves the model that one tool.
- **Stop strings** end the reply and are not part of it (OpenAI's semantics): the content ends where the
  first of them begins, in streams too (text that may start one is held back until it cannot).
- **Logprobs**: each token's real text and bytes (a token holding part of a UTF-8 character has its raw
  bytes, and its text is those bytes escaped), and with ``top_logprobs: k`` the k most likely tokens at
  each step (one extra scoring forward over prompt + reply). Extension: ``choices[i].token_ids``.
- **Streaming** (``stream: true``): server-sent ``chat.completion.chunk`` events, sent as the tokens are
  sampled (a policy whose ``generate`` takes ``on_token``, such as ``hf``, with a byte-level tokenizer),
  then the tool calls and the finish reason, ``usage`` when ``stream_options.include_usage``, and
  ``[DONE]``. With tools, text from ``<tool_call>`` on is held back and sent as ``tool_calls``. Policies
  that only return whole replies (an OpenAI proxy, ``engine``), and ``top_logprobs`` (one scoring forward
  after the reply), stream the finished reply token by token instead.

Requests arriving together are answered by one batched generation (a worker thread collects them for
``batch_window_s``), so concurrent clients share the model.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolgym.agents.policy import AssistantTurn, Policy, SamplingParams, TokenPolicy
from toolgym.errors import ConfigError
from toolgym.serving.base import AppServer

_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.S)


# ----- the request ---------------------------------------------------------------------------------------
class _Function(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDef(BaseModel):
    """One entry of ``tools``: ``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"] = "function"
    function: _Function


class _CallFunction(BaseModel):
    name: str
    arguments: str = "{}"


class _ToolCallIn(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: _CallFunction


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """A message of the conversation (``developer`` is read as ``system``)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_Part] | None = None
    name: str | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatMessage:
        if isinstance(self.content, list):
            bad = [p.type for p in self.content if p.type != "text" or p.text is None]
            if bad:
                raise ValueError(f"only text content parts are supported, got {bad}")
        if self.role == "assistant":
            if self.content is None and not self.tool_calls:
                raise ValueError("an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def to_plain(self) -> dict[str, Any]:
        """The message as the renderer takes it (text parts joined, ``developer`` as ``system``)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text or "" for p in content)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        out["content"] = content or ""
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class _StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The body of ``POST /v1/chat/completions`` (fields the API has that we cannot honour are refused)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=64)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: _StreamOptions | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("at most 4 stop sequences")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, dict):
            name = self.chosen_function()
            known = [t.function.name for t in self.tools or ()]
            if name not in known:
                raise ValueError(f"tool_choice names the function {name!r}, which is not in tools {known}")
        return self

    def chosen_function(self) -> str | None:
        """The function a ``tool_choice`` object names (``{"type": "function", "function": {"name": …}}``)."""
        if not isinstance(self.tool_choice, dict):
            return None
        fn = self.tool_choice.get("function")
        if self.tool_choice.get("type") != "function" or not isinstance(fn, dict):
            raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", ...}')
        name = fn.get("name")
        if not isinstance(name, str):
            raise ValueError("tool_choice.function.name must be a string")
        return name

    @property
    def stops(self) -> tuple[str, ...]:
        stop = self.stop or ()
        return tuple(s for s in ((stop,) if isinstance(stop, str) else stop) if s)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            max_new_tokens=self.max_completion_tokens or self.max_tokens or 256,
            stop=self.stops,
            seed=self.seed,
        )

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        chosen = self.chosen_function()
        return [
            t.model_dump(exclude_none=True) for t in self.tools if chosen is None or t.function.name == chosen
        ]


def stop_at(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the first stop string begins in ``text[start:]`` (the reply's end), or None.

    >>> stop_at("1, 2, 3", [","]), stop_at("abc", ["x"]), stop_at("a.b;c", [";", "."])
    (1, None, 1)
    """
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def stop_prefix_tail(text: str, stops: Sequence[str], start: int = 0) -> int:
    """How many characters at the end of ``text[start:]`` could begin a stop string (held back in streams).

    >>> stop_prefix_tail("1 <", ["<end>"]), stop_prefix_tail("1 <e", ["<end>", "x"]), stop_prefix_tail("ab", ["c"])
    (1, 2, 0)
    """
    room = len(text) - start
    return max(
        (k for s in stops for k in range(min(len(s) - 1, room), 0, -1) if s.startswith(text[-k:])),
        default=0,
    )


# ----- tokens as the API shows them ------------------------------------------------------------------------
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TokenBytes:
    """The raw bytes of each token id of a tokenizer (byte-level BPE, SentencePiece byte fallback, else
    the decoded text), cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = "ByteLevel" in type(getattr(backend, "decoder", None)).__name__
        self._decoder = _byte_decoder()
        self._special = {
            int(i): str(getattr(t, "content", t))
            for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
        }
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._bytes(token_id)
        return hit

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self._special:
            return self._special[token_id].encode()
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if self.byte_level and all(c in self._decoder for c in piece):
                return bytes(self._decoder[c] for c in piece)
            m = _BYTE_FALLBACK.match(piece)
            if m:
                return bytes([int(m.group(1), 16)])
            if "\u2581" in piece:  # SentencePiece's word boundary
                return piece.replace("\u2581", " ").encode()
        return str(self.tokenizer.decode([token_id])).encode()

    def text(self, token_id: int) -> str:
        return token_text(self(token_id))


def token_text(raw: bytes) -> str:
    """A token's text: its UTF-8 decoding, or for a partial character its bytes escaped (``\\xe2``)."""
    return raw.decode("utf-8", errors="backslashreplace")


# ----- the batcher -----------------------------------------------------------------------------------------
class _Sink:
    """Tokens of a streamed request, handed from the generation thread to the event loop as each is
    sampled: ``(choice, token id, logprob)``, then ``(choice, None, 0.0)`` when that choice is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, int | None, float]] = asyncio.Queue()

    def push(self, choice: int, token_id: int | None, logprob: float = 0.0) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (choice, token_id, logprob))


@dataclass
class _Job:
    conversation: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    top_k: int
    future: Future[_Reply]
    sink: _Sink | None = None
    choice: int = 0


@dataclass
class _Reply:
    turn: AssistantTurn
    prompt_tokens: int
    top: list[list[tuple[int, float]]] = field(
        default_factory=list
    )  # per reply token: (id, logprob) best-first


def tools_system_text(tools: Sequence[dict[str, Any]]) -> str:
    """Tool schemas and the call syntax as system-prompt text, for templates that do not render tools."""
    schemas = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return (
        f"You may call these tools:\n{schemas}\n\n"
        'To call a tool, write <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>; '
        "the result comes back in the next message."
    )


class PolicyServer(AppServer):
    """Serves ``policy`` on ``host:port`` (port 0 picks a free one; see ``.port``). ``start()`` runs uvicorn
    in a background thread, ``serve_forever()`` in this one; ``close()`` stops it (``AppServer``), and a
    batching thread feeds the policy."""

    def __init__(
        self,
        policy: Policy,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        model_name: str | None = None,
        max_batch: int = 64,
        batch_window_s: float = 0.005,
    ) -> None:
        self.policy = policy
        self.model_name = model_name or getattr(policy, "name", "toolgym")
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="toolgym-serve-batcher", daemon=True)
        self._renderer = getattr(policy, "renderer", None) if isinstance(policy, TokenPolicy) else None
        tok = getattr(self._renderer, "tokenizer", None)
        self._token_bytes = TokenBytes(tok) if tok is not None else None
        super().__init__(None, host, port, lifespan="off")
        self.app = build_app(self)

    @property
    def url(self) -> str:
        return f"{super().url}/v1"

    def start(self, timeout_s: float = 60.0) -> PolicyServer:
        self._worker.start()
        super().start(timeout_s)
        return self

    def serve_forever(self) -> None:
        self._worker.start()
        super().serve_forever()

    def close(self) -> None:
        super().close()
        self._jobs.put(None)

    def __enter__(self) -> PolicyServer:
        return self.start()

    # ----- batching ----------------------------------------------------------------------------------------
    def submit(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
        top_k: int = 0,
        sink: _Sink | None = None,
        choice: int = 0,
    ) -> Future[_Reply]:
        fut: Future[_Reply] = Future()
        self._jobs.put(_Job(conversation, tools, sampling, top_k, fut, sink, choice))
        return fut

    @property
    def streams_tokens(self) -> bool:
        """Whether replies can be streamed as they are sampled: the policy's ``generate`` reports each
        token (``on_token``) and a token's bytes add up to the decoded text (byte-level tokenizers)."""
        import inspect

        if self._renderer is None or self._token_bytes is None or not self._token_bytes.byte_level:
            return False
        try:
            return "on_token" in inspect.signature(self.policy.generate).parameters  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            return False

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch = [job]
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch:
                try:
                    more = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)
                    break
                batch.append(more)
            by_sampling: dict[SamplingParams, list[_Job]] = {}
            for j in batch:
                by_sampling.setdefault(j.sampling, []).append(j)
            for sampling, jobs in by_sampling.items():
                try:
                    replies = self._answer(jobs, sampling)
                except Exception as exc:  # answered as a 500 to each waiting request
                    for j in jobs:
                        j.future.set_exception(exc)
                        if j.sink is not None:
                            j.sink.push(j.choice, None)
                    continue
                for j, reply in zip(jobs, replies, strict=True):
                    j.future.set_result(reply)
                    if j.sink is not None:
                        j.sink.push(j.choice, None)

    def _conversation(self, conv: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Any:
        """The conversation and tools as the model gets them: tools in the system prompt when the template
        cannot show them."""
        if not tools or self._renderer is None or self._renderer.renders_tools:
            return conv, tools
        text = tools_system_text(tools)
        if conv and conv[0]["role"] == "system":
            return [dict(conv[0], content=f"{conv[0]['content']}\n\n{text}"), *conv[1:]], tools
        return [{"role": "system", "content": text}, *conv], tools

    def _answer(self, jobs: list[_Job], sampling: SamplingParams) -> list[_Reply]:
        prepared = [self._conversation(j.conversation, j.tools) for j in jobs]
        if self._renderer is None:  # a policy without tokens (an OpenAI proxy, a custom one)
            turns = self.policy.act([c for c, _ in prepared], [t for _, t in prepared], sampling=sampling)
            return [_Reply(t, int(t.usage.get("prompt_tokens", 0))) for t in turns]
        policy: Any = self.policy
        prompts = [self._renderer.prompt_ids(c, t) for c, t in prepared]
        if any(j.sink is not None for j in jobs):

            def on_token(row: int, token_id: int, logprob: float) -> None:
                job = jobs[row]
                if job.sink is not None:
                    job.sink.push(job.choice, token_id, logprob)

            gens = policy.generate(prompts, sampling, on_token=on_token)
        else:
            gens = policy.generate(prompts, sampling)
        replies = []
        for j, (_, tools), prompt, gen in zip(jobs, prepared, prompts, gens, strict=True):
            reply = _Reply(policy.to_turn(gen, tools, len(prompt)), len(prompt))
            if j.top_k and gen.token_ids:
                reply.top = self._top_logprobs(prompt, gen.token_ids, j.top_k, sampling)
            replies.append(reply)
        return replies

    def _top_logprobs(
        self, prompt: list[int], reply: list[int], k: int, sampling: SamplingParams
    ) -> list[list[tuple[int, float]]]:
        """The k likeliest tokens at each reply position, under the distribution sampled from."""
        import torch

        model: Any = self.policy.model  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        ids = torch.tensor([prompt + reply[:-1]], device=device)  # [1, L]
        temp = sampling.temperature if sampling.temperature > 0 else 1.0
        with torch.inference_mode():
            logits = model(input_ids=ids, logits_to_keep=len(reply)).logits[0, -len(reply) :]  # [R, V]
            logp = torch.log_softmax(logits.float() / temp, dim=-1)
            values, indices = logp.topk(min(k, logp.shape[-1]), dim=-1)  # [R, k]
        return [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]

    # ----- the API -----------------------------------------------------------------------------------------
    async def replies(self, req: ChatCompletionRequest) -> list[_Reply]:
        futures = self.submit_request(req)
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))

    def submit_request(self, req: ChatCompletionRequest, sink: _Sink | None = None) -> list[Future[_Reply]]:
        """One job per choice (``n``); with a sink, each token is reported as it is sampled."""
        conv = [m.to_plain() for m in req.messages]
        sampling = req.sampling()
        top_k = (req.top_logprobs or 0) if req.logprobs else 0
        tools = req.tool_dicts()
        return [self.submit(conv, tools, sampling, top_k, sink, i) for i in range(req.n)]

    def choice(self, index: int, reply: _Reply, req: ChatCompletionRequest) -> dict[str, Any]:
        turn = reply.turn
        cut = stop_at(turn.text, req.stops)
        text = turn.text if cut is None else turn.text[:cut]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish: str = turn.finish_reason if turn.finish_reason != "error" else "stop"
        if cut is not None:
            finish = "stop"
        # a call cut off by a stop string is not a call
        if req.tool_dicts() and turn.message.tool_calls and (cut is None or _TOOL_CALL.search(text)):
            message["tool_calls"] = [
                dict(c.to_dict(), id=f"call_{uuid.uuid4().hex[:16]}") for c in turn.message.tool_calls
            ]
            message["content"] = _TOOL_CALL.sub("", text).strip() or None
            finish = "tool_calls"
        out: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
        if req.logprobs:
            out["logprobs"] = {"content": self.logprob_entries(reply)}
            out["token_ids"] = list(turn.token_ids)
        return out

    def token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """The logprob entry of one sampled token (no alternatives: they need the scoring forward)."""
        raw = self._token_bytes(token_id) if self._token_bytes is not None else b""
        return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw), "top_logprobs": []}

    def logprob_entries(self, reply: _Reply) -> list[dict[str, Any]]:
        turn, tb = reply.turn, self._token_bytes
        entries = []
        for pos, (tid, lp) in enumerate(zip(turn.token_ids, turn.logprobs, strict=False)):
            raw = tb(tid) if tb is not None else b""
            top: list[dict[str, Any]] = []
            if tb is not None and pos < len(reply.top):
                top = [
                    {"token": token_text(tb(i)), "logprob": v, "bytes": list(tb(i))}
                    for i, v in reply.top[pos]
                ]
            entries.append({"token": token_text(raw), "logprob": lp, "bytes": list(raw), "top_logprobs": top})
        return entries


def _error(status: int, message: str, kind: str, param: str | None = None) -> Any:
    from fastapi.responses import JSONResponse

    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(status_code=status, content=body)


def build_app(server: PolicyServer) -> Any:
    """The FastAPI application of ``server`` (routes under ``/v1`` and at the root)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import StreamingResponse

    app = FastAPI(title="toolgym serve", description="A toolgym policy behind the OpenAI chat API.")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        return _error(400, "; ".join(problems) or "invalid request", "invalid_request_error", param)

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        model = {"id": server.model_name, "object": "model", "created": 0, "owned_by": "toolgym"}
        return {"object": "list", "data": [model]}

    @app.post("/v1/chat/completions", response_model=None)
    @app.post("/chat/completions", response_model=None)
    async def chat(req: ChatCompletionRequest) -> Any:
        if req.stream and not req.top_logprobs and server.streams_tokens:
            sink = _Sink(asyncio.get_running_loop())
            futures = server.submit_request(req, sink)
            head = {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": req.model or server.model_name,
            }
            events = _live_events(server, head, req, sink, futures)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            replies = await server.replies(req)
        except ConfigError as exc:
            return _error(400, str(exc), "invalid_request_error")
        except Exception as exc:  # the policy failed: the client may retry
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        model = req.model or server.model_name
        usage = _usage(replies)
        choices = [server.choice(i, r, req) for i, r in enumerate(replies)]
        if not req.stream:
            return {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage,
            }
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = _stream_events(server, head, replies, choices, req, usage if include_usage else None)
        return StreamingResponse(events, media_type="text/event-stream")

    return app


async def _stream_events(
    server: PolicyServer,
    head: dict[str, Any],
    replies: list[_Reply],
    choices: list[dict[str, Any]],
    req: ChatCompletionRequest,
    usage: dict[str, Any] | None,
) -> AsyncIterator[str]:
    """SSE chunks: the role, the reply token by token, the tool calls, the finish reason, usage, [DONE]."""

    def event(choice: dict[str, Any] | None, **extra: Any) -> str:
        body = dict(head, choices=[choice] if choice else [], **extra)
        return f"data: {json.dumps(body)}\n\n"

    for index, (reply, choice) in enumerate(zip(replies, choices, strict=True)):
        yield event({"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        calls = choice["message"].get("tool_calls")
        entries = server.logprob_entries(reply) if req.logprobs else []
        tb = server._token_bytes
        if calls:  # the text before the calls, then the calls
            pieces = [choice["message"]["content"]] if choice["message"]["content"] else []
        elif tb is not None and reply.turn.token_ids:
            pieces = _cut(_token_pieces(tb, server._renderer, reply.turn), choice["message"]["content"] or "")
        else:
            pieces = [choice["message"]["content"]] if choice["message"]["content"] else []
        aligned = len(pieces) == len(entries)
        for k, piece in enumerate(pieces):
            delta: dict[str, Any] = {"index": index, "delta": {"content": piece}, "finish_reason": None}
            if entries and (aligned or k == 0):  # one token per chunk, else all of them with the first
                delta["logprobs"] = {"content": entries[k : k + 1] if aligned else entries}
            yield event(delta)
            await asyncio.sleep(0)
        if calls:
            deltas = [dict(c, index=i) for i, c in enumerate(calls)]
            yield event({"index": index, "delta": {"tool_calls": deltas}, "finish_reason": None})
        yield event({"index": index, "delta": {}, "finish_reason": choice["finish_reason"]})
    if usage is not None:
        yield event(None, usage=usage)
    yield "data: [DONE]\n\n"


def _token_pieces(tb: TokenBytes, renderer: Any, turn: AssistantTurn) -> list[str]:
    """The reply text cut at token boundaries (a character split over tokens goes with its last token),
    one piece per token so each chunk can carry that token's logprob; the stop token adds nothing."""
    ids = renderer.strip_stop(turn.token_ids)
    pieces, pending = [], b""
    for tid in ids:
        pending += tb(tid)
        try:
            pieces.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            pieces.append("")
    if pending:
        pieces[-1] = pending.decode("utf-8", errors="replace")
    if len(ids) < len(turn.token_ids):
        pieces.append("")
    if "".join(pieces) != turn.text:  # a tokenizer whose pieces do not add up: send the text whole
        return [turn.text]
    return pieces


def _cut(pieces: list[str], content: str) -> list[str]:
    """``pieces`` (one per token) cut to the ``content`` they begin with (a stop string ended it): the
    tokens after the cut stay, empty, so each keeps its chunk (and logprob)."""
    out, left = [], len(content)
    for piece in pieces:
        out.append(piece[:left])
        left -= len(out[-1])
    return out


_CALL_TAG = "<tool_call>"


def _usage(replies: Sequence[_Reply]) -> dict[str, int]:
    """OpenAI's usage block: the prompt counted once (choices share it), every choice's completion."""
    prompt_tokens = max((r.prompt_tokens for r in replies), default=0)
    completion_tokens = sum(len(r.turn.token_ids) for r in replies)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class _LiveChoice:
    """One choice of a live stream: turns sampled tokens into content deltas. A character split over
    tokens is sent with its last token; the stop token adds nothing; with tools, text from ``<tool_call>``
    on (and any tail that could start it) is held back until the reply is parsed."""

    def __init__(self, server: PolicyServer, hold_calls: bool, stops: Sequence[str] = ()) -> None:
        self.server = server
        self.hold_calls = hold_calls
        self.stops = tuple(stops)
        self.end: int | None = None  # where a stop string began: nothing from there on is sent
        self.pending = b""
        self.text = ""
        self.sent = 0  # characters of ``text`` sent as content
        self.stop_ids: set[int] = set(getattr(server._renderer, "stop_ids", ()) or ())

    def add(self, token_id: int) -> str:
        """The content this token releases ("" while a character or a possible tool call is incomplete)."""
        tb = self.server._token_bytes
        if token_id not in self.stop_ids and tb is not None:
            self.pending += tb(token_id)
            try:
                self.text += self.pending.decode("utf-8")
                self.pending = b""
            except UnicodeDecodeError:
                if len(self.pending) >= 4:  # not a character in progress: invalid bytes
                    self.text += self.pending.decode("utf-8", errors="replace")
                    self.pending = b""
        return self._release(self._releasable())

    def _releasable(self) -> int:
        """How much of ``text`` may be sent now: up to a stop string, short of what could begin one or a
        tool call."""
        if self.end is None and self.stops:
            self.end = stop_at(self.text, self.stops, self.sent)
        if self.end is not None:
            return min(self.end, len(self.text) - self._held_tail())
        return len(self.text) - max(self._held_tail(), stop_prefix_tail(self.text, self.stops, self.sent))

    def _held_tail(self) -> int:
        if not self.hold_calls:
            return 0
        start = self.text.find(_CALL_TAG, self.sent)
        if start >= 0:
            return len(self.text) - start
        for k in range(min(len(_CALL_TAG) - 1, len(self.text) - self.sent), 0, -1):
            if _CALL_TAG.startswith(self.text[-k:]):
                return k
        return 0

    def _release(self, end: int) -> str:
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : end], end
        return piece

    def finish(self, message: dict[str, Any]) -> str:
        """The content still owed once the reply is parsed: the held text, or with tool calls the text
        outside the calls."""
        if self.pending:
            self.text += self.pending.decode("utf-8", errors="replace")
            self.pending = b""
        if self.end is None and self.stops:
            self.end = stop_at(self.text, self.stops, self.sent)
        end = len(self.text) if self.end is None else self.end
        if message.get("tool_calls"):
            rest = _TOOL_CALL.sub("", self.text[self.sent : end])
            self.sent = len(self.text)
            return rest if rest.strip() else ""
        return self._release(end)


async def _live_events(
    server: PolicyServer,
    head: dict[str, Any],
    req: ChatCompletionRequest,
    sink: _Sink,
    futures: list[Future[_Reply]],
) -> AsyncIterator[str]:
    """SSE chunks sent while the reply is sampled: the role, each token's content (and logprob) as it
    arrives, then per choice its tool calls and finish reason once parsed, usage, [DONE]."""

    def event(choice: dict[str, Any] | None, **extra: Any) -> str:
        body = dict(head, choices=[choice] if choice else [], **extra)
        return f"data: {json.dumps(body)}\n\n"

    hold = bool(req.tool_dicts())
    live = [_LiveChoice(server, hold, req.stops) for _ in futures]
    for index in range(len(futures)):
        yield event({"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    open_choices = len(futures)
    while open_choices:
        index, token_id, logprob = await sink.queue.get()
        if token_id is not None:
            piece = live[index].add(token_id)
            if piece or req.logprobs:  # with logprobs, one chunk per token (its content may be "")
                delta: dict[str, Any] = {"index": index, "delta": {"content": piece}, "finish_reason": None}
                if req.logprobs:
                    delta["logprobs"] = {"content": [server.token_entry(token_id, logprob)]}
                yield event(delta)
            continue
        open_choices -= 1
        try:
            reply = await asyncio.wrap_future(futures[index])
        except Exception as exc:  # the reply is under way: the error goes in the stream (the client raises)
            body = {"message": f"{type(exc).__name__}: {exc}", "type": "server_error", "param": None}
            yield f"data: {json.dumps({'error': body})}\n\n"
            return
        choice = server.choice(index, reply, req)
        rest = live[index].finish(choice["message"])
        if rest:
            yield event({"index": index, "delta": {"content": rest}, "finish_reason": None})
        calls = choice["message"].get("tool_calls")
        if calls:
            deltas = [dict(c, index=i) for i, c in enumerate(calls)]
            yield event({"index": index, "delta": {"tool_calls": deltas}, "finish_reason": None})
        yield event({"index": index, "delta": {}, "finish_reason": choice["finish_reason"]})
    if req.stream_options and req.stream_options.include_usage:
        replies = [f.result() for f in futures]
        usage = _usage(replies)
        yield event(None, usage=usage)
    yield "data: [DONE]\n\n"
