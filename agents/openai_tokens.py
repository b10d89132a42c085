"""The reply's text as the OpenAI API shows it (``toolgym serve``): where a stop string ends it, the
``<tool_call>`` blocks in it, and each token's raw bytes and text for ``logprobs``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.S)


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
