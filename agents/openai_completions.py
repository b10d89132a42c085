"""``POST /v1/completions`` of ``toolgym serve`` with token ids in and out, shaped as vLLM's server answers it (the
request body: ``openai_schema.CompletionRequest``). This is what ``engine: vllm`` with ``rollout_servers`` sends
(agents/vllm_policy.py), so the same client runs against vLLM on a GPU and against ``toolgym serve`` on a CPU."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from toolgym.agents.openai_schema import CompletionRequest
from toolgym.agents.openai_tokens import stop_at, token_text
from toolgym.errors import ConfigError

if TYPE_CHECKING:
    from toolgym.agents.openai_server import PolicyServer, _Reply


def prompts_of(server: PolicyServer, req: CompletionRequest) -> list[list[int]]:
    """The request's prompts as token ids (a string is tokenized without special tokens); ids out of the
    vocabulary are the caller's mistake (a ConfigError: answered 400)."""
    renderer: Any = server._renderer
    if renderer is None:
        raise ConfigError("this policy has no tokenizer: /v1/completions needs a token-level policy (hf:…)")
    if isinstance(req.prompt, str):
        prompts = [list(renderer.tokenizer.encode(req.prompt, add_special_tokens=False))]
    elif req.prompt and isinstance(req.prompt[0], list):
        prompts = [list(p) for p in req.prompt]  # type: ignore[arg-type]
    else:
        prompts = [list(req.prompt)]  # type: ignore[arg-type]
    if len(prompts) * req.n > server.max_choices:
        raise ConfigError(
            f"{len(prompts)} prompts x n={req.n} choices is more than this server takes in one request "
            f"({server.max_choices}): split the batch"
        )
    vocab = _vocab(server)
    for p in prompts:
        if not p:
            raise ConfigError("a prompt is empty")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"prompt token ids out of the vocabulary (size {vocab}): {bad[:5]}")
        problem = server.context_problem(len(p), req.max_tokens)
        if problem is not None:
            raise ConfigError(problem)
    return prompts


def _vocab(server: PolicyServer) -> int:
    model = getattr(server.policy, "model", None)
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if size:
        return int(size)
    return len(server._renderer.tokenizer)  # type: ignore[union-attr]


def submit(server: PolicyServer, req: CompletionRequest, prompts: list[list[int]]) -> list[Future[_Reply]]:
    """One job per prompt and choice (``n``), in the order vLLM numbers the choices (each job knows its index
    among its prompt's ``n``: a seeded request's choices get their own sampling keys)."""
    sampling = req.sampling()
    top = req.logprobs or 0
    return [server.submit([], None, sampling, top, None, c, p) for p in prompts for c in range(req.n)]


def body(
    server: PolicyServer, req: CompletionRequest, prompts: list[list[int]], replies: list[_Reply]
) -> dict[str, Any]:
    """The response: vLLM's ``text_completion`` object."""
    choices = [_choice(server, req, i, prompts[i // req.n], reply) for i, reply in enumerate(replies)]
    prompt_tokens = sum(len(p) for p in prompts) * req.n
    completion = sum(
        len(c.get("token_ids") or r.turn.token_ids) for c, r in zip(choices, replies, strict=True)
    )
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:24]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": server.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def _choice(
    server: PolicyServer, req: CompletionRequest, index: int, prompt: list[int], reply: _Reply
) -> dict[str, Any]:
    renderer: Any = server._renderer
    ids, lps = list(reply.turn.token_ids), list(reply.turn.logprobs)
    finish = reply.turn.finish_reason if reply.turn.finish_reason != "error" else "stop"
    stop_reason: int | str | None = None
    extra = set(req.stop_token_ids or ()) - set(renderer.stop_ids)
    if extra:  # stop ids beyond the end-of-turn ones: the reply ends at (and keeps) the first of them
        cut = next((k for k, t in enumerate(ids) if t in extra), None)
        if cut is not None:
            ids, lps, finish, stop_reason = ids[: cut + 1], lps[: cut + 1], "stop", ids[cut]
    text = renderer.decode(renderer.strip_stop(ids))
    where = stop_at(text, req.stops)
    if where is not None:
        hit = next(s for s in req.stops if text.startswith(s, where))
        text = text[: where + len(hit)] if req.include_stop_str_in_output else text[:where]
        finish, stop_reason = "stop", hit
    out: dict[str, Any] = {"index": index, "text": text, "finish_reason": finish, "stop_reason": stop_reason}
    if req.logprobs is not None:
        out["logprobs"] = _logprobs(server, req, ids, lps, reply)
    if req.return_token_ids:
        out["token_ids"] = ids
        out["prompt_token_ids"] = list(prompt)
    return out


def _logprobs(
    server: PolicyServer, req: CompletionRequest, ids: list[int], lps: list[float], reply: _Reply
) -> dict[str, Any]:
    tb = server._token_bytes

    def name(t: int) -> str:
        if req.return_tokens_as_token_ids or tb is None:
            return f"token_id:{t}"
        return token_text(tb(t))

    tops: list[dict[str, float]] = []
    offsets, at = [], 0
    for pos, (t, lp) in enumerate(zip(ids, lps, strict=True)):
        top = {name(i): v for i, v in reply.top[pos]} if pos < len(reply.top) else {}
        top.setdefault(name(t), lp)  # the sampled token is always there (vLLM's rule)
        tops.append(top)
        offsets.append(at)
        at += len(name(t)) if tb is None else len(token_text(tb(t)))
    return {
        "text_offset": offsets,
        "token_logprobs": lps,
        "tokens": [name(t) for t in ids],
        "top_logprobs": tops,
    }
