"""The split layout of asynchronous rollouts (`rollout_ranks` > 0): rollout processes and learner processes.

    torchrun --nproc-per-node 2 -m toolgym train grpo --config my.yaml --max-staleness 2 --rollout-ranks 1

Of the N torchrun ranks the first L = N - `rollout_ranks` are learners (DDP among themselves over a group of
their own; rank 0 logs, evaluates and saves, as in every layout), the last R = `rollout_ranks` are rollout
ranks. A rollout rank holds its own model (its engine packs from it) and grows whole batches: batch b (the
trees of learner step b, the tasks and seed the other layouts give it) by rollout rank (b - 1) mod R, with the
thread layout's worker (`AsyncRollout`) and admission (batch b once version >= b - 1 - max_staleness is
loaded): versions, partial rollouts and the learner's staleness check are those of trainers/async_rollout.py.

Three process groups over the torchrun group:
- weights (learner 0 + rollout ranks; NCCL on CUDA, gloo on CPU). Learner 0 packs its parameters and floating
  buffers into one flat buffer after each step (bf16 when it trains in bf16 on CUDA, else their dtype) and
  broadcasts it; a receiver thread on each rollout rank takes it into a staging buffer and loads it into the
  rollout model under the gate's lock (`RemoteWeights`), at the same safe points as the thread layout. A
  handshake first sends the start version, data position and buffer size, then the start weights (so a
  resumed learner's checkpoint reaches the rollout ranks, and different models fail with a ConfigError).
- notices (the same ranks, always gloo): before each broadcast learner 0 sends the version's number here, and
  a receiver posts its side of the broadcast only once that number came. Why: a posted NCCL receive is a
  kernel that waits on the GPU until the sender sends; every device-wide synchronization of the rollout rank
  (the caching allocator's cudaFree, a CUDA graph capture, any library's torch.cuda.synchronize) would wait
  for it, and the sender sends only after the batch that rank is growing: a deadlock (seen on two H200s,
  2026-11-28: the first step never ended). Waiting on gloo waits on the CPU only.
- data (every rank, always gloo): each finished batch, pickled (trees, stats, tasks), point to point from its
  rollout rank to each learner (its slice of `prompts_per_step / L` trees). Why the process group and not a
  multiprocessing pipe: torchrun's ranks are not parent and child (no pipe to inherit), the group is already
  connected (no extra port or address to agree on) and spans hosts; why gloo even on CUDA: trees are small
  CPU objects, NCCL would need them copied to the GPU and would share the weights' stream ordering.
  A receiver thread on each learner takes batches as soon as they are sent, so a rollout rank never waits
  for the learner to ask.
- learners (the L learner ranks): DDP and the metric means (`GroupDist`); not made when L = 1.
Each group is used by one thread per process (weights and notices: learner 0's main thread, rollout receivers;
data: learner receivers, rollout main threads), never by two at once.

Departures (docs/trainer.md, "Asynchronous rollouts"): a rollout rank in rounds mode (HF policy) loads a
version only between generate calls (the lock), so the next broadcast waits that long; FSDP2 learners and vLLM
servers are not supported in this layout (ConfigError); the rollout model is the fp32 model (bf16 comes from
autocast), as on the learner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from toolgym.errors import ConfigError
from toolgym.trainers.async_rollout import ActorWeights, AsyncRollout, Batch, checked
from toolgym.trainers.distributed import Dist
from toolgym.trainers.rollout import RolloutTask, TreeRollout

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]  # the handshake sends an index
# A rollout rank waits on these groups while the learner evaluates or saves (the handshake waits for the
# learner's first evaluation, the final barrier for its last one): far longer than NCCL's 10 and gloo's 30
# minute defaults. A rank that fails does not leave the others waiting that long: torchrun ends them all.
GROUP_TIMEOUT = timedelta(hours=4)


def weight_tensors(model: Any) -> list[torch.Tensor]:
    """What a version holds: every parameter, then every floating buffer (rotary tables: cheap, and exact)."""
    return [p for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


def pack(tensors: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copies `tensors` one after another into the flat buffer `out` (cast to its dtype)."""
    o = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            out[o : o + n].copy_(t.detach().reshape(-1))
            o += n
    return out


def unpack(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """The reverse of `pack`: each tensor takes its slice of `flat` (cast back to its own dtype)."""
    o = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[o : o + n].view(t.shape))
            o += n


