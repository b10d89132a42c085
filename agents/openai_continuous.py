"""``toolgym serve`` over our engine with continuous batching: a request joins the running batch at the next
engine step, as in vLLM's server, instead of waiting for the batch before it to end (the rounds of
``PolicyServer._batches``, which every other policy uses).

A trainer's rollout sends turns to a rollout server as its episodes reach them, of uneven lengths: in rounds a
turn that arrives while a batch runs waits for that batch's longest reply; here it starts at the next step.

- Each request is planned against the engine's held caches (a turn that continues an earlier prompt + reply
  prefills only its new tokens) and submitted with its own sampling mode (the engine groups modes per step).
- A request's ``seed`` keys its turn (``request_key(seed, choice)``: each of ``n`` choices its own key): its
  sampling noise is a hash of (key, position, token) instead of draws from the engine's one generator, so the
  same request with the same seed samples the same tokens whichever requests share the batch and whenever it
  joins (vLLM keeps a generator per request for this). Up to the logits' float rounding, which on a GPU can
  depend on the batch's size (a near-tie may then go the other way). Requests without a seed draw from the
  generator. (The rounds path reseeds the generator per batch, as before.)
- Weight updates (``--weight-updates``): ``/pause`` returns between two engine steps, and no step runs until
  ``/resume``; the sequences in flight stay in the engine (vLLM's ``mode=keep``). A reload also runs between
  steps; after it every turn in flight is taken out and submitted again with what it sampled so far appended,
  so its context is prefilled under the new weights (vLLM preempts and recomputes them); the reply is the
  tokens and logprobs of both parts (each logprob the one its token was sampled with).
- A request the engine cannot take (past its capacity or the model's context, an id outside the vocabulary) is
  answered 400 alone; an engine fault answers every turn in flight with it (500) and the server goes on.
"""

from __future__ import annotations

import dataclasses
import queue
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolgym.agents.engine.engine_policy import (
    NOTHING_CARRIED,
    Carried,
    plan_turns,
    restart_turn,
    with_carried,
)
from toolgym.agents.engine.sampling import request_key
from toolgym.agents.openai_server import answer
from toolgym.errors import ConfigError, InfrastructureError

if TYPE_CHECKING:
    from toolgym.agents.openai_server import PolicyServer, _Job, _Reply


@dataclass
class _Live:
    """A request in the engine: its job, prompt and tools, its sequence, and what it sampled before a reload."""

    job: _Job
    prompt: list[int]
    tools: Any
    seq: Any
    carried: Carried = NOTHING_CARRIED


class ContinuousBatcher:
    """The batching thread of a ``PolicyServer`` over an engine policy (``continuous_serving``)."""

    def __init__(self, server: PolicyServer) -> None:
        self.server, self.policy = server, server.policy
        self.engine = self.policy.engine  # type: ignore[attr-defined]
        self.live: dict[int, _Live] = {}
        self.epoch = self._weights_epoch()

    def _weights_epoch(self) -> int:
        return getattr(self.server.weights, "epoch", 0)

    def run(self) -> None:
        """Until the server closes: take what is queued (waiting only when nothing runs), admit it, step."""
        from toolgym.agents.openai_server import ServerClosed

        while True:
            jobs = self._take(block=not self.live)
            if jobs is None:  # closing: what is in flight is answered, what is queued is _work's
                self._fail_all(ServerClosed("the server shut down before this request ended"))
                return
            if not self.server.gate.enter():  # closing while paused
                for j in jobs:
                    self.server._jobs.put(j)
                self._fail_all(ServerClosed("the server shut down before this request ended"))
                return
            try:
                self._after_reload()
                for j in jobs:
                    self._admit(j)
                if self.live and not self.engine.busy():  # (never expected: turns the engine no longer has)
                    raise InfrastructureError(
                        f"the engine holds none of the {len(self.live)} turns in flight"
                    )
                if self.live:
                    for seq in self.engine.step():
                        self._finish(seq)
            except Exception as exc:  # an engine fault: the turns in flight fail (500), the server goes on
                self._fail_all(exc)
            except BaseException as exc:  # (SystemExit, KeyboardInterrupt) ends the batcher: answer first
                self._fail_all(ServerClosed(f"the policy stopped the server ({type(exc).__name__})"))
                return
            finally:
                self.server.gate.leave()

    def _take(self, block: bool) -> list[_Job] | None:
        """Every queued job (at least one when ``block``); None once the server closes."""
        q = self.server._jobs
        out: list[_Job] = []
        while True:
            try:
                job = q.get() if block and not out else q.get_nowait()
            except queue.Empty:
                return out
            if job is None:
                q.put(None)  # (seen again by nobody: the batcher ends)
                for j in out:
                    q.put(j)
                return None
            out.append(job)

    def _admit(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():  # its caller went away
            return
        server = self.server
        try:
            conv, tools = (
                server._conversation(job.conversation, job.tools) if job.prompt is None else ([], None)
            )
            prompt = job.prompt if job.prompt is not None else server._renderer.prompt_ids(conv, tools)  # type: ignore[union-attr]
            problem = server.context_problem(len(prompt), job.sampling.max_new_tokens)
            if problem is not None:
                raise ConfigError(problem)
            self.policy.check_prompts([prompt])  # type: ignore[attr-defined]
            sp, mode, seqs = plan_turns(self.policy, [prompt], job.sampling, seed_engine=False)
            key = request_key(sp.seed, job.choice) if sp.seed is not None else 0
            self.engine.submit(seqs[0], mode, sp.max_new_tokens, sp.stop, key)
        except Exception as exc:  # this request's fault (400), or the policy's (500): it alone
            answer(job, exc)
            return
        self.live[seqs[0].id] = _Live(job, prompt, tools, seqs[0])

    def _finish(self, seq: Any) -> None:
        lv = self.live.pop(seq.id, None)
        if lv is None:
            return
        self.policy.index.add(seq)  # type: ignore[attr-defined]
        gen = with_carried(self.policy.generation(seq), lv.carried)  # type: ignore[attr-defined]
        result: _Reply | Exception
        try:
            result = self.server._reply(lv.job, lv.tools, lv.prompt, gen)
        except Exception as exc:
            result = exc
        answer(lv.job, result)

    def _after_reload(self) -> None:
        """New weights since the last step: every turn in flight goes on from a fresh prefill under them."""
        epoch = self._weights_epoch()
        if epoch == self.epoch:
            return
        self.epoch = epoch
        for sid, lv in list(self.live.items()):
            seq = lv.seq
            if seq.state not in ("queued", "active"):
                continue
            fresh, carried = restart_turn(self.engine, seq, lv.carried)
            del self.live[sid]
            self.live[fresh.id] = dataclasses.replace(lv, seq=fresh, carried=carried)

    def _fail_all(self, exc: Exception) -> None:
        for lv in self.live.values():
            try:
                if lv.seq.state in ("queued", "active"):
                    self.engine.cancel(lv.seq)
            except Exception:  # (the engine that failed may not cancel either: the answer matters)
                pass
            answer(lv.job, exc)
        self.live.clear()
