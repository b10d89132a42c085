"""A FastAPI app on uvicorn, bound up front (port 0 picks a free port), run in this thread or a background one."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal

from toolgym.errors import ConfigError
from toolgym.optional import require


def require_fastapi() -> None:
    """FastAPI and uvicorn, or a DependencyNotInstalled naming the extra."""
    require("fastapi")
    require("uvicorn")


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
    ) -> None:
        require_fastapi()
        self.app = app
        self.host = host
        self.lifespan = lifespan
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

        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan=self.lifespan)
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
