"""``toolgym serve``: any ``Policy`` behind the OpenAI chat-completions API, on FastAPI + uvicorn.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (token ids in and out, as vLLM's server
takes them from RL trainers: see below), ``GET /v1/models``, ``GET /health`` (and the OpenAPI docs at
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

- **Completions with token ids** (``POST /v1/completions``, what ``engine: vllm`` with ``rollout_servers`` sends):
  the prompt as a list of token ids (or a list of such lists), never re-tokenized; ``return_token_ids`` gives
  ``choices[i].token_ids``, ``logprobs: k`` each sampled token's logprob (under the distribution sampled from,
  as ``generate`` reports it) and the k likeliest tokens (one scoring forward), ``return_tokens_as_token_ids``
  writes tokens as ``token_id:N``. The token that ends the reply (end of turn, a ``stop_token_ids`` id, the token
  completing a stop string) is part of ``token_ids``; the text stops before a stop string unless
  ``include_stop_str_in_output``. ``ignore_eos`` is accepted but the end-of-turn token still ends a reply.

- **Weight updates** (``weight_updates=True``, ``toolgym serve --weight-updates``): vLLM's dev endpoints that a
  trainer's ``weight_sync: disk`` calls (``/pause``, ``/collective_rpc`` ``reload_weights``,
  ``/reset_prefix_cache``, ``/resume``); off, they are 404. See agents/openai_weights.py.

Requests arriving together are answered by one batched generation (a worker thread collects them for
``batch_window_s``), so concurrent clients share the model.

Hostile or broken clients: every error is OpenAI's ``{"error": {...}}`` (unknown routes and methods, bodies
that are not JSON, a body past ``limits.max_body_bytes`` 413, one that does not arrive within
``limits.body_timeout_s`` 408: ``toolgym.serving.base.Limits``); token ids must be JSON integers (``true`` is
not a token); ``max_tokens`` is bounded by the model's context, or by ``max_tokens_limit`` when it is unknown.
A policy turn that failed (an upstream backend's ``finish_reason="error"``) is a 502, never served as the
model's text. A streamed request whose client disconnects has its choices that have not started cancelled.
A request after ``close()`` is answered 503. ``model`` in a request is not checked unless ``strict_model``
(then an unknown name is 404 ``model_not_found``, as vLLM answers); the answer names the model served.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from toolgym.agents.openai_schema import ChatCompletionRequest, CompletionRequest
from toolgym.agents.openai_stream import live_events, stream_events, usage_block
from toolgym.agents.openai_tokens import TOOL_CALL, TokenBytes, stop_at, token_text
from toolgym.agents.openai_weights import PAUSE_MODES, CollectiveRpc, PauseGate, WeightUpdates
from toolgym.agents.policy import AssistantTurn, Policy, SamplingParams, TokenPolicy, context_of
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.optional import require
from toolgym.serving.base import AppServer, Limits


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
    prompt: list[int] | None = None  # given token ids (``/v1/completions``): no rendering


@dataclass
class _Reply:
    turn: AssistantTurn
    prompt_tokens: int
    top: list[list[tuple[int, float]]] = field(
        default_factory=list
    )  # per reply token: (id, logprob) best-first


def answer(job: _Job, result: _Reply | Exception) -> None:
    """Answers a job (its future, and the end of its stream when it streams)."""
    if isinstance(result, Exception):
        job.future.set_exception(result)
    else:
        job.future.set_result(result)
    if job.sink is not None:
        job.sink.push(job.choice, None)


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
        threads: int = 0,
        max_choices: int = 4096,
        max_tokens_limit: int = 2**20,
        strict_model: bool = False,
        limits: Limits | None = None,
        weight_updates: bool = False,
        continuous: bool | None = None,
    ) -> None:
        if max_tokens_limit < 1 or max_batch < 1 or max_choices < 1:
            raise ConfigError("max_tokens_limit, max_batch and max_choices must be >= 1")
        self.policy = policy
        self.max_tokens_limit = max_tokens_limit  # max_tokens past this is a 400 when the context is unknown
        self.strict_model = strict_model
        self.closed = False
        self._stopped = False  # the batcher thread has ended
        self._intake = threading.Lock()  # (a job is queued before the batcher stops, or refused)
        self.max_choices = (
            max_choices  # sequences one request may ask for (prompts x n): more is answered 400
        )
        self.context = context_of(policy)  # the model's positions (prompt + reply), None when unknown
        self.threads = threads  # torch's CPU threads when serving forever on a CPU (0: cpu_threads())
        self.model_name = model_name or getattr(policy, "name", "toolgym")
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self.gate = PauseGate()  # /pause and weight loads hold the batcher off between batches
        # vLLM's dev endpoints (/pause, /resume, /collective_rpc reload_weights, /reset_prefix_cache): off, 404
        self.weights = WeightUpdates(policy, self.gate) if weight_updates else None
        # continuous batching (a request joins the running batch at the next engine step) for a policy whose
        # engine allows it (ours: ``continuous_serving``); None: whenever it does; else rounds
        able = bool(getattr(policy, "continuous_serving", False))
        if continuous and not able:
            raise ConfigError(
                f"continuous batching needs an engine policy (engine:NAME), not {type(policy).__name__}"
            )
        self.continuous = able if continuous is None else continuous
        self.batcher: Any = None  # the continuous batcher, once its thread runs
        self._worker = threading.Thread(target=self._work, name="toolgym-serve-batcher", daemon=True)
        self._renderer = getattr(policy, "renderer", None) if isinstance(policy, TokenPolicy) else None
        tok = getattr(self._renderer, "tokenizer", None)
        self._token_bytes = TokenBytes(tok) if tok is not None else None
        super().__init__(None, host, port, lifespan="off", limits=limits, error_body=_error_body)
        self.app = build_app(self)

    @property
    def url(self) -> str:
        return f"{super().url}/v1"

    def start(self, timeout_s: float = 60.0) -> PolicyServer:
        self._worker.start()
        super().start(timeout_s)
        return self

    def serve_forever(self) -> None:
        self.use_cpu_threads()
        self._worker.start()
        super().serve_forever()

    def use_cpu_threads(self) -> int | None:
        """A policy whose model runs on the CPU gets ``cpu_threads(self.threads)`` torch threads (the number set,
        or None when the model is elsewhere or there is none)."""
        model = getattr(self.policy, "model", None)
        try:
            device = next(model.parameters()).device.type if model is not None else None
        except (AttributeError, StopIteration, TypeError):
            device = None
        if device != "cpu":
            return None
        import torch

        n = cpu_threads(self.threads)
        torch.set_num_threads(n)
        return n

    def close(self) -> None:
        self.closed = True
        super().close()
        self._jobs.put(None)
        self.gate.close()

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
        prompt: list[int] | None = None,
    ) -> Future[_Reply]:
        fut: Future[_Reply] = Future()
        with self._intake:
            if (
                self.closed or self._stopped
            ):  # the batcher is gone or going: a job queued now would wait forever
                fut.set_exception(ServerClosed("the server is shutting down: retry on another server"))
                return fut
            self._jobs.put(_Job(conversation, tools, sampling, top_k, fut, sink, choice, prompt))
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
        try:
            if self.continuous:  # our engine: requests join the running batch (agents/openai_continuous.py)
                from toolgym.agents.openai_continuous import ContinuousBatcher

                self.batcher = ContinuousBatcher(self)
                self.batcher.run()
            else:
                self._batches()
        finally:  # jobs still queued when the batcher stops (closed, or a policy that raised past Exception)
            with self._intake:  # are answered, and none is queued after: never left waiting
                self._stopped = True
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None and job.future.set_running_or_notify_cancel():
                    answer(job, ServerClosed("the server shut down before this request ran"))

    def _batches(self) -> None:
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
            if not self.gate.enter():  # paused (a weight update): the batch waits for /resume, kept
                for j in batch:  # closing while paused: _work answers them as shut down
                    self._jobs.put(j)
                return
            try:
                if not self._run(batch):
                    return
            finally:
                self.gate.leave()

    def _run(self, batch: list[_Job]) -> bool:
        """Generates and answers one batch; False when the policy stopped the server (the batcher ends)."""
        # a job whose caller went away (its future cancelled) is not generated; the others are marked
        # running, so a cancel from now on cannot make set_result raise here (that would end this thread)
        batch = [j for j in batch if j.future.set_running_or_notify_cancel()]
        by_sampling: dict[SamplingParams, list[_Job]] = {}
        for j in batch:
            by_sampling.setdefault(j.sampling, []).append(j)
        for sampling, jobs in by_sampling.items():
            try:
                replies: list[_Reply | Exception] = self._isolated(jobs, sampling)
            except BaseException as exc:  # (SystemExit, KeyboardInterrupt) ends the batcher: answer first
                for j in batch:
                    if not j.future.done():
                        answer(j, ServerClosed(f"the policy stopped the server ({type(exc).__name__})"))
                return False  # (no re-raise: in a thread it would only print; _work refuses what follows)
            for j, reply in zip(jobs, replies, strict=True):
                answer(j, reply)
        return True

    def _isolated(self, jobs: list[_Job], sampling: SamplingParams) -> list[_Reply | Exception]:
        """Each job's reply. When the batch fails, each job is answered alone, so one client's request that
        breaks the policy fails that request only, not the requests batched with it (streamed jobs are not
        run again: their clients already have tokens of the failed run)."""
        try:
            return list(self._answer(jobs, sampling))
        except Exception as exc:
            if len(jobs) == 1 or any(j.sink is not None for j in jobs):
                return [exc] * len(jobs)
        out: list[_Reply | Exception] = []
        for j in jobs:
            try:
                out += self._answer([j], sampling)
            except Exception as exc:  # answered as a 500 to that request
                out.append(exc)
        return out

    def _conversation(self, conv: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Any:
        """The conversation and tools as the model gets them: tools in the system prompt when the template
        cannot show them."""
        if not tools or self._renderer is None or self._renderer.renders_tools:
            return conv, tools
        text = tools_system_text(tools)
        if conv and conv[0]["role"] == "system":
            return [dict(conv[0], content=f"{conv[0]['content']}\n\n{text}"), *conv[1:]], tools
        return [{"role": "system", "content": text}, *conv], tools

    def _answer(self, jobs: list[_Job], sampling: SamplingParams) -> list[_Reply | Exception]:
        """Each job's reply; a job the model cannot take (a prompt + reply past its context: a ConfigError,
        answered 400) is left out of the generation and gets its error, so it never fails the jobs beside it."""
        prepared = [
            self._conversation(j.conversation, j.tools) if j.prompt is None else ([], None) for j in jobs
        ]
        if self._renderer is None:  # a policy without tokens (an OpenAI proxy, a custom one)
            turns = self.policy.act([c for c, _ in prepared], [t for _, t in prepared], sampling=sampling)
            if len(turns) != len(jobs):
                raise InfrastructureError(f"the policy returned {len(turns)} turns for {len(jobs)} requests")
            return [_failed(t) or _Reply(t, int(t.usage.get("prompt_tokens", 0))) for t in turns]
        policy: Any = self.policy
        every = [
            j.prompt if j.prompt is not None else self._renderer.prompt_ids(c, t)
            for j, (c, t) in zip(jobs, prepared, strict=True)
        ]
        out: list[_Reply | Exception] = [ConfigError("(not answered)")] * len(jobs)
        keep = []
        for i, prompt in enumerate(every):
            problem = self.context_problem(len(prompt), sampling.max_new_tokens)
            if problem is None:
                keep.append(i)
            else:
                out[i] = ConfigError(problem)
        if not keep:
            return out
        jobs, prepared, prompts = (
            [jobs[i] for i in keep],
            [prepared[i] for i in keep],
            [every[i] for i in keep],
        )
        if any(j.sink is not None for j in jobs):

            def on_token(row: int, token_id: int, logprob: float) -> None:
                job = jobs[row]
                if job.sink is not None:
                    job.sink.push(job.choice, token_id, logprob)

            gens = policy.generate(prompts, sampling, on_token=on_token)
        else:
            gens = policy.generate(prompts, sampling)
        if len(gens) != len(prompts):
            raise InfrastructureError(f"the policy returned {len(gens)} turns for {len(prompts)} prompts")
        replies = [
            self._reply(j, tools, prompt, gen)
            for j, (_, tools), prompt, gen in zip(jobs, prepared, prompts, gens, strict=True)
        ]
        for i, answer in zip(keep, replies, strict=True):
            out[i] = answer
        return out

    def _reply(self, job: _Job, tools: Any, prompt: list[int], gen: Any) -> _Reply | Exception:
        """A job's reply from its generation (an InfrastructureError when the policy's output is broken)."""
        turn = self.policy.to_turn(gen, tools, len(prompt))  # type: ignore[attr-defined]
        failed: InfrastructureError | None = _failed(turn)
        if failed is None and len(turn.logprobs) != len(turn.token_ids):
            failed = InfrastructureError(
                f"the policy returned {len(turn.logprobs)} logprobs for {len(turn.token_ids)} tokens"
            )
        if failed is not None:
            return failed
        reply = _Reply(turn, len(prompt))
        if job.top_k and gen.token_ids:
            reply.top = self._top_logprobs(prompt, gen.token_ids, job.top_k, job.sampling)
        return reply

    def context_problem(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a prompt of ``prompt_tokens`` with room for ``max_tokens`` more does not fit the model (vLLM's
        400), or None. Past its positions a model extrapolates into garbage or fails (a 10^12-token reply
        would allocate its KV cache)."""
        if self.context is None:
            if max_tokens <= self.max_tokens_limit:
                return None
            return (
                f"max_tokens {max_tokens} is more than this server gives one completion "
                f"({self.max_tokens_limit}): lower max_tokens"
            )
        if prompt_tokens + max_tokens <= self.context:
            return None
        return (
            f"this model's maximum context length is {self.context} tokens, but {prompt_tokens + max_tokens} "
            f"were requested ({prompt_tokens} in the prompt, {max_tokens} for the completion): "
            "shorten the prompt or lower max_tokens"
        )

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
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        finally:
            for f in futures:  # one choice failed (or the client left): the others not started are dropped
                f.cancel()

    def submit_request(self, req: ChatCompletionRequest, sink: _Sink | None = None) -> list[Future[_Reply]]:
        """One job per choice (``n``); with a sink, each token is reported as it is sampled."""
        conv = [m.to_plain() for m in req.messages]
        sampling = req.sampling()
        if self.context is None and (problem := self.context_problem(0, sampling.max_new_tokens)):
            raise ConfigError(problem)  # (with a context, each prompt is checked against it when rendered)
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
        if req.tool_dicts() and turn.message.tool_calls and (cut is None or TOOL_CALL.search(text)):
            message["tool_calls"] = [
                dict(c.to_dict(), id=f"call_{uuid.uuid4().hex[:16]}") for c in turn.message.tool_calls
            ]
            message["content"] = TOOL_CALL.sub("", text).strip() or None
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


