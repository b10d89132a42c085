"""Serve a reward function or :class:`~toolgym.rewards.rubric.Rubric` over HTTP, in the request and response
shape of OpenRLHF's remote reward model (``--remote_rm_url``), so remote trainers can call it.

Request: ``POST /get_reward`` with JSON ``{"query": [...], "prompts": [...], "labels": [...]}``. OpenRLHF's
``query`` is prompt + response; the prompt prefix is cut off so only the response is scored (a reward must
never see the prompt echo). ``labels`` becomes the gold column (``gold_key``); any other list of the same
length is passed as a column of that name.
Response: ``{"rewards": [...], "scores": [...], "extra_logs": {"valid": [...], part: [...]}}``. A None (not
applicable) is sent as ``none_value`` with ``valid`` 0. ``GET /health`` answers ``{"ok": true}``.
Standard library only (``http.server``), one thread per request.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from toolgym.errors import ConfigError
from toolgym.rewards.rubric import Rubric

MAX_BODY_BYTES = 256 * 1024 * 1024


def score_request(
    rubric: Rubric, payload: dict[str, Any], gold_key: str = "answer", none_value: float = 0.0
) -> dict[str, Any]:
    """The response to one OpenRLHF-style request (also usable without HTTP).

    >>> from toolgym.rewards.qa import exact_match
    >>> score_request(Rubric([exact_match]), {"query": ["Q: capital? <answer>Paris</answer>"], "prompts": ["Q: capital? "],
    ...                                       "labels": ["Paris"]})
    {'rewards': [1.0], 'scores': [1.0], 'extra_logs': {'valid': [1.0], 'exact_match': [1.0]}}
    >>> score_request(Rubric([exact_match]), {"query": ["<answer>x</answer>"], "labels": [[]]})["extra_logs"]["valid"]
    [0.0]
    """
    queries = payload.get("query", payload.get("queries"))
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ConfigError('the request needs "query": a list of strings (prompt + response).')
    n = len(queries)
    prompts = payload.get("prompts") or [""] * n
    if len(prompts) != n:
        raise ConfigError(f'"prompts" has {len(prompts)} items but "query" has {n}.')
    completions = [q[len(p) :] if p and q.startswith(p) else q for q, p in zip(queries, prompts, strict=True)]
    columns: dict[str, Any] = {}
    for key, value in payload.items():
        if key in ("query", "queries", "prompts") or not isinstance(value, list) or len(value) != n:
            continue
        columns[gold_key if key == "labels" else key] = value
    columns["prompts"] = prompts
    result = rubric.score(completions, **columns)
    rewards = [none_value if t is None else float(t) for t in result.total]
    extra: dict[str, list[float]] = {"valid": [0.0 if t is None else 1.0 for t in result.total]}
    for name, values in result.parts.items():
        extra[name] = [none_value if v is None else float(v) for v in values]
    return {"rewards": rewards, "scores": list(rewards), "extra_logs": extra}


def make_server(
    fn: Rubric | Callable[..., Any],
    host: str = "127.0.0.1",
    port: int = 5000,
    gold_key: str = "answer",
    none_value: float = 0.0,
) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving: call ``serve_forever()``; ``port=0`` picks a free port)."""
    rubric = fn if isinstance(fn, Rubric) else Rubric([fn])

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._reply(200, {"ok": True, "parts": rubric.names})
            else:
                self._reply(404, {"error": "POST /get_reward, or GET /health"})

        def do_POST(self) -> None:
            if self.path.rstrip("/") not in ("/get_reward", ""):
                self._reply(404, {"error": f"unknown path {self.path}; POST /get_reward"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self._reply(
                    413 if length else 400, {"error": f"body must be 1..{MAX_BODY_BYTES} bytes of JSON"}
                )
                return
            try:
                payload = json.loads(self.rfile.read(length))
                if not isinstance(payload, dict):
                    raise ConfigError("the request body must be a JSON object.")
                self._reply(200, score_request(rubric, payload, gold_key, none_value))
            except (json.JSONDecodeError, ConfigError) as exc:
                self._reply(400, {"error": str(exc)})
            except Exception as exc:  # a bad sample must not take the server down
                self._reply(500, {"error": f"{exc.__class__.__name__}: {exc}"})

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(fn: Rubric | Callable[..., Any], **kwargs: Any) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a background thread; returns it and its base URL (for tests and notebooks)."""
    server = make_server(fn, **{"port": 0, **kwargs})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return server, f"http://{host!s}:{port}"
