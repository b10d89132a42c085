"""Data parallel training under torchrun: each rank rolls out its share of the step's tasks, gradients
are averaged over ranks, rank 0 logs, evaluates and saves. Without torchrun everything is a no-op (world 1).

Two layouts (``parallel``):
- ``ddp`` (default): every rank holds the whole fp32 model + AdamW (~16 bytes a parameter: fine up to
  ~1-2B parameters per GPU) and generates with it directly; DDP all-reduces gradients once per optimizer step.
- ``fsdp2``: weights, gradients and AdamW state are sharded (``fully_shard``, trainers/fsdp.py); the rollout
  runs on a full bf16 copy of the weights on each rank, gathered once per step after the optimizer steps
  (the "hybrid engine": ranks never wait on each other inside generation). ``hybrid`` sets it up,
  ``after_update`` gathers; checkpoints are then DCP (trainers/checkpoint.py), resumable on another
  number of ranks. It also runs in one process (a one-rank group): bf16 compute and CPU offload on one GPU.

The loss is multiplied by the world size before backward: DDP and FSDP average gradients over ranks, while
the global token-mean denominator (all-reduced) already counts every rank's tokens.

Uneven ranks: filters (remove_clip, void, zero variance), env errors and refill leave each rank its own number of
rows, possibly none. Every backward is a collective (DDP's all-reduce, FSDP2's reduce-scatter) and so is every
FSDP2 forward, so the ranks agree on the number of minibatches and micro-batches (``pad``: the most any rank
has) and a rank short of them runs dummies, a zero loss on a two-token row (batch.dummy_batch): its backward
adds exactly zero to the gradient but still takes part in the collectives. A step makes no update only when
the all-reduced denominator is 0 (no kept token on any rank). ``mean_metrics`` averages each metric over the
ranks that report it (a rank that trained no row has no loss stats).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


def timeout() -> datetime.timedelta:
    """How long a collective waits for the slowest rank: ``TOOLGYM_DIST_TIMEOUT_S`` seconds, 2 hours by default.
    Ranks meet after rollouts whose length differs per rank, and the others wait while rank 0 evaluates and
    saves; NCCL's default (10 minutes) would end a run whose evaluation or slowest rollout takes longer."""
    return datetime.timedelta(seconds=float(os.environ.get("TOOLGYM_DIST_TIMEOUT_S", "7200")))


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    fsdp: Any = field(default=None, repr=False)  # fsdp.Sharded under parallel=fsdp2 (after `hybrid`)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded (fsdp2): every rank then takes part in saving a checkpoint."""
        return self.fsdp is not None

    def hybrid(self, policy: Any, cfg: Any, device: torch.device) -> tuple[Any, Any]:
        """(rollout policy, model to train). Under ``ddp`` both read the same live model; under ``fsdp2`` the
        model is sharded in place and the policy runs on a full copy of its weights (``after_update``
        refreshes it). Call it before the optimizer and the KL reference are made."""
        model = policy.model
        if getattr(cfg, "parallel", "ddp") != "fsdp2":
            return policy, model
        from toolgym.trainers.fsdp import Sharded
        from toolgym.trainers.modeling import hf_policy

        self.fsdp = Sharded(cfg, device, self.world, quiet=not self.main)
        rollout = self.fsdp.take(model, keep_reference=cfg.kl_coef > 0)
        return hf_policy(rollout.model, policy.tokenizer, device), model

    def after_update(self) -> None:
        """Gathers the updated weights into the rollout's copy (fsdp2; every rank calls it once per step)."""
        if self.fsdp is not None:
            self.fsdp.sync()

    @classmethod
    def from_env(cls, device_name: str) -> Dist:
        """Joins the torchrun process group when WORLD_SIZE > 1 (nccl on CUDA, gloo on CPU)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        cuda = device_name != "cpu" and torch.cuda.is_available()
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timeout())
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(local)
        return cls(rank=dist.get_rank(), world=world, local_rank=local)

    def device_name(self, name: str) -> str:
        """cuda:LOCAL_RANK for each rank when training on CUDA across processes."""
        if self.world > 1 and name in ("auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return name

    def wrap(self, model: Any, device: torch.device) -> Any:
        """The model to run training forwards through (DDP when world > 1; under fsdp2 the sharded model
        itself, and the rollout's copy is refreshed: a checkpoint may have been loaded since `hybrid`)."""
        if self.fsdp is not None:
            self.fsdp.sync()
            return model
        if self.world <= 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    @contextlib.contextmanager
    def no_sync(self, wrapped: Any, sync: bool) -> Iterator[None]:
        """Skip the gradient all-reduce on every micro-batch but the last of a step (DDP; FSDP2
        reduce-scatters every micro-batch so that no rank holds a whole unsharded gradient)."""
        if self.world > 1 and not sync and self.fsdp is None:
            with wrapped.no_sync():
                yield
        else:
            yield

    def sum(self, value: float) -> float:
        if self.world <= 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return float(t.item())

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric averaged over the ranks that report it (the keys may differ: a rank with no rows has no
        loss stats; an all-reduce of the values alone would then mismatch in size, or hang)."""
        if self.world <= 1:
            return metrics
        import torch.distributed as dist

        group = getattr(self, "group", None)  # (async_split.GroupDist: the learners' group)
        names: list[list[str] | None] = [None] * self.world
        dist.all_gather_object(names, sorted(metrics), group=group)
        keys = sorted({k for ks in names for k in ks or []})
        # values, then how many ranks have each key
        t = torch.tensor(
            [metrics.get(k, 0.0) for k in keys] + [float(k in metrics) for k in keys], dtype=torch.float64
        )
        t = self._reduce(t, "sum")
        n = len(keys)
        return {k: float(t[i]) / max(float(t[n + i]), 1.0) for i, k in enumerate(keys)}

    def most(self, value: int) -> int:
        """The largest `value` over ranks."""
        if self.world <= 1:
            return value
        return int(self._reduce(torch.tensor([float(value)], dtype=torch.float64), "max")[0])

    def pad(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """`chunks` (row indices of minibatches or micro-batches) followed by empty ones up to the most any
        rank has, so that every rank runs as many (an empty micro-batch runs a dummy; module docstring)."""
        want = self.most(len(chunks))
        return chunks + [torch.zeros(0, dtype=torch.long)] * (want - len(chunks))

    def _reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        """`t` all-reduced (sum or max) over this Dist's ranks, on the host."""
        import torch.distributed as dist

        group = getattr(self, "group", None)
        if dist.get_backend(group) == "nccl":
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
        return t.cpu()

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.fsdp is not None:
            self.fsdp.close()  # the one-rank group it made, if any
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                # gloo's worker threads may still hold the last collectives' tensors, and releasing them takes
                # the GIL; DDP's reducer destroys the group when the wrapper is freed, holding the GIL while it
                # joins those threads (pytorch#56297): a rare deadlock at the end of a run unless they are idle
                time.sleep(0.2)
                dist.destroy_process_group()
