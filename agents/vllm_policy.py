"""vLLM as a rollout engine (``engine: vllm``, docs/vllm.md): ``VLLMPolicy`` drives vLLM the way the tree rollout
drives our engine.

The tree rollout (trainers/rollout.py) runs continuously for any policy with an ``engine`` and a ``generation``:
each turn is submitted as soon as its tree is ready and comes back the step it ends. ``VLLMEngine`` gives vLLM
that surface (``new / extend / submit / step / busy / cancel / release / seed``) over one of two backends:

- ``LocalBackend``: an ``vllm.LLM`` in this process (colocated with the trainer): a turn is
  ``llm_engine.add_request(rid, tokens_input(ids), params)``, ``step()`` is ``llm_engine.step()``.
- ``ServerBackend``: OpenAI-compatible servers (``vllm serve`` or ``toolgym serve``): a turn is one
  ``POST /v1/completions`` with the prompt as a list of token ids, ``logprobs``, ``return_token_ids`` and
  ``return_tokens_as_token_ids``, on a thread pool; ``step()`` returns the requests that came back.

Tokens: the prompt goes in as ids (never re-tokenized) and the sampled ids come back as ids, with the logprob of
each under the distribution it was drawn from (vLLM's ``logprobs_mode="processed_logprobs"``: after temperature
and top-p, as ``HFPolicy`` reports; greedy turns report ``softmax(logits)``). A turn stops at the renderer's
end-of-turn ids (``stop_token_ids``, with ``ignore_eos`` so that vLLM's own EOS adds nothing) or at a stop
string; the token that ends it is part of the turn, as in our engine.

Forks and continued turns are new requests whose prompt shares the prefix of an earlier one: vLLM's prefix cache
(``enable_prefix_caching``) finds the shared blocks. With several servers a request goes where its prefix is
cached: to the server of the longest earlier prompt or prompt + reply that it extends (every turn of an episode,
and every fork of a tree, extends its tree's first prompt), otherwise to the least loaded server.

Weights: ``refresh()`` (called by the rollout before each batch) pushes the trainer's weights when they changed
since the last push (``weights_version``): colocated, in-process ``model.load_weights`` on vLLM's model; servers,
an NCCL broadcast through vLLM's weight-transfer endpoints (``NcclSync``) or a safetensors folder reloaded by
``/collective_rpc reload_weights`` (``DiskSync``). ``sleep()`` (called before the update) frees vLLM's GPU memory
when it was built with ``enable_sleep_mode`` (level 2: the weights are re-pushed on wake-up anyway).

Departures: (1) entropies (``return_entropies``) come from the top-20 logprobs vLLM returns plus the rest of
the mass spread evenly over the other tokens: an estimate, not the exact entropy our engine reports; (2) sampling
is seeded per request (vLLM's per-request generators) only with ``seeded=True`` or for a keyed turn (``submit(key=)``,
the trainers' ``rollout_keys``: seed = a hash of (key, start position)): by default a run is seeded once (the
engine's seed), so vLLM runs are not bit-reproducible; (3) ``top_k`` beyond 0 is passed through.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import queue
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from toolgym.agents.episode_loop import TurnFailed
from toolgym.agents.policy import FinishReason, Generation, RenderedTokenPolicy, SamplingParams
from toolgym.agents.rendering import ChatRenderer, ToolRole
from toolgym.errors import ConfigError, InfrastructureError

if TYPE_CHECKING:
    from toolgym.agents.engine.seq import Seq

TOP_FOR_ENTROPY = 20  # vLLM's default max_logprobs


# ----- one request's result, whichever backend ran it ------------------------------------------------------
@dataclass
class Completed:
    """A finished turn: sampled ids, their logprobs, why it ended, and (for entropies) each step's top logprobs."""

    token_ids: list[int]
    logprobs: list[float]
    finish: FinishReason
    top: list[list[float]] | None = None


def entropy_estimate(top: Sequence[float], vocab: int) -> float:
    """Entropy of a distribution known by its top logprobs; the mass left is spread evenly over the other tokens.

    >>> round(entropy_estimate([math.log(0.5), math.log(0.5)], 2), 6)
    0.693147
    >>> entropy_estimate([0.0], 10)
    0.0
    """
    probs = [math.exp(v) for v in top if v > -math.inf]
    h = -sum(p * math.log(p) for p in probs if p > 0)
    rest, others = max(0.0, 1.0 - sum(probs)), max(1, vocab - len(probs))
    if rest > 1e-9:
        h -= rest * math.log(rest / others)
    return max(0.0, h)


def sampling_body(
    sp: Any, max_new: int, stop: Sequence[str], stop_ids: Sequence[int], top: int
) -> dict[str, Any]:
    """The request's sampling fields, as both vLLM's ``SamplingParams`` and its completions API name them.

    Everything the server might otherwise take from the model's generation config is given: temperature, top-p,
    top-k, min-p, no repetition penalty, no EOS of its own (vLLM 0.26: ``ModelConfig.get_diff_sampling_param``)."""
    temperature, top_p = float(max(sp.temperature, 0.0)), float(sp.top_p)
    if temperature > 2.0 or not 0.0 < top_p <= 1.0:  # vLLM refuses these (a 400, or a ValueError colocated)
        raise ConfigError(
            f"vLLM takes temperature in [0, 2] and top_p in (0, 1], got {temperature} and {top_p}"
        )
    return {
        "max_tokens": int(max_new),
        "temperature": temperature,
        "top_p": top_p,
        "top_k": int(getattr(sp, "top_k", 0) or 0),
        "min_p": 0.0,  # (a server takes min_p from the model's generation config unless it is given)
        "repetition_penalty": 1.0,
        "stop": list(stop),
        "stop_token_ids": sorted(int(i) for i in stop_ids),
        "ignore_eos": True,
        "logprobs": int(top),
    }


class Backend(Protocol):
    def submit(self, rid: str, ids: list[int], body: dict[str, Any]) -> None: ...

    def poll(self) -> list[tuple[str, Completed]]:
        """Requests that ended since the last call (blocks until one ends while any is in flight)."""
        ...

    def cancel(self, rid: str) -> None: ...

    def reset(self) -> None:
        """New weights: drop what depends on the old ones (the prefix cache, the routing table)."""
        ...


