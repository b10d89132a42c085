"""Run by test_async_split.py under torchrun (2 gloo processes on CPU: rank 0 learner, rank 1 rollout).

async_split_worker.py train OUT STEPS [resume] [cuda]   GRPO with rollout_ranks 1; each rank saves its final weights
    (cuda: rank r on GPU r over NCCL, a model our engine decodes, bf16)
async_split_worker.py worker OUT K rounds|continuous [tree]   the split pipeline against a fake learner that
    perturbs the weights and keeps every version; the learner writes what it checked to OUT/check.json
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any


def _setup() -> tuple[Any, Any]:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import gymnasium as gym

    from tests.trainers.conftest import register_fake_env, tiny_tokenizer
    from tests.trainers.test_async import SLOW_ENV, SlowVowelEnv

    torch.set_num_threads(1)
    register_fake_env()
    if SLOW_ENV not in gym.registry:
        gym.register(SLOW_ENV, entry_point=SlowVowelEnv, disable_env_checker=True)
    return torch, tiny_tokenizer()


def train(out: str, steps: int, resume: bool, cuda: bool = False) -> None:
    torch, tok = _setup()
    from tests.trainers.conftest import tiny_model
    from tests.trainers.test_async import SLOW_ENV
    from tests.trainers.test_train import SMALL
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo

    rank = int(os.environ["RANK"])
    # the rollout rank's start weights come from the learner (a resumed one: from its checkpoint)
    model = tiny_model(len(tok), seed=rank + (10 if resume else 0), head_dim=64 if cuda else 8)
    cfg = GRPOConfig(
        steps=steps, max_staleness=2, rollout_ranks=1, output_dir=out, resume=resume,
        **dict(SMALL, env_ids=[SLOW_ENV], device="cuda" if cuda else "cpu"),
    )  # fmt: skip
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, f"{out}/init{rank}.pt")
    events = trace_weights() if rank == 1 else None
    train_grpo(cfg, model, tok)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, f"{out}/rank{rank}.pt")
    if events is not None:
        with open(f"{out}/weights_trace.json", "w") as f:
            json.dump(events, f)


def trace_weights() -> list[list[str]]:
    """Records, on a rollout rank, each thread's order of weight notices and other broadcasts: a weights
    broadcast (an NCCL receive on GPUs) must never be posted before its notice came (async_split.py)."""
    import threading

    import torch.distributed as tdist

    from toolgym.trainers import async_split

    events: list[list[str]] = []
    inside = threading.local()
    notice, broadcast = async_split.Layout.notice, tdist.broadcast

    def traced_notice(self: Any, version: int) -> int:
        inside.on = True
        try:
            got = notice(self, version)
        finally:
            inside.on = False
        events.append([threading.current_thread().name, f"notice {got}"])
        return got

    def traced_broadcast(*args: Any, **kwargs: Any) -> Any:
        if not getattr(inside, "on", False):
            events.append([threading.current_thread().name, "broadcast"])
        return broadcast(*args, **kwargs)

    async_split.Layout.notice = traced_notice  # type: ignore[method-assign]
    tdist.broadcast = traced_broadcast
    return events


def worker(out: str, max_staleness: int, continuous: bool, per_tree: bool) -> None:
    torch, tok = _setup()
    import torch.distributed as tdist

    from tests.trainers.conftest import tiny_model
    from tests.trainers.test_async import SLOW_ENV, _turn_logprobs
    from toolgym.agents.hf import HFPolicy
    from toolgym.trainers.async_rollout import ActorWeights, staleness
    from toolgym.trainers.async_split import Layout, LearnerPipe, RemoteWeights, handshake, serve_batches
    from toolgym.trainers.distributed import Dist
    from toolgym.trainers.episodes import next_tasks
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.rollout import RolloutConfig, TreeRollout

    steps = 6
    dist = Dist.from_env("cpu")
    layout = Layout.join(dist, GRPOConfig(device="cpu", max_staleness=max_staleness, rollout_ranks=1))
    if layout.rollout:
        actor = tiny_model(len(tok), seed=7)  # not the learner's: the handshake must bring them
        actor.eval()
        gate = RemoteWeights(actor)
        start = handshake(layout, gate)
        if continuous:
            from toolgym.agents.engine.engine_policy import EnginePolicy

            policy: Any = EnginePolicy(actor, tok, slots=32, capacity=300)
        else:
            policy = HFPolicy(actor, tok, batch_size=64, reuse_kv=True)
        cfg = RolloutConfig(budget=3, max_new_tokens=6, max_total_tokens=256)
        roller = TreeRollout(policy, cfg=cfg, gate=gate, env_workers=4)
        try:
            serve_batches(
                layout, roller, gate, start, last=steps, max_staleness=max_staleness,
                draw=lambda s: next_tasks([SLOW_ENV], 0, (s - 1) * 2, 2), seed=lambda s: 1000 + s,
                per_tree=per_tree,
            )  # fmt: skip
        finally:
            roller.close()
        layout.barrier()
        sync_cost(layout, None)
        tdist.destroy_process_group()
        return

    learner = tiny_model(len(tok))
    pipe = LearnerPipe(layout, learner, first=1, last=steps, max_staleness=max_staleness, pos0=0)
    versions = {0: ActorWeights.copy_of(learner)}
    rng = random.Random(0)
    got, publish_s = [], []
    for step in range(1, steps + 1):
        got.append(pipe.take(step))
        time.sleep(rng.uniform(0.0, 0.03))  # the "update"
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        versions[step] = ActorWeights.copy_of(learner)
        publish_s.append(pipe.publish(step)["time/weight_publish_s"])
    pipe.close()
    check: dict[str, Any] = {
        "taken": pipe.taken,
        "seeds": [t.seed for b in got for t in b.tasks],
        "want_seeds": [t.seed for t in next_tasks([SLOW_ENV], 0, 0, 2 * steps)],
        "leaves": [[len(t.leaves()) for t in b.forest] for b in got],
        "worst": [staleness(b.forest, b.step)[1] for b in got],
        "early": sum(b.early for b in got),
        "bad_versions": [],
        "bad_logprobs": [],
        "switched": False,
        "publish_s_tiny": publish_s,
        "numel_tiny": sum(p.numel() for p in learner.parameters()),
    }
    for b in got:
        for tree in b.forest:
            for n in tree.nodes:
                if n.kind != "model":
                    continue
                vs = n.versions or []
                if (
                    not vs
                    or vs != sorted(vs)
                    or not b.step - 1 - max_staleness <= vs[0] <= vs[-1] <= b.step - 1
                ):
                    check["bad_versions"].append([b.step, vs])
                    continue
                check["switched"] |= vs[0] != vs[-1]
                by_version = {v: _turn_logprobs(versions[v], tree, n.id) for v in set(vs)}
                want = [by_version[v][j] for j, v in enumerate(vs)]
                err = max(abs(a - w) for a, w in zip(n.logprobs, want, strict=True))
                if err > (2e-3 if continuous else 2e-4):
                    check["bad_logprobs"].append([b.step, vs, err])
    check |= sync_cost(layout, learner)
    with open(f"{out}/check.json", "w") as f:
        json.dump(check, f)
    tdist.destroy_process_group()


def sync_cost(layout: Any, learner: Any) -> dict[str, float]:
    """Seconds to broadcast a 64 MB fp32 flat buffer (16M weights) over the gloo weights group, best of 3."""
    import torch
    import torch.distributed as tdist

    flat = torch.ones(16 * 2**20) if learner is not None else torch.empty(16 * 2**20)
    best = float("inf")
    for _ in range(3):
        tdist.barrier(group=layout.weights)
        t0 = time.perf_counter()
        tdist.broadcast(flat, 0, group=layout.weights)
        best = min(best, time.perf_counter() - t0)
    return {"broadcast_64MB_s": best}


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], int(sys.argv[3]), "resume" in sys.argv[4:], "cuda" in sys.argv[4:])
    else:
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "continuous", sys.argv[5:] == ["tree"])
