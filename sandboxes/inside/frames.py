"""The frame format between the host and the supervisor, and between the supervisor and its workers.

Frame: 8 bytes ``>II`` (header length, body length), a JSON header, then the raw body. The header's
``blobs`` lists ``[name, size]`` pairs that cut the body, so code, stdin and output travel as raw bytes.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

FRAME = struct.Struct(">II")
MAX_CTRL_REPLY = 1 << 20  # a worker's reply is small; a bigger one is forged by the code

Blobs = dict[str, bytes]


def encode(header: dict[str, Any], blobs: Blobs | None = None) -> bytes:
    """One frame holding ``header`` and the named byte strings ``blobs``.

    >>> decode(*split(encode({"op": "x"}, {"a": b"hi"})))
    ({'op': 'x'}, {'a': b'hi'})
    """
    blobs = blobs or {}
    head = json.dumps({**header, "blobs": [[k, len(v)] for k, v in blobs.items()]}).encode()
    return FRAME.pack(len(head), sum(len(v) for v in blobs.values())) + head + b"".join(blobs.values())


def split(frame: bytes) -> tuple[bytes, bytes]:
    """Cuts a whole frame into (header bytes, body): a helper for tests and doctests."""
    n, m = FRAME.unpack_from(frame)
    return frame[FRAME.size : FRAME.size + n], frame[FRAME.size + n : FRAME.size + n + m]


def decode(head: bytes, body: bytes) -> tuple[dict[str, Any], Blobs]:
    header = json.loads(head)
    blobs: Blobs = {}
    pos = 0
    for name, size in header.pop("blobs", []):
        blobs[name] = body[pos : pos + size]
        pos += size
    return header, blobs


def read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        data = os.read(fd, min(n, 1 << 20))
        if not data:
            raise EOFError("stream closed")
        chunks.append(data)
        n -= len(data)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[dict[str, Any], Blobs]:
    n, m = FRAME.unpack(read_exact(fd, FRAME.size))
    return decode(read_exact(fd, n), read_exact(fd, m))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