# ----- colocated: vllm.LLM in this process -----------------------------------------------------------------
class LocalBackend:
    """Requests to an ``vllm.LLM``'s engine in this process, one ``llm_engine.step()`` per ``poll``."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.engine = llm.llm_engine
        self.live: set[str] = set()
        self.finished: list[tuple[str, Completed]] = []  # ended, not yet returned (a poll that raised)
        self.late_failures: list[RequestFailed] = []  # a second failure of one step waits for the next poll

    def submit(self, rid: str, ids: list[int], body: dict[str, Any]) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: a step returns the requests that ended, not every running request's output so far
        params = VSamplingParams(**body, output_kind=RequestOutputKind.FINAL_ONLY)
        # the engine's own input (what LLM.generate renders a TokensPrompt to): vLLM 0.26 still takes a raw
        # TokensPrompt here but warns that it is deprecated
        self.engine.add_request(rid, tokens_input(list(ids)), params)
        self.live.add(rid)

    def poll(self) -> list[tuple[str, Completed]]:
        """Requests that ended this engine step; one vLLM did not end well raises ``RequestFailed`` after the
        others are kept for the next poll (never dropped)."""
        if self.finished:
            out, self.finished = self.finished, []
            return out
        if self.late_failures:
            raise self.late_failures.pop(0)
        out, failed = [], None
        for res in self.engine.step():
            if not res.finished:
                continue
            rid = str(res.request_id)
            self.live.discard(rid)
            try:
                out.append((rid, completed_from_output(res.outputs[0])))
            except InfrastructureError as exc:
                if failed is None:
                    failed = RequestFailed(rid, str(exc))
                else:
                    self.late_failures.append(RequestFailed(rid, str(exc)))
        if failed is not None:
            self.finished += out
            raise failed
        return out

    def pending(self) -> bool:
        """Whether any request may still end (in flight, or ended and not yet returned)."""
        return bool(self.live or self.finished or self.late_failures)

    def cancel(self, rid: str) -> None:
        if rid in self.live:
            self.engine.abort_request([rid])
            self.live.discard(rid)

    def reset(self) -> None:
        # vLLM answers False (and keeps the cache) while running requests hold blocks: those are then preempted
        # and recomputed, so no turn reads a cached prefix of the old weights
        if not self.llm.reset_prefix_cache():
            self.llm.reset_prefix_cache(reset_running_requests=True)


def completed_from_output(out: Any) -> Completed:
    """A ``Completed`` from vLLM's ``CompletionOutput`` (``logprobs``: one ``{id: Logprob}`` per sampled token)."""
    if out.finish_reason not in ("stop", "length"):  # "abort", "error", "repetition": a turn it did not end
        raise InfrastructureError(f"vLLM ended a turn with finish_reason {out.finish_reason!r}")
    ids = [int(t) for t in out.token_ids]
    steps = list(out.logprobs or [])
    if len(steps) != len(ids):
        raise InfrastructureError(f"vLLM returned {len(steps)} logprob steps for {len(ids)} tokens")
    lps = [float(step[t].logprob) for t, step in zip(ids, steps, strict=True)]
    top = [sorted((float(v.logprob) for v in step.values()), reverse=True) for step in steps]
    return Completed(ids, lps, _finish(out.finish_reason), top)


def _finish(reason: Any) -> FinishReason:
    return "length" if reason == "length" else "stop"


