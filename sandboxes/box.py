"""One live sandbox instance on the host side: the supervisor behind a channel, and what it lives in.

A box turns channel faults into typed outcomes. The supervisor enforces each call's wall clock; the host
waits ``timeout + grace_s`` more and then gives up on the whole box. The code runs under another uid than
the supervisor and init and cannot signal, stop or ptrace them, and the OOM killer never picks them, so a
stream that closes or a deadline the supervisor misses is our infrastructure failing (``sandbox_error``:
container killed, daemon gone), never something the code did. Either way the box is marked broken and
the pool replaces it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from toolgym.sandboxes.channel import Channel, ChannelClosed, ChannelTimeout
from toolgym.sandboxes.inside.frames import Blobs
from toolgym.sandboxes.result import ExecResult, Status


class BoxFailure(Exception):
    """A call that got no reply; ``status`` is what the caller's result should say."""

    def __init__(self, status: Status, detail: str) -> None:
        super().__init__(detail)
        self.status: Status = status
        self.detail = detail


class Box:
    def __init__(
        self,
        channel: Channel,
        *,
        name: str,
        grace_s: float,
        is_running: Callable[[], bool],
        destroy: Callable[[], None],
    ) -> None:
        self.channel = channel
        self.name = name
        self.grace_s = grace_s
        self._is_running = is_running
        self._destroy = destroy
        self.lock = threading.RLock()
        self.broken: str | None = None
        self.last_used = time.monotonic()

    def call(
        self, header: dict[str, Any], blobs: Blobs | None = None, timeout: float = 5.0
    ) -> tuple[dict[str, Any], Blobs]:
        with self.lock:
            if self.broken:
                raise BoxFailure("sandbox_error", f"sandbox {self.name} is out of service: {self.broken}")
            deadline = time.monotonic() + timeout + self.grace_s
            try:
                reply, out = self.channel.request(header, blobs, deadline)
            except ChannelTimeout as exc:
                self.broken = "the supervisor stopped answering"
                raise BoxFailure(
                    "sandbox_error",
                    f"the sandbox supervisor did not answer within {timeout + self.grace_s:g} s",
                ) from exc
            except ChannelClosed as exc:
                running = self._safe_running(0.0)
                self.broken = "the supervisor is gone"
                what = "its supervisor exited" if running else "the sandbox died"
                raise BoxFailure("sandbox_error", f"sandbox {self.name}: {what} during the call") from exc
            finally:
                self.last_used = time.monotonic()
            if "error" in reply:
                self.broken = f"supervisor fault: {reply['error']}"
                raise BoxFailure("sandbox_error", f"sandbox supervisor fault: {reply['error']}")
            return reply, out

    def _safe_running(self, settle_s: float = 1.0) -> bool:
        """Whether the container still runs, asked a few times: a killed container's stream closes a
        moment before the daemon reports it as exited."""
        end = time.monotonic() + settle_s
        while True:
            try:
                if not self._is_running():
                    return False
            except Exception:
                return False
            if time.monotonic() > end:
                return True
            time.sleep(0.1)

    def ping(self) -> bool:
        try:
            self.call({"op": "ping"}, timeout=2.0)
            return True
        except BoxFailure:
            return False

    def reset(self) -> bool:
        """Kills every worker and wipes scratch; False when the box could not be made clean."""
        try:
            reply, _ = self.call({"op": "reset"}, timeout=10.0)
        except BoxFailure:
            return False
        if not reply.get("clean"):
            self.broken = "reset left processes or files behind, or changed the box: " + "; ".join(
                reply.get("problems") or []
            )
        return bool(reply.get("clean"))

    def destroy(self) -> None:
        self.broken = self.broken or "destroyed"
        try:
            self.channel.close()
        finally:
            with contextlib.suppress(Exception):
                self._destroy()


def to_result(reply: dict[str, Any], out: Blobs, restarted: bool = False, detail: str = "") -> ExecResult:
    """A supervisor exec reply as an ExecResult; bytes are decoded as UTF-8 with replacement characters."""
    return ExecResult(
        status=reply["status"],
        stdout=out.get("stdout", b"").decode("utf-8", "replace"),
        stderr=out.get("stderr", b"").decode("utf-8", "replace"),
        exit_code=reply.get("exit_code"),
        duration_s=float(reply.get("duration_s", 0.0)),
        truncated=bool(reply.get("truncated")),
        restarted=restarted,
        detail="; ".join(d for d in (detail, reply.get("detail", "")) if d),
    )
