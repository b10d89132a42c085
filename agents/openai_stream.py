"""Server-sent events of ``toolgym serve``'s streamed replies: a finished reply sent token by token
(``stream_events``), or tokens sent as they are sampled (``live_events``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from toolgym.agents.openai_schema import ChatCompletionRequest
from toolgym.agents.openai_tokens import TOOL_CALL, TokenBytes, stop_at, stop_prefix_tail
from toolgym.agents.policy import AssistantTurn

if TYPE_CHECKING:
    from toolgym.agents.openai_server import PolicyServer, _Reply, _Sink


async def stream_events(
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


def usage_block(replies: Sequence[_Reply]) -> dict[str, int]:
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
            rest = TOOL_CALL.sub("", self.text[self.sent : end])
            self.sent = len(self.text)
            return rest if rest.strip() else ""
        return self._release(end)


async def live_events(
    server: PolicyServer,
    head: dict[str, Any],
    req: ChatCompletionRequest,
    sink: _Sink,
    futures: list[Future[_Reply]],
) -> AsyncIterator[str]:
    """SSE chunks sent while the reply is sampled: the role, each token's content (and logprob) as it
    arrives, then per choice its tool calls and finish reason once parsed, usage, [DONE]."""
    try:
        async for chunk in _live_chunks(server, head, req, sink, futures):
            yield chunk
    finally:  # the client disconnected (or the stream ended): choices not started are not generated
        for f in futures:
            f.cancel()


async def _live_chunks(
    server: PolicyServer,
    head: dict[str, Any],
    req: ChatCompletionRequest,
    sink: _Sink,
    futures: list[Future[_Reply]],
) -> AsyncIterator[str]:
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
        usage = usage_block(replies)
        yield event(None, usage=usage)
    yield "data: [DONE]\n\n"