class ServerClosed(InfrastructureError):
    """A request the server cannot take because it is shutting down (a 503: retry elsewhere)."""


class UpstreamError(InfrastructureError):
    """The policy's own backend failed the turn (a 502: the text it carries is an error, not a reply)."""


def _failed(turn: AssistantTurn) -> UpstreamError | None:
    """An UpstreamError for a turn the policy's backend failed (``finish_reason == "error"``: its text is the
    backend's error, never the model's reply), else None."""
    if turn.finish_reason != "error":
        return None
    return UpstreamError(f"the policy's backend failed: {turn.text or 'no reason given'}")


def cpu_threads(requested: int = 0) -> int:
    """torch's CPU threads for serving: ``requested`` when > 0, else half the cores, at most 4. torch's default
    (every core) oversubscribes a shared host: SmolLM2-135M took 97 s for a request with it on a busy 2-core
    machine and 5 s with one thread."""
    import os

    if requested > 0:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores // 2))


def _json(body: dict[str, Any]) -> Any:
    """An answer of plain JSON values, rendered as is: a dict returned from a route goes through FastAPI's
    ``jsonable_encoder`` first, 1.8 ms a completions answer with its token ids and logprobs (json.dumps: 0.1 ms),
    in the event loop that shares the server's GIL with the engine's batching thread."""
    from fastapi.responses import JSONResponse

    return JSONResponse(content=body)