# ----- external servers: OpenAI-compatible /v1/completions with token ids -----------------------------------
class ServerBackend:
    """Requests to OpenAI-compatible servers (``vllm serve``, ``toolgym serve``), ``workers`` in flight at most.

    A request goes to the server whose prefix cache holds the longest earlier sequence it extends (sticky
    sessions: an episode's turns and a tree's forks stay on one server), else to the least loaded one. Sequences
    are matched by a rolling hash of their ids at every earlier sequence's length (one pass over the prompt). A
    server that cannot be reached, times out, answers 5xx, 429 or 408, or answers a broken body (ids or logprobs
    that do not line up, the wrong prompt echoed back) is skipped for that request (the next one is tried: the
    request loses its cached prefix, not the rollout), and is then marked down for ``cooldown_s`` (doubled per
    failure in a row, at most 60 s): new requests and sticky ones go to live servers meanwhile (a hung server
    would otherwise cost every request routed to it a whole ``timeout``). A request that moved is re-routed to
    where it ran, so the episode's next turns follow it there. A server that comes back takes requests again
    after its cooldown; with ``track_weights`` (the trainer pushes weights to the servers), one that could not
    be reached at all (a restart: it came back with the weights it was started with) takes none until the next
    push (``pushed()``): its turns would be sampled from stale weights and trained on as on-policy."""

    MAX_ROUTES = 200_000  # forget the routing table past this many sequences (an evaluation that never syncs)
    ROUNDS = 3  # passes over every server before a request is an InfrastructureError (a restart, a spike)
    RETRY_STATUS = (408, 429)  # (with 5xx) a busy or restarting server, not a wrong request

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        workers: int = 256,
        timeout: float = 600.0,
        cooldown_s: float = 5.0,
    ) -> None:
        import httpx
        import urllib3

        if not urls:
            raise ConfigError("rollout_servers is empty: give at least one URL")
        self.urls = [u.rstrip("/").removesuffix("/v1") for u in urls]
        self.model = model
        self.workers, self.timeout = workers, timeout  # (a twin backend is made with the same: ``twin``)
        # (direct, as the turns' urllib3 pool is: an HTTP_PROXY meant for the internet must not carry the
        # weight pushes and health checks to servers on the cluster's own network)
        self.client = httpx.Client(
            timeout=timeout, limits=httpx.Limits(max_connections=workers), trust_env=False
        )
        # the turns themselves go through urllib3: half httpx's CPU a request (1.1 vs 2.3 ms with 64 threads,
        # 2-core machine), and that CPU is taken from the GIL the trainer's update shares with its rollouts
        self.turns = urllib3.PoolManager(
            maxsize=workers, retries=False, timeout=urllib3.Timeout(connect=timeout, read=timeout)
        )
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="rollout-server")
        self.futures: dict[Future[Completed], str] = {}
        # each request's future as it ends (its done-callback puts it): a poll takes what ended instead of
        # waiting on every future in flight (a waiter added to and removed from each, per poll: quadratic in
        # the requests of a step, and in the trainer's GIL beside its update)
        self.ended: queue.SimpleQueue[Future[Completed]] = queue.SimpleQueue()
        self.server_of: dict[Future[Completed], int] = {}  # the server a request was routed to
        self.by_rid: dict[str, Future[Completed]] = {}
        self.load = [0] * len(self.urls)
        self.routes: dict[
            tuple[int, int], int
        ] = {}  # (length, hash) of an earlier prompt or prompt + reply -> server
        self.lengths: set[int] = set()
        self.lock = threading.Lock()
        self.requests = 0
        self.failovers = 0
        self.sent: list[tuple[int, list[int]]] = []  # (server, prompt) of each request since the last reset
        self.vocab: int | None = None  # the model's vocabulary (set by VLLMEngine): sampled ids are checked
        self.backoff_s = 2.0  # before the second pass over the servers (doubled for each further one)
        self.cooldown_s = cooldown_s
        self.down_until = [0.0] * len(self.urls)  # (monotonic) a server that failed is not chosen until then
        self.strikes = [0] * len(self.urls)  # failures in a row
        self.finished: list[tuple[str, Completed]] = []  # ended, not yet returned (a poll that raised)
        self.track_weights = False  # set when the trainer pushes weights to the servers (nccl, disk)
        self.stale = [False] * len(self.urls)  # unreachable since the last push: may have restarted

    def twin(self) -> ServerBackend:
        """A backend over the same servers with requests, routes, health and thread pool of its own: two
        threads' rollouts (an asynchronous run's worker and the learner's evaluations) never take each other's
        answers, and a weight push's control requests never queue behind a pool full of paused turns."""
        out = ServerBackend(
            self.urls,
            model=self.model,
            workers=self.workers,
            timeout=self.timeout,
            cooldown_s=self.cooldown_s,
        )
        out.vocab, out.track_weights = self.vocab, self.track_weights
        return out

    def is_down(self, server: int) -> bool:
        return time.monotonic() < self.down_until[server] or self.stale[server]

    def pushed(self) -> None:
        """The trainer's weights reached every server: those that were unreachable hold them again."""
        with self.lock:
            self.stale = [False] * len(self.urls)

    def mark(self, server: int, ok: bool) -> None:
        """A request's outcome on ``server``: a failure puts it in cooldown, a success ends that."""
        with self.lock:
            if ok:
                self.strikes[server], self.down_until[server] = 0, 0.0
                return
            self.strikes[server] += 1
            wait = min(60.0, self.cooldown_s * 2 ** (self.strikes[server] - 1))
            self.down_until[server] = time.monotonic() + wait

    def server_for(self, ids: Sequence[int]) -> int:
        """The server of the longest earlier sequence that ``ids`` extends, else the least loaded one (servers in
        cooldown only when every server is)."""
        up = [i for i in range(len(self.urls)) if not self.is_down(i)] or list(range(len(self.urls)))
        at = prefix_hashes(ids, self.lengths)
        for n in sorted(at, reverse=True):
            hit = self.routes.get((n, at[n]))
            if hit is not None and hit in up:
                return hit
            if hit is not None:
                break  # its server is down: the prefix is lost there anyway
        return min(up, key=lambda i: self.load[i])

    def _order(self, server: int) -> list[int]:
        """The servers to try for a request routed to ``server``: it first, then the others round robin, those in
        cooldown last."""
        ring = [(server + k) % len(self.urls) for k in range(len(self.urls))]
        return sorted(ring, key=self.is_down)  # (stable: round robin within live and within down)

    def remember(self, ids: Sequence[int], server: int) -> None:
        if len(self.routes) > self.MAX_ROUTES:
            self.routes.clear()
            self.lengths.clear()
        n = len(ids)
        self.routes[(n, prefix_hashes(ids, {n})[n])] = server
        self.lengths.add(n)

    def move(self, ids: Sequence[int], old: int, new: int) -> None:
        """``ids`` ran on ``new`` instead of ``old``: every earlier sequence it extends that was routed to
        ``old`` (its tree's prompt, its earlier turns) is routed to ``new``, where that prefix is cached now."""
        for n, h in prefix_hashes(ids, self.lengths).items():
            if self.routes.get((n, h)) == old:
                self.routes[(n, h)] = new

    def submit(self, rid: str, ids: list[int], body: dict[str, Any]) -> None:
        with self.lock:
            server = self.server_for(ids)
            self.remember(ids, server)
            self.load[server] += 1
            if len(self.sent) < 100_000:
                self.sent.append((server, list(ids)))
        payload = dict(body, prompt=list(ids), return_token_ids=True, return_tokens_as_token_ids=True)
        if self.model:
            payload["model"] = self.model
        fut = self.pool.submit(self._post, server, ids, payload)
        self.server_of[fut] = server
        self.futures[fut] = rid
        self.by_rid[rid] = fut
        self.requests += 1
        fut.add_done_callback(self.ended.put)  # (after it is registered: it may have ended already)

    def _post(self, server: int, ids: list[int], payload: dict[str, Any]) -> Completed:
        from urllib3.exceptions import HTTPError, NewConnectionError

        body = json.dumps(payload).encode()
        errors: list[str] = []
        n = len(self.urls)
        order: list[int] = []
        try:
            for k in range(n * self.ROUNDS):
                if k and k % n == 0:  # every server failed this pass: wait, then try them again
                    time.sleep(self.backoff_s * 2 ** (k // n - 1))
                if k % n == 0:
                    order = self._order(server)
                    if all(self.stale[i] for i in order):
                        raise InfrastructureError(
                            "every rollout server was unreachable since the last weight push: their weights may "
                            "be the ones they were started with (a restart); errors: " + "; ".join(errors)
                        )
                    order = [i for i in order if not self.stale[i]]
                if k % n >= len(order):
                    continue  # (a stale server is not tried: its answers would be off-policy)
                at = order[k % n]
                url = f"{self.urls[at]}/v1/completions"
                try:
                    resp = self.turns.request("POST", url, body=body, headers=JSON_HEADERS)
                except HTTPError as exc:  # (a timeout is one; so is a connection cut mid-answer)
                    errors.append(f"{self.urls[at]} unreachable: {type(exc).__name__}: {exc}")
                    self.failovers += 1
                    self.mark(at, ok=False)
                    # refused: down, and it may restart (a timeout is not: it may still hold its weights)
                    if self.track_weights and isinstance(exc, NewConnectionError):
                        with self.lock:
                            self.stale[at] = True
                    continue
                if resp.status >= 500 or resp.status in self.RETRY_STATUS:
                    errors.append(f"{url} answered {resp.status}: {_text(resp.data)}")
                    self.failovers += 1
                    self.mark(at, ok=False)
                    continue
                if resp.status != 200:  # the request itself is wrong: another server would refuse it too
                    raise InfrastructureError(
                        f"rollout server {url} answered {resp.status}: {_text(resp.data)}"
                    )
                try:  # a broken answer is that server's fault: the next one is tried, as for a 5xx
                    done = completed_from_answer(
                        resp.data, int(payload.get("max_tokens") or 0), self.vocab, ids
                    )
                except InfrastructureError as exc:
                    errors.append(f"{url} answered 200 with a broken body: {exc}")
                    self.failovers += 1
                    self.mark(at, ok=False)
                    continue
                self.mark(at, ok=True)
                with self.lock:
                    if at != server:  # it moved: its forks and next turns follow it to where it is cached
                        self.move(ids, server, at)
                    self.remember([*ids, *done.token_ids], at)
                return done
        finally:
            with self.lock:
                self.load[server] -= 1
        raise InfrastructureError("no rollout server answered: " + "; ".join(errors))

    def poll(self) -> list[tuple[str, Completed]]:
        """Requests that ended. A request that failed raises ``RequestFailed`` (naming it); the others that ended
        with it are kept for the next poll, never dropped (their callers would wait for them forever)."""
        if self.finished:
            out, self.finished = self.finished, []
            return out
        if not self.futures:
            return []
        ready = [self.ended.get()]  # (every future in `futures` is in flight or queued there: this returns)
        while True:
            try:
                ready.append(self.ended.get_nowait())
            except queue.Empty:
                break
        ready = [fut for fut in ready if fut in self.futures]  # (a cancelled one ended too)
        out, failed = [], None
        for fut in ready:
            rid = self.futures.pop(fut)
            self.by_rid.pop(rid, None)
            self.server_of.pop(fut, None)
            try:
                out.append((rid, fut.result()))
            except Exception as exc:
                if failed is not None:  # one error a poll; the rest wait for the next one
                    self.futures[fut], self.by_rid[rid] = rid, fut
                    self.ended.put(fut)
                    continue
                failed = RequestFailed(rid, f"{type(exc).__name__}: {exc}" if not isinstance(
                    exc, InfrastructureError) else str(exc))  # fmt: skip
        if failed is not None:
            self.finished += out
            raise failed
        return out

    def pending(self) -> bool:
        """Whether any request may still end (in flight, or ended and not yet returned)."""
        return bool(self.futures or self.finished)

    def cancel(self, rid: str) -> None:
        fut = self.by_rid.pop(rid, None)
        if fut is not None:
            server = self.server_of.pop(fut, None)
            if fut.cancel() and server is not None:  # never sent: its _post will not count it off
                with self.lock:
                    self.load[server] -= 1
            # (a request already sent runs to its end; its result is dropped)
            self.futures.pop(fut, None)

    def reset(self) -> None:
        with self.lock:
            self.routes.clear()
            self.lengths.clear()
            self.sent.clear()

    def check_context(self, capacity: int) -> None:
        """A ConfigError when a server's ``max_model_len`` (``GET /v1/models``, as vLLM reports it) is below
        ``capacity`` (the longest prompt + reply the rollout sends): its requests past it would be answered 400
        mid-run. A server that does not answer or report it is not checked (it is tried per request)."""
        for url in self.urls:
            try:
                resp = self.client.get(f"{url}/v1/models", timeout=10.0)
                models = resp.json().get("data") or [{}]
                size = models[0].get("max_model_len")
            except Exception:  # unreachable or not vLLM's shape: per-request failover handles it
                continue
            if isinstance(size, int) and size < capacity:
                raise ConfigError(
                    f"rollout server {url} has max_model_len {size}, below the rollout's {capacity} tokens "
                    "(max_total_tokens + max_new_tokens + 8): start it with --max-model-len "
                    f"{capacity} or lower max_total_tokens"
                )

    def post_all(self, path: str, body: dict[str, Any] | None = None) -> list[Any]:
        """``POST path`` to every server at once; their JSON answers (a failure raises)."""
        return list(self.pool.map(lambda url: _post(self, url, path, body), self.urls))

    def reset_prefix_caches(self) -> None:
        """Drop every server's prefix cache (after new weights; a dev endpoint: ``VLLM_SERVER_DEV_MODE=1``).

        vLLM answers ``{"success": false}`` (and keeps the cache) while running requests hold blocks (another
        rank's turns): those servers are asked again with their running requests preempted and recomputed."""
        answers = self.post_all("/reset_prefix_cache")
        for url, got in zip(self.urls, answers, strict=True):
            if isinstance(got, dict) and got.get("success") is False:
                _post(self, url, "/reset_prefix_cache?reset_running_requests=true", {})

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        self.turns.clear()


class RequestFailed(TurnFailed):
    """A request no rollout server answered (``rid`` names it): an infrastructure failure, not the model's.
    Out of `VLLMEngine.step` it names the turn's sequence too (``seq``)."""

    def __init__(self, rid: str, message: str) -> None:
        super().__init__(message)
        self.rid = rid


def prefix_hashes(ids: Sequence[int], lengths: set[int]) -> dict[int, int]:
    """A hash of ``ids[:n]`` for each ``n`` in ``lengths`` that ``ids`` reaches: the prefix sums of
    ``(id + 1) * M**position`` modulo 2**64 (numpy's wrapping uint64: one vectorised pass, where a Python loop
    cost the trainer ~0.3 ms a 500-token prompt, three times a request, in the GIL its update needs). Two
    prefixes that collide only route a request to a server that lacks its cache.

    >>> a = prefix_hashes([1, 2, 3], {2, 3, 9}); a[2] == prefix_hashes([1, 2], {2})[2], sorted(a)
    (True, [2, 3])
    >>> prefix_hashes([1, 2], {2}) != prefix_hashes([2, 1], {2})
    True
    """
    want = sorted(n for n in lengths if 0 < n <= len(ids))
    if not want:
        return {}
    top = want[-1]
    weights = _powers(top)
    sums = np.cumsum((np.asarray(ids[:top], dtype=np.uint64) + np.uint64(1)) * weights[:top], dtype=np.uint64)
    picked = sums[np.asarray(want) - 1].tolist()
    return dict(zip(want, picked, strict=True))


_POWERS = np.ones(1, dtype=np.uint64)


def _powers(n: int) -> Any:
    """``M**k`` modulo 2**64 for k < n (at least), kept and grown by doubling."""
    global _POWERS
    have = _POWERS
    while len(have) < n:  # the next block is this one times M**len (wrapping)
        step = have[-1:] * np.uint64(_HASH_M)  # (arrays wrap silently; numpy scalars warn on overflow)
        have = np.concatenate([have, have * step])
    _POWERS = have
    return have


_HASH_M = 0x9E3779B97F4A7C15  # odd (invertible modulo 2**64): distinct positions weigh differently


JSON_HEADERS = {"Content-Type": "application/json"}


def _text(raw: bytes, n: int = 300) -> str:
    """The start of an answer's body, for an error message."""
    return raw[:n].decode("utf-8", "replace")


def completed_from_answer(
    raw: bytes, max_tokens: int, vocab: int | None, prompt: Sequence[int] | None = None
) -> Completed:
    """The first choice of a completions answer, checked: JSON with a ``choices`` list, ids in the vocabulary, at
    most ``max_tokens`` of them (0: unchecked), one finite logprob <= 0 per id, and the prompt it echoes
    (``prompt_token_ids``, when it does) equal to ``prompt``. Anything else is an InfrastructureError: a turn
    whose ids and logprobs do not line up, or that continued another prompt, would be trained on silently."""
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        if not isinstance(choice, dict):
            raise TypeError(f"a choice is a {type(choice).__name__}")
        if choice.get("finish_reason") not in ("stop", "length"):  # vLLM's "abort": a turn it did not end
            raise InfrastructureError(f"the turn ended with finish_reason {choice.get('finish_reason')!r}")
        done = completed_from_choice(choice)
        echoed = choice.get("prompt_token_ids")
        if prompt is not None and echoed is not None and list(echoed) != list(prompt):
            where = next(
                (i for i, (a, b) in enumerate(zip(echoed, prompt, strict=False)) if a != b),
                min(len(echoed), len(prompt)),
            )
            raise InfrastructureError(
                f"the server echoed a prompt of {len(echoed)} ids that differs from the {len(prompt)} sent "
                f"(first at position {where}): it did not continue this prompt"
            )
    except InfrastructureError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise InfrastructureError(f"{type(exc).__name__}: {exc}; body {_text(raw, 200)!r}") from None
    top = vocab if vocab else float("inf")
    bad = [t for t in done.token_ids if not 0 <= t < top]
    if bad:
        raise InfrastructureError(f"sampled ids outside the vocabulary ({vocab}): {bad[:5]}")
    if max_tokens and len(done.token_ids) > max_tokens:
        raise InfrastructureError(f"{len(done.token_ids)} tokens for max_tokens {max_tokens}")
    if not all(math.isfinite(v) and v <= 1e-3 for v in done.logprobs):  # (a little slack for rounding)
        raise InfrastructureError(f"logprobs that are not log-probabilities: {done.logprobs[:8]}")
    return done


def completed_from_choice(choice: dict[str, Any]) -> Completed:
    """A ``Completed`` from a completions choice: ids from ``token_ids`` (vLLM's ``return_token_ids``) or the
    ``token_id:N`` tokens of ``return_tokens_as_token_ids``, logprobs from ``logprobs.token_logprobs``.

    >>> c = completed_from_choice({"token_ids": [5, 2], "finish_reason": "stop",
    ...     "logprobs": {"tokens": ["token_id:5", "token_id:2"], "token_logprobs": [-0.5, -1.0], "top_logprobs": None}})
    >>> c.token_ids, c.logprobs, c.finish
    ([5, 2], [-0.5, -1.0], 'stop')
    """
    lp = choice.get("logprobs") or {}
    tokens = lp.get("tokens") or []
    ids = choice.get("token_ids")
    if ids is None:
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise InfrastructureError("the server returned neither token_ids nor token_id:N tokens")
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    lps = lp.get("token_logprobs")
    if not isinstance(ids, list) or not isinstance(lps, list) or len(lps) != len(ids):
        raise InfrastructureError(f"the server returned {len(lps or [])} logprobs for {len(ids)} tokens")
    top = None
    if lp.get("top_logprobs"):
        top = [sorted((float(v) for v in (d or {}).values()), reverse=True) for d in lp["top_logprobs"]]
    if any(v is None for v in lps):  # (was read as 0.0: a certainty the server never reported)
        raise InfrastructureError(f"the server returned a null logprob: {lps[:8]}")
    lps_f = [float(v) for v in lps]
    if not all(type(i) is int for i in ids):  # (int("7") or int(7.9) would pass a wrong id on)
        raise InfrastructureError(f"token ids that are not integers: {ids[:5]}")
    return Completed(list(ids), lps_f, _finish(choice.get("finish_reason")), top)


# ----- the engine surface the tree rollout drives -------------------------------------------------------------
@dataclass
class _Cache:
    capacity: int


class VLLMEngine:
    """Our ``Engine``'s sequence API over a vLLM backend (continuous: ``submit`` any time, ``step`` returns the
    turns that ended). A sequence's ids grow by each turn's reply, as in our engine; its sequences are our
    engine's ``Seq`` (imported when the first is made: importing this module does not import torch)."""

    def __init__(
        self, backend: Backend, *, capacity: int, stop_ids: Sequence[int], vocab: int, seeded: bool = False
    ) -> None:
        self.backend = backend
        self.cache = _Cache(capacity)
        self.stop_ids = tuple(sorted(stop_ids))
        self.vocab = vocab
        if isinstance(backend, ServerBackend):
            backend.vocab = vocab  # (its answers' ids are checked against it)
        self.seeded = seeded
        self.live: dict[str, Seq] = {}
        self.idle: dict[int, Seq] = {}  # (our engine's held caches; vLLM's prefix cache holds them here)
        self._ids = itertools.count()
        self._seed = 0
        self.requests = 0

    def new(self, ids: Sequence[int], tag: Any = None) -> Seq:
        if not ids:
            raise ConfigError("a sequence needs at least one token")
        from toolgym.agents.engine.seq import Seq

        return Seq(next(self._ids), list(ids), tag=tag)

    def extend(self, seq: Seq, ids: Sequence[int]) -> None:
        if seq.state in ("queued", "active"):
            raise ConfigError("cannot extend a sequence while it is generating")
        seq.ids += list(ids)

    def seed(self, seed: int) -> None:
        self._seed = int(seed)

    def submit(self, seq: Seq, mode: Any, max_new: int, stop: Sequence[str] = (), key: int = 0) -> None:
        """Queue a turn. ``key`` (a nonzero int64: our engine's sampling key, ``Engine.submit``): the request's
        vLLM ``seed`` is a hash of (key, the turn's start position), so the turn samples the same tokens
        whatever else is in flight (vLLM's per-request generator; not our engine's noise, so not its tokens)."""
        entropies = bool(getattr(mode, "entropies", False))
        body = sampling_body(mode, max_new, stop, self.stop_ids, TOP_FOR_ENTROPY if entropies else 0)
        if key:
            from toolgym.agents.engine.sampling import request_key  # (torch: only when a turn is keyed)

            body["seed"] = request_key(key, len(seq.ids)) & (2**63 - 1)
        elif self.seeded:
            body["seed"] = (self._seed * 1_000_003 + self.requests) % 2**63
        seq.mode, seq.max_new, seq.stop, seq.key = mode, max_new, tuple(stop), key
        seq.out, seq.logprobs, seq.entropies, seq.finish = [], [], [], ""
        seq.state = "queued"
        rid = f"t{seq.id}-{self.requests}"
        self.requests += 1
        self.live[rid] = seq
        self.backend.submit(rid, list(seq.ids), body)

    def busy(self) -> bool:
        return bool(self.live)

    def step(self) -> list[Seq]:
        ended = []
        try:
            polled = self.backend.poll()
        except RequestFailed as exc:  # that turn is gone: its sequence is no longer in flight
            seq = self.live.pop(exc.rid, None)
            if seq is None:
                return []  # a turn cancelled meanwhile: nobody waits for it (the others come next poll)
            seq.state = "released"
            exc.seq = seq  # (a `TurnFailed`: the episode loop ends that turn's path, the others go on)
            raise
        for rid, done in polled:
            seq = self.live.pop(rid, None)
            if seq is None:  # cancelled meanwhile
                continue
            seq.out, seq.logprobs, seq.finish = done.token_ids, done.logprobs, done.finish
            if getattr(seq.mode, "entropies", False):
                tops = done.top or [[lp] for lp in done.logprobs]
                seq.entropies = [entropy_estimate(t, self.vocab) for t in tops]
            seq.ids = seq.ids + done.token_ids
            seq.state = "idle"
            ended.append(seq)
        return ended

    def run(self) -> list[Seq]:
        done: list[Seq] = []
        while self.busy():
            got = self.step()
            pending = getattr(self.backend, "pending", None)
            if not got and pending is not None and not pending():  # nothing in flight can end them
                lost = list(self.live)
                self.live.clear()
                raise InfrastructureError(f"turns {lost[:5]} are waited for but no request is in flight")
            done += got
        return done

    def cancel(self, seq: Seq) -> None:
        for rid, s in list(self.live.items()):
            if s is seq:
                self.backend.cancel(rid)
                del self.live[rid]
        seq.state = "released"

    def release(self, seq: Seq) -> None:
        seq.state = "released"


class _NoIndex:
    """The rollout adds every ended turn to the policy's prefix index; vLLM's prefix cache does that itself."""

    def add(self, seq: Any) -> None:
        pass

    def clear(self) -> None:
        pass


# ----- weight sync ------------------------------------------------------------------------------------------
class WeightSync(Protocol):
    def push(self, model: Any) -> None: ...


class LocalSync:
    """Colocated: the trainer's tensors loaded straight into vLLM's model (``load_weights`` casts them to its
    dtype and fuses q/k/v and gate/up as a checkpoint load would)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def push(self, model: Any) -> None:
        weights = named_weights(model)  # streamed: one gathered tensor at a time, never a second whole model

        def load(worker: Any) -> None:  # runs on vLLM's worker (in this process)
            runner = getattr(worker, "worker", worker).model_runner
            model = runner.get_model() if hasattr(runner, "get_model") else runner.model  # (unwrapped)
            model.load_weights(weights)

        self.llm.collective_rpc(load)


def named_weights(model: Any) -> Any:
    """``(HF checkpoint name, tensor)`` for every parameter (a tied output head is its embedding); a sharded
    parameter (FSDP2's DTensor) is gathered whole (a collective: every rank iterates)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base is not model:
        raise ConfigError("engine=vllm cannot load LoRA adapters into vLLM: use lora_r = 0 (or merge first)")
    for name, p in model.named_parameters():
        t = p.detach()
        full = getattr(t, "full_tensor", None)
        yield name, full() if callable(full) else t


class NcclSync:
    """Servers: vLLM's weight-transfer endpoints (``vllm serve --weight-transfer-config '{"backend": "nccl"}'``
    with ``VLLM_SERVER_DEV_MODE=1``) and an NCCL broadcast from this process (rank 0) to every server worker,
    in bf16, packed. The group is made once; each push is pause / start / update (beside the broadcast) /
    finish, then the prefix caches are dropped and the servers resume."""

    def __init__(self, backend: ServerBackend, *, host: str | None = None, port: int = 0) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.backend = backend
        self.engine = NCCLWeightTransferEngine
        sizes = [int(r["world_size"]) for r in _get_all(backend, "/get_world_size")]
        host = host or _own_address()
        port = port or _free_port()
        world = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        inits = [
            backend.pool.submit(
                _post, backend, url, "/init_weight_transfer_engine",
                {"init_info": {"master_address": host, "master_port": port, "rank_offset": off, "world_size": world}},
            )
            for url, off in zip(backend.urls, offsets, strict=True)
        ]  # fmt: skip
        self.group = self.engine.trainer_init(
            {"master_address": host, "master_port": port, "world_size": world}
        )
        for f in inits:
            f.result()

    def push(self, model: Any) -> None:
        import torch

        weights = list(named_weights(model))
        info = {
            "names": [n for n, _ in weights],
            "dtype_names": ["bfloat16"] * len(weights),
            "shapes": [list(t.shape) for _, t in weights],
            "packed": True,
        }
        # vLLM 0.26 reloads layer by layer, the layers on the meta device until finish_weight_update: nothing may
        # step meanwhile (a request already sent, or another rank's), so the servers pause, keeping their requests
        with paused(self.backend):
            self.backend.post_all("/start_weight_update")
            updates = [
                self.backend.pool.submit(_post, self.backend, url, "/update_weights", {"update_info": info})
                for url in self.backend.urls
            ]
            self.engine.trainer_send_weights(
                iter(weights),
                {
                    "group": self.group,
                    "packed": True,
                    "post_iter_func": lambda item: item[1].to(torch.bfloat16),
                },
            )
            for f in updates:
                f.result()
            self.backend.post_all("/finish_weight_update")
            self.backend.reset_prefix_caches()  # (kept requests are preempted: recomputed under the new weights)


class DiskSync:
    """Servers, the fallback: the weights written (bf16 safetensors) into ``folder`` (a path every server can
    read), then each server pauses, reloads them (``POST /collective_rpc {"method": "reload_weights"}``; needs
    ``VLLM_SERVER_DEV_MODE=1``), drops its prefix cache and resumes. Costs a write and a read of 2 bytes a
    parameter."""

    def __init__(self, backend: ServerBackend, folder: str | Path) -> None:
        self.backend, self.folder = backend, Path(folder)

    def push(self, model: Any) -> None:
        import torch
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = {n: t.to(torch.bfloat16).contiguous().cpu() for n, t in named_weights(model)}
        save_file(tensors, str(self.folder / "model.safetensors"))
        model.config.to_json_file(str(self.folder / "config.json"))
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.folder)}}
        # (a layerwise reload too, as NcclSync's: nothing may step meanwhile)
        with paused(self.backend):
            self.backend.post_all("/collective_rpc", body)
            self.backend.reset_prefix_caches()