@dataclass
class GroupDist(Dist):
    """`Dist` over the learner ranks only (their own process group); `close` ends the whole torchrun group."""

    group: Any = field(default=None, repr=False)

    def wrap(self, model: Any, device: torch.device) -> Any:
        if self.world <= 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, process_group=self.group)

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if dist.get_backend(self.group) == "nccl":
            t = t.cuda()
        dist.all_reduce(t, group=self.group)
        return t

    def sum(self, value: float) -> float:
        if self.world <= 1:
            return value
        return float(self._all_reduce(torch.tensor([value], dtype=torch.float64)).item())

    # (mean_metrics: Dist's, over `group`: a learner with no rows reports no loss stats)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass
class Layout:
    """Who is who in the split layout, and its process groups (`join`)."""

    rank: int
    world: int
    rollout_ranks: int
    device: torch.device
    weights: Any = field(default=None, repr=False)  # learner 0 + rollout ranks
    notices: Any = field(default=None, repr=False)  # the same ranks, gloo: "version v comes now"
    data: Any = field(default=None, repr=False)  # every rank, gloo
    learners_group: Any = field(default=None, repr=False)

    @property
    def learners(self) -> int:
        return self.world - self.rollout_ranks

    @property
    def rollout(self) -> bool:
        return self.rank >= self.learners

    @property
    def weight_root(self) -> int:
        return 0  # learner 0 broadcasts (DDP keeps the learners equal)

    def owner(self, step: int) -> int:
        """The rollout rank that grows batch `step`."""
        return self.learners + (step - 1) % self.rollout_ranks

    @classmethod
    def join(cls, dist: Dist, cfg: Any) -> Layout:
        """The layout of this torchrun rank (every rank calls it: group creation is collective)."""
        if dist.world <= cfg.rollout_ranks:
            raise ConfigError(
                f"rollout_ranks {cfg.rollout_ranks} needs torchrun with more ranks than that (got {dist.world}), "
                f"e.g. torchrun --nproc-per-node {cfg.rollout_ranks + 1} -m toolgym train ..."
            )
        if getattr(cfg, "parallel", "ddp") == "fsdp2":
            raise ConfigError("rollout_ranks > 0 trains with parallel ddp (fsdp2 learners: not yet)")
        import torch.distributed as tdist

        from toolgym.trainers.modeling import pick_device

        device = pick_device(dist.device_name(cfg.device), cfg.threads)
        backend = "nccl" if device.type == "cuda" else "gloo"
        learners = dist.world - cfg.rollout_ranks
        lay = cls(dist.rank, dist.world, cfg.rollout_ranks, device)
        # every rank creates every group, in the same order (new_group is collective over the world)
        lay.weights = tdist.new_group(
            [0, *range(learners, dist.world)], backend=backend, timeout=GROUP_TIMEOUT
        )
        lay.notices = tdist.new_group(
            [0, *range(learners, dist.world)], backend="gloo", timeout=GROUP_TIMEOUT
        )
        lay.data = tdist.new_group(list(range(dist.world)), backend="gloo", timeout=GROUP_TIMEOUT)
        lay.learners_group = tdist.new_group(list(range(learners)), backend=backend) if learners > 1 else None
        return lay

    def learner_dist(self) -> GroupDist:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return GroupDist(rank=self.rank, world=self.learners, local_rank=local, group=self.learners_group)

    def barrier(self) -> None:
        import torch.distributed as tdist

        tdist.barrier(group=self.data)

    def notice(self, version: int) -> int:
        """Learner 0: says that `version`'s broadcast comes next; a rollout rank: waits (on the CPU) for that
        word and returns the version. See the module's docstring for why the weights never wait on the GPU."""
        import torch.distributed as tdist

        word = torch.tensor([version], dtype=torch.int64)
        tdist.broadcast(word, self.weight_root, group=self.notices)
        return int(word.item())


# ----- messages over the data group (pickled CPU objects) ---------------------------------------------------------
def send_object(obj: Any, dst: int, group: Any) -> None:
    import torch.distributed as tdist

    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    tdist.send(torch.tensor([data.numel()], dtype=torch.int64), dst, group=group)
    tdist.send(data, dst, group=group)


def recv_object(src: int, group: Any) -> Any:
    import torch.distributed as tdist

    size = torch.zeros(1, dtype=torch.int64)
    tdist.recv(size, src, group=group)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    tdist.recv(data, src, group=group)
    return pickle.loads(data.numpy().tobytes())


