"""``toolgym serve``: any ``Policy`` behind the OpenAI chat-completions API (standard library only).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (``messages``, ``tools``, ``temperature``,
``top_p``, ``max_tokens``/``max_completion_tokens``, ``stop``, ``seed``, ``n``, ``logprobs``), ``GET /health``.
Requests arriving together are answered by one batched ``policy.act`` call (a worker thread collects them
for ``batch_window_s``). Tool calls in the reply text (``<tool_call>{json}</tool_call>``) come back as
structured ``tool_calls``; with ``logprobs: true`` each choice carries ``logprobs.content`` and, as an
extension, ``token_ids``. Streaming is not supported (400).
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from toolgym.agents.policy import AssistantTurn, Policy, SamplingParams
from toolgym.errors import ConfigError

_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.S)


@dataclass
class _Job:
    conversation: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    future: Future[AssistantTurn]


class PolicyServer:
    """Serves ``policy`` on ``host:port`` (port 0 picks a free one; see ``.port``). ``start()`` runs it in
    background threads, ``serve_forever()`` in this one; ``close()`` stops it."""

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
        handler = type("Handler", (_Handler,), {"server_ref": self})
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port} ({exc}); pick another --port") from exc
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{self.port}/v1"

    def start(self) -> PolicyServer:
        self._worker.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="toolgym-serve", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._worker.start()
        try:
            self.httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
        self.httpd.server_close()
        self._jobs.put(None)

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- batching ----------------------------------------------------------------------------------------
    def submit(
        self, conversation: list[dict[str, Any]], tools: Any, sampling: SamplingParams
    ) -> Future[AssistantTurn]:
        fut: Future[AssistantTurn] = Future()
        self._jobs.put(_Job(conversation, tools, sampling, fut))
        return fut

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
                    turns = self.policy.act(
                        [j.conversation for j in jobs], [j.tools for j in jobs], sampling=sampling
                    )
                except Exception as exc:  # answered as a 500 to each waiting request
                    for j in jobs:
                        j.future.set_exception(exc)
                    continue
                for j, turn in zip(jobs, turns, strict=True):
                    j.future.set_result(turn)

    # ----- the API -----------------------------------------------------------------------------------------
    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat-completions response for one request body (raises ConfigError on a bad request)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ConfigError("'messages' must be a non-empty list of chat messages")
        if body.get("stream"):
            raise ConfigError("streaming is not supported by toolgym serve: send stream=false")
        n = int(body.get("n") or 1)
        if not 1 <= n <= 64:
            raise ConfigError(f"'n' must be between 1 and 64, got {n}")
        stop = body.get("stop") or ()
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
            top_p=float(body.get("top_p") or 1.0),
            max_new_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 256),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            seed=body.get("seed"),
        )
        tools = body.get("tools") or None
        futures = [self.submit(messages, tools, sampling) for _ in range(n)]
        turns = [f.result() for f in futures]
        choices = [self._choice(i, t, bool(tools), bool(body.get("logprobs"))) for i, t in enumerate(turns)]
        prompt_tokens = max((t.usage.get("prompt_tokens", 0) for t in turns), default=0)
        completion_tokens = sum(len(t.token_ids) for t in turns)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _choice(self, index: int, turn: AssistantTurn, with_tools: bool, logprobs: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text}
        finish = turn.finish_reason if turn.finish_reason != "error" else "stop"
        if with_tools and turn.message.tool_calls:
            message["tool_calls"] = [c.to_dict() for c in turn.message.tool_calls]
            message["content"] = _TOOL_CALL.sub("", turn.text).strip() or None
            finish = "tool_calls"
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
        if logprobs:
            decode = getattr(getattr(self.policy, "renderer", None), "decode", None)
            tokens = [decode([t]) if decode else "" for t in turn.token_ids]
            choice["logprobs"] = {
                "content": [
                    {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                    for tok, lp in zip(tokens, turn.logprobs, strict=False)
                ]
            }
            choice["token_ids"] = list(turn.token_ids)
        return choice


class _Handler(BaseHTTPRequestHandler):
    server_ref: PolicyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        return None

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path in ("/health", "/v1/health"):
            self._send(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            model = {"id": self.server_ref.model_name, "object": "model", "owned_by": "toolgym"}
            self._send(200, {"object": "list", "data": [model]})
        else:
            self._error(404, f"no route {self.path}: use /v1/chat/completions or /v1/models", "not_found")

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path}: use /v1/chat/completions", "not_found")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ConfigError("the request body must be a JSON object")
            self._send(200, self.server_ref.completion(body))
        except (ConfigError, json.JSONDecodeError, ValueError, TypeError) as exc:
            self._error(400, str(exc), "invalid_request_error")
        except Exception as exc:  # the policy failed: the client may retry
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")