@contextlib.contextmanager
def paused(backend: ServerBackend) -> Iterator[None]:
    """Every server paused (its requests kept) for a weight push, and resumed after it, also when the push
    fails: a server left paused would hold every later request, this run's and any other client's, forever.
    A failed push still raises (the servers may hold half-loaded weights: the run cannot go on)."""
    backend.post_all("/pause?mode=keep")
    try:
        yield
    finally:
        try:
            backend.post_all("/resume")
        except Exception as exc:  # (the push's own error, if any, is the one that propagates)
            warnings.warn(f"could not resume the rollout servers after a weight push: {exc}", stacklevel=2)


class NoSync:
    """No weight push (evaluation, or a server that is not trained: the CPU tests against ``toolgym serve``)."""

    def push(self, model: Any) -> None:
        pass


def _post(backend: ServerBackend, url: str, path: str, body: dict[str, Any] | None) -> Any:
    resp = backend.client.post(f"{url}{path}", json=body)
    if resp.status_code != 200:
        raise InfrastructureError(f"{url}{path} answered {resp.status_code}: {resp.text[:300]}")
    return resp.json() if resp.content else None


def _get_all(backend: ServerBackend, path: str) -> list[Any]:
    out = []
    for url in backend.urls:
        resp = backend.client.get(f"{url}{path}")
        if resp.status_code != 200:
            raise InfrastructureError(
                f"{url}{path} answered {resp.status_code}: start vLLM with VLLM_SERVER_DEV_MODE=1 and "
                '--weight-transfer-config \'{"backend": "nccl"}\' (or use weight_sync: disk)'
            )
        out.append(resp.json())
    return out