# ----- the learner's side -----------------------------------------------------------------------------------------
class LearnerPipe:
    """`AsyncRollout`'s interface (`take`, `publish`, `close`) for a learner rank: batches come from the rollout
    ranks, published versions go to them. The constructor does the handshake (start version `first` - 1, data
    position `pos0`, the start weights)."""

    def __init__(
        self, layout: Layout, model: Any, *, first: int, last: int, max_staleness: int, pos0: int,
        dtype: torch.dtype | None = None,
    ) -> None:  # fmt: skip
        self.layout, self.model = layout, model
        self.first, self.last, self.max_staleness = first, last, max_staleness
        self.tensors = weight_tensors(model)
        self.dtype = dtype or self.tensors[0].dtype
        self.taken: list[int] = []
        self.index = layout.rank  # this learner's slice of each batch
        self.ready: list[Batch | BaseException] = []
        self.arrived = threading.Condition()
        self.flat: torch.Tensor | None = None
        if layout.rank == layout.weight_root:
            import torch.distributed as tdist

            numel = sum(t.numel() for t in self.tensors)
            meta = torch.tensor([first - 1, pos0, numel, DTYPES.index(self.dtype)], dtype=torch.int64)
            tdist.broadcast(meta, layout.weight_root, group=layout.notices)
            self.publish(first - 1)
        self.thread = threading.Thread(target=self._receive, name="async-split-recv", daemon=True)
        self.thread.start()

    def _broadcast(self, t: torch.Tensor) -> None:
        import torch.distributed as tdist

        tdist.broadcast(t, self.layout.weight_root, group=self.layout.weights)

    def _receive(self) -> None:
        try:
            for step in range(self.first, self.last + 1):
                got = recv_object(self.layout.owner(step), self.layout.data)
                with self.arrived:
                    self.ready.append(got)
                    self.arrived.notify_all()
                if isinstance(got, BaseException):
                    return
        except BaseException as exc:
            with self.arrived:
                self.ready.append(exc)
                self.arrived.notify_all()

    def take(self, step: int) -> Batch:
        """Learner step `step`'s slice of its batch (blocks until it arrived); checks its staleness."""
        with self.arrived:
            while not self.ready:
                self.arrived.wait(timeout=1.0)
            got = self.ready.pop(0)
        if isinstance(got, BaseException):
            raise RuntimeError(f"the rollout rank failed: {got!r}") from got
        checked(got, step, self.max_staleness)
        self.taken.append(step)
        return got

    def publish(self, version: int) -> dict[str, float]:
        """Sends the model's weights to the rollout ranks as `version` (learner 0; a no-op on the others).
        Returns `time/weight_publish_s`: packing and the broadcast, to the end of the transfer."""
        if self.layout.rank != self.layout.weight_root:
            return {"time/weight_publish_s": 0.0}  # every learner has the same keys (their means)
        t0 = time.perf_counter()
        if self.flat is None:
            numel = sum(t.numel() for t in self.tensors)
            self.flat = torch.empty(numel, dtype=self.dtype, device=self.layout.device)
        packed = pack(self.tensors, self.flat)
        self.layout.notice(version)
        self._broadcast(packed)
        if self.flat.is_cuda:
            torch.cuda.current_stream().synchronize()  # a true number (the step ends with a sync anyway)
        return {"time/weight_publish_s": time.perf_counter() - t0}

    def close(self) -> None:
        """Waits for the receiver and for every rank to finish (the rollout ranks' end is this barrier)."""
        self.thread.join(timeout=60)
        self.layout.barrier()


# ----- the rollout rank's side ------------------------------------------------------------------------------------
class RemoteWeights(ActorWeights):
    """The gate of a rollout rank: its model is the actor; versions arrive over the weights group (`load`)."""

    def __init__(self, actor: Any) -> None:
        super().__init__(None, actor, version=-1)
        self.tensors = weight_tensors(actor)
        self.load_s: list[float] = []

    def publish(self, version: int) -> None:  # pragma: no cover - the learner is in another process
        raise RuntimeError("a rollout rank's weights come from the learner (load)")

    def load(self, flat: torch.Tensor, version: int) -> None:
        t0 = time.perf_counter()
        with self.lock:
            unpack(flat, self.tensors)
            if flat.is_cuda:
                torch.cuda.current_stream().synchronize()  # loaded before the version says so
            self.version = version
        self.load_s.append(time.perf_counter() - t0)
        with self.changed:
            self.changed.notify_all()


@dataclass
class Start:
    """What the handshake told a rollout rank."""

    version: int  # the learner's start version (its step at start)
    data_pos: int  # the data position of the learner's first step
    flat: torch.Tensor  # the staging buffer (size and dtype of the learner's)


