"""Asynchronous rollouts on vLLM servers (`max_staleness` > 0 with `engine: vllm` and `rollout_servers`).

The servers are the rollout's GPUs: the worker thread's turns go to them while the learner updates, so no
actor copy of the weights is made (trainers/async_rollout.py's `ActorWeights` is for our engine in this
process). The gate here is the same bound with another way of publishing:

- `publish(v)` pushes the learner's weights to every server through the run's weight sync (agents/vllm_policy.py:
  NCCL or disk; the servers pause with their requests kept, load, drop their prefix caches and resume), then
  says version v. A turn the servers were sampling during the push goes on under the new weights (vLLM
  recomputes its cache), as our engine's partial rollouts do.
- Token versions are conservative: every token of a turn carries the version published when the turn was
  submitted, the oldest that can have sampled it (a server answers a turn whole, so where a push fell inside
  it is not known). The staleness bound, which admission keeps, holds all the more; the importance weights
  use the logprobs the servers report for each token as sampled, which are exact either way.
- The worker samples with a twin of the learner's policy (`VLLMPolicy.twin`): same servers, requests and
  routes of its own, so the learner's evaluations and pushes never share its backend or its thread pool.

A colocated vLLM (no `rollout_servers`) is refused with `max_staleness` > 0: it is one engine in the trainer's
process and on its GPU, put to sleep for each update.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from toolgym.trainers.async_rollout import ActorWeights


class ServerWeights(ActorWeights):
    """The gate of an asynchronous run on vLLM servers: the servers hold the published weights; `pusher` (the
    learner's `VLLMPolicy`) pushes them, `rollout` (its twin, the worker's) is told when they changed."""

    restarts_turns = False  # the servers carry a turn in flight across a push themselves (`_EngineTurns`)

    def __init__(self, pusher: Any, rollout: Any, version: int = 0) -> None:
        super().__init__(pusher.model, None, version)
        self.pusher, self.rollout = pusher, rollout
        self.push_s: list[float] = []
        # the servers hold the run's weights before the first turn (a resumed run's are not the ones the
        # servers were started with)
        self._push(force=True)

    def _push(self, force: bool = False) -> None:
        t0 = time.perf_counter()
        self.pusher.refresh(force=force)  # (nothing when the weights did not change since the last push)
        self.rollout.backend.reset()  # the prefix caches its routes pointed at were dropped
        self.rollout.backend.pushed()  # a server that restarted holds the weights again
        self.push_s.append(time.perf_counter() - t0)

    def publish(self, version: int) -> None:
        with self.lock:
            self._push()
            self.version = version
        with self.changed:
            self.changed.notify_all()

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        with self.lock:  # (no push during the call: its turns are all sampled by this version)
            yield self.version

    def sync(self, policy: Any) -> int:
        return self.version  # (the push already reached the servers: nothing to load here)


def server_policy(policy: Any, version: int) -> tuple[ServerWeights, Any]:
    """The gate and the worker's policy of an asynchronous run on vLLM servers (`policy`: the learner's)."""
    rollout = policy.twin()
    return ServerWeights(policy, rollout, version), rollout