def _error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> Any:
    from fastapi.responses import JSONResponse

    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body)


def _error_body(status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI's error object, for the guards in front of the app (toolgym.serving.base.GuardBody)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _failure(exc: Exception) -> Any:
    """The answer to a request whose generation raised: 400 for the request's own fault (a ConfigError), 503
    while shutting down, 502 for a backend that failed upstream, else 500 (the client may retry)."""
    if isinstance(exc, ConfigError):
        return _error(400, str(exc), "invalid_request_error")
    if isinstance(exc, ServerClosed):
        return _error(503, str(exc), "server_error", code="server_shutting_down")
    if isinstance(exc, UpstreamError):
        return _error(502, str(exc), "server_error", code="upstream_error")
    return _error(500, f"{type(exc).__name__}: {exc}", "server_error")


def build_app(server: PolicyServer) -> Any:
    """The FastAPI application of ``server`` (routes under ``/v1`` and at the root)."""
    require("fastapi", why="toolgym serve runs on it")  # first: a missing package names its extra
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="toolgym serve", description="A toolgym policy behind the OpenAI chat API.")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":  # (loc is the byte offset, not a field)
            err = errors[0]
            why = (err.get("ctx") or {}).get("error", err.get("msg"))
            return _error(400, f"the body is not valid JSON: {why}", "invalid_request_error")
        problems = []
        for err in errors:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        return _error(400, "; ".join(problems) or "invalid request", "invalid_request_error", param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Any:  # unknown routes, wrong methods
        what = f"{request.method} {request.url.path}"
        message = f"{what}: {exc.detail}" if exc.status_code != 404 else f"no route {what}"
        return _error(exc.status_code, message, "invalid_request_error")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Any:  # a bug of ours: a JSON 500, never a trace
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")

    def wrong_model(name: str | None) -> Any:
        if not server.strict_model or name in (None, "", server.model_name):
            return None
        return _error(404, f"the model {name!r} does not exist; this server serves {server.model_name!r}",
                      "invalid_request_error", "model", "model_not_found")  # fmt: skip

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        model: dict[str, Any] = {
            "id": server.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "toolgym",
        }
        if server.context is not None:  # (vLLM's field: a rollout client checks its prompts fit)
            model["max_model_len"] = server.context
        return {"object": "list", "data": [model]}

    if server.weights is not None:  # vLLM's dev-mode routes (agents/openai_weights.py), at the root as there
        updates = server.weights

        @app.post("/pause")
        async def pause(mode: str = "keep") -> Any:
            if mode not in PAUSE_MODES:
                return _error(400, f"pause mode {mode!r} is not supported; supported: {', '.join(PAUSE_MODES)}",
                              "invalid_request_error", "mode")  # fmt: skip
            await asyncio.to_thread(server.gate.pause)  # (returns once the running batch has ended)
            return {"status": "paused"}

        @app.post("/resume")
        async def resume() -> dict[str, str]:
            server.gate.resume()
            return {"status": "resumed"}

        @app.get("/is_paused")
        async def is_paused() -> dict[str, bool]:
            return {"is_paused": server.gate.paused}

        @app.post("/collective_rpc", response_model=None)
        async def collective_rpc(rpc: CollectiveRpc) -> Any:
            try:
                return await asyncio.to_thread(updates.call, rpc)
            except Exception as exc:  # a wrong file or method: 400, the model unchanged
                return _failure(exc)

        @app.post("/reset_prefix_cache", response_model=None)
        async def reset_prefix_cache(reset_running_requests: bool = False) -> Any:
            # (between batches: nothing runs while the cache is dropped, so running requests need no reset)
            return await asyncio.to_thread(updates.reset_prefix_cache)

    @app.post("/v1/completions", response_model=None)
    @app.post("/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Any:
        from toolgym.agents import openai_completions as oc

        if (refused := wrong_model(req.model)) is not None:
            return refused
        futures: list[Future[_Reply]] = []
        try:
            prompts = oc.prompts_of(server, req)
            futures = oc.submit(server, req, prompts)
            replies = list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        except Exception as exc:  # the request's fault (400) or the policy's (5xx: the client may retry)
            return _failure(exc)
        finally:
            for f in futures:  # one choice failed (or the client left): the others not started are dropped
                f.cancel()
        return _json(oc.body(server, req, prompts, replies))

    @app.post("/v1/chat/completions", response_model=None)
    @app.post("/chat/completions", response_model=None)
    async def chat(req: ChatCompletionRequest) -> Any:
        if (refused := wrong_model(req.model)) is not None:
            return refused
        if req.stream and not req.top_logprobs and server.streams_tokens:
            sink = _Sink(asyncio.get_running_loop())
            try:
                futures = server.submit_request(req, sink)
            except Exception as exc:  # refused before the stream starts: a plain error answer
                return _failure(exc)
            head = {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": server.model_name,
            }
            events = live_events(server, head, req, sink, futures)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            replies = await server.replies(req)
        except Exception as exc:  # the request's fault (400) or the policy's (5xx: the client may retry)
            return _failure(exc)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        model = server.model_name
        usage = usage_block(replies)
        choices = [server.choice(i, r, req) for i, r in enumerate(replies)]
        if not req.stream:
            return _json(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage,
                }
            )
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = stream_events(server, head, replies, choices, req, usage if include_usage else None)
        return StreamingResponse(events, media_type="text/event-stream")

    return app