def handshake(layout: Layout, gate: RemoteWeights) -> Start:
    """Receives the start version, data position and weights from learner 0 and loads them into `gate`."""
    import torch.distributed as tdist

    meta = torch.zeros(4, dtype=torch.int64)
    tdist.broadcast(meta, layout.weight_root, group=layout.notices)
    version, pos0, numel, dtype = (int(x) for x in meta.tolist())
    mine = sum(t.numel() for t in gate.tensors)
    if numel != mine:
        raise ConfigError(
            f"the learner's model has {numel} weights, this rollout rank's {mine}: not the same model"
        )
    flat = torch.empty(numel, dtype=DTYPES[dtype], device=layout.device)
    if layout.notice(-1) != version:
        raise RuntimeError(f"rollout rank {layout.rank}: the handshake's weights are not version {version}")
    tdist.broadcast(flat, layout.weight_root, group=layout.weights)
    gate.load(flat, version)
    return Start(version, pos0, flat)


def serve_batches(
    layout: Layout, roller: TreeRollout, gate: RemoteWeights, start: Start, *, last: int, max_staleness: int,
    draw: Callable[[int], list[RolloutTask]], seed: Callable[[int], int],
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext, per_tree: bool = False,
) -> list[int]:  # fmt: skip
    """A rollout rank's run: grows its batches (worker thread), loads every version the learner publishes
    (receiver thread), sends each batch's slices to the learners as it is done (this thread). Returns the
    steps it grew."""
    import torch.distributed as tdist

    first = start.version + 1
    mine = [s for s in range(first, last + 1) if layout.owner(s) == layout.rank]
    device = layout.device

    def receive() -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the current device is per thread
        for v in range(first, last + 1):
            got = layout.notice(-1)
            if got != v:
                raise RuntimeError(
                    f"rollout rank {layout.rank}: expected version {v}, the learner sends {got}"
                )
            tdist.broadcast(start.flat, layout.weight_root, group=layout.weights)
            gate.load(start.flat, v)

    receiver = threading.Thread(target=receive, name="async-split-weights", daemon=True)
    receiver.start()
    pipe = AsyncRollout(
        roller, gate, first=first, last=last, max_staleness=max_staleness, draw=draw, seed=seed, context=context,
        steps=mine, per_tree=per_tree,
    ).start()  # fmt: skip
    try:
        for _ in mine:
            try:
                got = pipe.next()
            except BaseException as exc:  # the learners raise it at their take
                for i in range(layout.learners):
                    send_object(RuntimeError(f"rollout rank {layout.rank}: {exc!r}"), i, layout.data)
                raise
            per = len(got.forest) // layout.learners
            for i in range(layout.learners):
                sl = slice(i * per, (i + 1) * per)
                part = dataclasses.replace(got, forest=got.forest[sl], tasks=got.tasks[sl])
                send_object(part, i, layout.data)
        receiver.join()
    finally:
        pipe.close()
    return mine


def serve(cfg: Any, layout: Layout, model: Any = None, tokenizer: Any = None) -> dict[str, float]:
    """`grpo.train` on a rollout rank: builds the model, engine and rollout as the learner would, then serves
    batches until the learner's last step. Returns no metrics (rank 0 logs)."""
    from toolgym.agents.hf import HFPolicy
    from toolgym.trainers.async_rollout import rollout_engine
    from toolgym.trainers.episodes import next_tasks
    from toolgym.trainers.grpo import vocab_size
    from toolgym.trainers.modeling import autocast, build_policy

    device = layout.device
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    actor = policy.model
    actor.eval()
    actor.requires_grad_(False)
    gate = RemoteWeights(actor)
    start = handshake(layout, gate)
    rollout = rollout_engine(
        cfg, HFPolicy(actor, policy.tokenizer, batch_size=256, reuse_kv=device.type == "cpu"), quiet=True
    )
    roller = TreeRollout(
        rollout, cfg.branch_policy(vocab_size(actor)), cfg.rollout_config(), cfg.env_kwargs, gate=gate,
        env_backend=cfg.env_backend(),
    )  # fmt: skip
    n, base, pos0 = cfg.prompts_per_step, start.version, start.data_pos
    try:
        serve_batches(
            layout, roller, gate, start, last=cfg.steps, max_staleness=cfg.max_staleness,
            draw=lambda s: next_tasks(cfg.env_ids, cfg.seed, pos0 + (s - base - 1) * n, n),
            seed=lambda s: cfg.seed * 100_003 + s, context=lambda: autocast(device, cfg.bf16),
            per_tree=cfg.async_admission == "tree",
        )  # fmt: skip
    finally:
        roller.close()
    layout.barrier()  # the learners' LearnerPipe.close
    import torch.distributed as tdist

    tdist.destroy_process_group()
    return {}
