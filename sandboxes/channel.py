"""Byte channels from the host to the supervisor: a docker exec stream or a child process's pipes.

Both carry the supervisor's frames (see `toolgym.sandboxes.inside`); this module only moves bytes and keeps
the host's deadline. A closed stream raises `ChannelClosed`, a missed deadline `ChannelTimeout`.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from typing import Any

from toolgym.sandboxes.inside.frames import FRAME, Blobs, decode, encode


class ChannelClosed(Exception):
    """The server's end went away (killed, crashed, or its container died)."""


class ChannelTimeout(Exception):
    """The server did not answer before the host's deadline."""


class Channel:
    """Frames over some byte stream; subclasses provide `_send` and `_recv_some`."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def _send(self, data: bytes) -> None:
        raise NotImplementedError

    def _recv_some(self, timeout: float) -> bytes:
        """Some bytes of the server's stdout; b"" at end of stream; ChannelTimeout when none came in time."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def request(
        self, header: dict[str, Any], blobs: Blobs | None, deadline: float
    ) -> tuple[dict[str, Any], Blobs]:
        try:
            self._send(encode(header, blobs))
        except OSError as exc:
            raise ChannelClosed(f"could not send to the sandbox: {exc}") from exc
        n, m = FRAME.unpack(self._take(FRAME.size, deadline))
        return decode(self._take(n, deadline), self._take(m, deadline))

    def _take(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("the sandbox did not answer in time")
            data = self._recv_some(left)
            if not data:
                raise ChannelClosed("the sandbox closed its stream")
            self._buf += data
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class PipeChannel(Channel):
    """A child process's stdin/stdout (process backend)."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        super().__init__()
        self.write_fd, self.read_fd = write_fd, read_fd

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def _recv_some(self, timeout: float) -> bytes:
        ready, _, _ = select.select([self.read_fd], [], [], timeout)
        if not ready:
            raise ChannelTimeout("the sandbox did not answer in time")
        try:
            return os.read(self.read_fd, 1 << 20)
        except OSError:
            return b""

    def close(self) -> None:
        for fd in (self.write_fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class DockerExecChannel(Channel):
    """A hijacked ``docker exec`` socket. Without a tty docker multiplexes the streams: each piece comes
    after an 8-byte header (stream id, 3 zero bytes, big-endian size). Stdout pieces are the supervisor's frames;
    stderr pieces are kept (bounded) for error messages."""

    STDERR_KEEP = 4096

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.stderr_tail = b""
        self._raw = bytearray()  # bytes read from the socket but not yet demultiplexed
        self._stream = 0
        self._left = 0

    def _send(self, data: bytes) -> None:
        self.sock.settimeout(None)
        self.sock.sendall(data)

    def _read_raw(self, timeout: float) -> bool:
        self.sock.settimeout(max(timeout, 0.0001))
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError as exc:
            raise ChannelTimeout("the sandbox did not answer in time") from exc
        except OSError:
            return False
        self._raw += data
        return bool(data)

    def _recv_some(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            if self._left == 0:
                if len(self._raw) < 8:
                    if not self._read_raw(deadline - time.monotonic()):
                        return b""
                    continue
                self._stream, self._left = self._raw[0], int.from_bytes(self._raw[4:8], "big")
                del self._raw[:8]
                continue
            if not self._raw and not self._read_raw(deadline - time.monotonic()):
                return b""
            piece = bytes(self._raw[: self._left])
            del self._raw[: len(piece)]
            self._left -= len(piece)
            if self._stream == 2:
                self.stderr_tail = (self.stderr_tail + piece)[-self.STDERR_KEEP :]
            elif piece:
                return piece

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
