"""A FastAPI app on uvicorn, bound up front (port 0 picks a free port), run in this thread or a background one.

Every server gets the same guards against hostile or broken clients (``Limits``): a request body past
``max_body_bytes`` is answered 413 before it is read whole, a body that does not arrive within
``body_timeout_s`` (a slow client dribbling bytes) 408, and past ``max_connections`` open connections uvicorn
answers 503; each in the server's own error shape (``error_body``)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from toolgym.errors import ConfigError
from toolgym.optional import require


def require_fastapi() -> None:
    """FastAPI and uvicorn, or a DependencyNotInstalled naming the extra."""
    require("fastapi")
    require("uvicorn")


@dataclass(frozen=True)
class Limits:
    """What one client may ask of a server. ``max_body_bytes``: a request body's size (64 MiB: a batch of long
    token-id prompts fits); ``body_timeout_s``: from the first byte of a body to its last; ``max_connections``:
    open connections (uvicorn's ``limit_concurrency``); ``keep_alive_s``: an idle kept-alive connection."""

    max_body_bytes: int = 64 * 2**20
    body_timeout_s: float = 60.0
    max_connections: int = 2048
    keep_alive_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.body_timeout_s <= 0 or self.max_connections < 1:
            raise ConfigError(f"server limits must be positive, got {self}")


ErrorBody = Callable[[int, str, str], dict[str, Any]]  # (status, message, code) -> the JSON body


def plain_error(status: int, message: str, code: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


class GuardBody:
    """ASGI middleware: reads a request's body before the app sees it, refusing one past
    ``limits.max_body_bytes`` (413, from its Content-Length before any byte is read, else once the bytes read
    pass it) and one that takes longer than ``limits.body_timeout_s`` to arrive (408); the app then gets the
    body whole. (FastAPI reads the whole body before a handler runs anyway, so nothing streams less.)"""

    DRAIN_BYTES = 16 * 2**20

    def __init__(self, app: Any, limits: Limits, error_body: ErrorBody) -> None:
        self.app, self.limits, self.error_body = app, limits, error_body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        deadline = time.monotonic() + self.limits.body_timeout_s
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            shown = length.decode(errors="replace")[:40]
            await self._drain(receive, deadline, int(length) if length.isdigit() else 0)
            await self._refuse(send, 413, f"the request body is {shown} bytes; this server takes at most {limit}",
                               "body_too_large")  # fmt: skip
            return
        chunks: list[bytes] = []
        read = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.001, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                await self._refuse(send, 408, f"the request body did not arrive within "
                                   f"{self.limits.body_timeout_s:g} s", "body_timeout")  # fmt: skip
                return
            if message["type"] == "http.disconnect":
                return  # the client went away before its request was whole: nothing to answer
            chunks.append(message.get("body", b""))
            read += len(chunks[-1])
            if read > limit:
                if message.get("more_body", False):
                    await self._drain(receive, deadline, 0)
                await self._refuse(send, 413, f"the request body is over {limit} bytes", "body_too_large")
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        given = False

        async def replay() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # (a disconnect, which a streamed response listens for)

        await self.app(scope, replay, send)

    async def _drain(self, receive: Any, deadline: float, length: int) -> None:
        """Reads and drops the rest of a refused body when it is at most ``DRAIN_BYTES`` (so the client, still
        sending, reads the 413 instead of a reset connection); a bigger one is cut off unread."""
        if length > self.DRAIN_BYTES:
            return
        dropped = 0
        while dropped <= self.DRAIN_BYTES and (left := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(receive(), timeout=left)
            except asyncio.TimeoutError:
                return
            dropped += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    async def _refuse(self, send: Any, status: int, message: str, code: str) -> None:
        body = json.dumps(self.error_body(status, message, code)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class AppServer:
    """Serves ``app`` on ``host:port``. ``start()`` runs uvicorn in a background thread (for tests and
    notebooks), ``serve_forever()`` in this one; ``close()`` stops it. Binding happens here, so a port in use
    is a ConfigError at construction, not a log line from a thread."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        lifespan: Literal["auto", "on", "off"] = "on",
        limits: Limits | None = None,
        error_body: ErrorBody = plain_error,
    ) -> None:
        require_fastapi()
        self.app = app
        self.host = host
        self.lifespan = lifespan
        self.limits = limits or Limits()
        self.error_body = error_body
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise ConfigError(f"cannot listen on {host}:{port} ({exc}); pick another --port") from exc
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _uvicorn(self) -> Any:
        import uvicorn

        config = uvicorn.Config(
            GuardBody(self.app, self.limits, self.error_body),
            log_level="warning",
            access_log=False,
            lifespan=self.lifespan,
            limit_concurrency=self.limits.max_connections,
            timeout_keep_alive=int(max(1, self.limits.keep_alive_s)),
            timeout_graceful_shutdown=10,
        )
        self._server = uvicorn.Server(config)
        return self._server

    def start(self, timeout_s: float = 60.0) -> AppServer:
        server = self._uvicorn()
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [self._sock]}, name="toolgym-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        try:
            self._uvicorn().run(sockets=[self._sock])
        finally:
            self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