def _free_cached_memory() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _own_address() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# ----- the policy -------------------------------------------------------------------------------------------
class VLLMPolicy(RenderedTokenPolicy):
    """A ``TokenPolicy`` (``generate``, ``act``) whose turns vLLM samples, with the engine surface the tree rollout
    drives continuously. ``model``/``tokenizer`` are the trainer's (the weights pushed on ``refresh``, the pad
    id, IGPO's scorer); ``backend``/``sync`` say where vLLM runs and how it gets the weights."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        backend: Backend,
        *,
        sync: WeightSync | None = None,
        llm: Any = None,
        capacity: int = 4096,
        sampling: SamplingParams | None = None,
        tool_role: ToolRole = "auto",
        chat_template: str | None = None,
        seeded: bool = False,
        name: str = "vllm",
    ) -> None:
        from toolgym.agents.hf import pad_id

        self.name = name
        self.model, self.tokenizer, self.backend, self.llm = model, tokenizer, backend, llm
        self.sync: WeightSync = sync or NoSync()
        self.sampling = sampling or SamplingParams()
        self.top_k = 0
        self._renderer = ChatRenderer(tokenizer, tool_role=tool_role, chat_template=chat_template)
        self.pad_id = pad_id(tokenizer, self._renderer)
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or len(tokenizer))
        self.engine = VLLMEngine(
            backend, capacity=capacity, stop_ids=self._renderer.stop_ids, vocab=vocab, seeded=seeded
        )
        self.index = _NoIndex()
        self._pushed: Any = None  # the weights version last pushed
        self.asleep = False
        self.sync_s = 0.0  # seconds of the last weight push (wake-up included)

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    def twin(self) -> VLLMPolicy:
        """A policy over the same servers with a backend of its own (``ServerBackend.twin``) and no weight push:
        an asynchronous run's rollout worker samples with it while this one evaluates and pushes the weights
        (trainers/async_servers.py)."""
        if not isinstance(self.backend, ServerBackend):
            raise ConfigError(
                "a twin policy needs rollout servers (a colocated vLLM is one engine in this process)"
            )
        r = self._renderer
        return VLLMPolicy(
            self.model, self.tokenizer, self.backend.twin(), capacity=self.engine.cache.capacity,
            sampling=self.sampling, tool_role=r.tool_role, chat_template=r.chat_template,
            seeded=self.engine.seeded, name=self.name,
        )  # fmt: skip

    # ----- weights and memory ------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Wake vLLM and push the trainer's weights when they changed since the last push (or ``force``)."""
        from toolgym.agents.weights_version import weights_version

        version = weights_version(self.model)
        if version == self._pushed and not force and not self.asleep:
            return
        t0 = time.perf_counter()
        if self.llm is not None and self.asleep:
            _free_cached_memory()  # what the update freed goes back to the GPU before vLLM maps its memory again
            self.llm.wake_up(tags=["weights"])
        if version != self._pushed or force or self.asleep:
            self.sync.push(self.model)
            self._pushed = version
            self.backend.reset()
            if isinstance(self.backend, ServerBackend) and not isinstance(self.sync, NoSync):
                self.backend.pushed()
        if self.llm is not None and self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
        self.asleep = False
        self.sync_s = time.perf_counter() - t0

    def sleep(self) -> None:
        """Free vLLM's GPU memory for the update (colocated with ``enable_sleep_mode``; otherwise nothing)."""
        if self.llm is None or self.asleep or not getattr(self.llm, "sleep_mode", False):
            return
        # vLLM's sleep aborts running requests and, in-process, returns no output for them: with turns in flight
        # the rollout would wait for them forever, so vLLM stays awake (the update runs with its memory held)
        if self.engine.busy():
            return
        self.llm.sleep(level=2)
        self.asleep = True

    # ----- tokens ------------------------------------------------------------------------------------------
    def _plan(self, prompts: list[list[int]]) -> list[Seq]:
        return [self.engine.new(p) for p in prompts]

    def generation(self, seq: Seq) -> Generation:
        ents = list(seq.entropies) if getattr(seq.mode, "entropies", False) else None
        return Generation(list(seq.out), list(seq.logprobs), seq.finish, ents)  # type: ignore[arg-type]

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """One turn per prompt (ids in, ids + logprobs out), all in flight at once."""
        from toolgym.agents.engine.engine_policy import plan_turns

        sp, mode, seqs = plan_turns(self, prompts, sampling)
        if not seqs:
            return []
        for s in seqs:
            room = self.engine.cache.capacity - 2 - len(s.ids)
            if room < 1:
                raise ConfigError(
                    f"a prompt of {len(s.ids)} tokens does not fit max_model_len {self.engine.cache.capacity}"
                )
            self.engine.submit(s, mode, min(sp.max_new_tokens, room), sp.stop)
        try:
            self.engine.run()
        except BaseException:  # a failed turn fails this call: its other turns do not stay in flight
            for s in seqs:
                if s.state in ("queued", "active"):
                    self.engine.cancel(s)
            raise
        return [self.generation(s) for s in seqs]

    def clear_kv(self) -> None:
        self.backend.reset()

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


# ----- making one -------------------------------------------------------------------------------------------
def colocated_llm(
    model: Any, tokenizer: Any, *, capacity: int, memory: float, sleep: bool = True, seed: int = 0,
    max_num_seqs: int = 256, enforce_eager: bool = False, folder: str | Path | None = None,
) -> Any:  # fmt: skip
    """A ``vllm.LLM`` in this process for ``model``'s architecture, with dummy weights (the trainer pushes its own
    before the first turn): prefix caching on, ``logprobs_mode="processed_logprobs"``, the in-process engine
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``external_launcher`` executor, so ``collective_rpc`` runs here
    and the trainer's torch.distributed group is reused under torchrun); ``memory`` of the GPU for vLLM."""
    from toolgym.optional import require

    require("vllm", why="engine=vllm runs the rollouts in it")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for key, default in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(key, default)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    from vllm import LLM

    folder = Path(folder) if folder is not None else _config_folder(model, tokenizer)
    llm = LLM(
        model=str(folder), tokenizer=str(folder), dtype="bfloat16", load_format="dummy", seed=seed,
        gpu_memory_utilization=memory, max_model_len=capacity, max_num_seqs=max_num_seqs,
        enable_prefix_caching=True, enable_sleep_mode=sleep, logprobs_mode="processed_logprobs",
        distributed_executor_backend="external_launcher", enforce_eager=enforce_eager,
        max_num_batched_tokens=max(8192, capacity),
    )  # fmt: skip
    llm.sleep_mode = sleep  # (read by VLLMPolicy.sleep)
    return llm


def _config_folder(model: Any, tokenizer: Any) -> Path:
    """A folder with the model's config and the tokenizer: all vLLM needs to build the model (dummy weights)."""
    import hashlib
    import tempfile

    if not getattr(
        model.config, "architectures", None
    ):  # (a model made in memory: vLLM picks its class by this)
        model.config.architectures = [type(model).__name__]
    config = model.config.to_dict()
    key = hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"toolgym-vllm-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(str(folder / "config.json"))
    tokenizer.save_pretrained(str(folder))
    return folder


def make_vllm_policy(
    policy: Any, *, capacity: int, memory: float, servers: Sequence[str] = (), weight_sync: str = "auto",
    sync_folder: str | None = None, seed: int = 0, quiet: bool = False, rows: int = 256,
) -> VLLMPolicy:  # fmt: skip
    """``policy`` (an ``HFPolicy`` over the trainer's live model) as a ``VLLMPolicy``: colocated when ``servers`` is
    empty, else on those servers with ``weight_sync`` nccl | disk | none (auto: nccl)."""
    import sys

    model, tok, r = policy.model, policy.tokenizer, policy.renderer
    common = {"capacity": capacity, "chat_template": r.chat_template, "tool_role": r.tool_role}
    if not servers:
        llm = colocated_llm(
            model, tok, capacity=capacity, memory=memory, seed=seed, max_num_seqs=max(256, rows)
        )
        out = VLLMPolicy(model, tok, LocalBackend(llm), sync=LocalSync(llm), llm=llm, **common)
        where = f"colocated vLLM ({memory:.2f} of the GPU, sleep mode on)"
    else:
        backend = ServerBackend(servers, workers=max(256, 2 * rows))  # every turn of a step in flight at once
        backend.check_context(capacity)
        mode = "nccl" if weight_sync == "auto" else weight_sync
        sync: WeightSync
        if mode == "nccl":
            sync = NcclSync(backend)
        elif mode == "disk":
            if not sync_folder:
                raise ConfigError("weight_sync=disk needs a folder every server can read (vllm_sync_folder)")
            sync = DiskSync(backend, sync_folder)
        elif mode == "none":
            sync = NoSync()
        else:
            raise ConfigError(f"weight_sync must be auto, nccl, disk or none, got {weight_sync!r}")
        backend.track_weights = mode != "none"
        out = VLLMPolicy(model, tok, backend, sync=sync, **common)
        where = f"{len(servers)} vLLM server(s), weight sync {mode}"
    if not quiet:
        print(f"toolgym: rollouts use {where}", file=sys.stderr)
    return out
