"""FSDP2 for the update (``parallel: fsdp2``): weights, gradients and AdamW state sharded over the ranks.

Layout: ``fully_shard`` on every decoder layer (the classes the HF model names in ``_no_split_modules``),
then on the root (embeddings, final norm, LM head). On CUDA with ``bf16`` the forward and backward run in
bf16 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) over fp32 master weights and fp32
gradient reduce-scatters; on CPU everything stays fp32. ``fsdp_offload`` keeps the sharded weights,
gradients and AdamW state in CPU memory (``CPUOffloadPolicy``; the optimizer step then runs on the CPU).
``gradient_checkpointing`` is HF's per-layer checkpointing, applied before sharding: each recomputed
layer all-gathers its weights again in the backward. Gradients are reduce-scattered after every
micro-batch (no ``no_sync``): accumulating unsharded gradients would hold a full fp32 gradient per rank.

The hybrid engine: a sharded model cannot generate (every forward all-gathers, and ranks take different
numbers of decode steps), so the rollout runs on a full copy of the weights on every rank (``RolloutCopy``:
a plain HF model, bf16 on CUDA, fp32 on CPU, frozen). ``RolloutCopy.sync`` gathers the current weights
into it one parameter at a time (``DTensor.full_tensor``, in the copy's dtype) after each step's optimizer
steps and after a checkpoint is loaded; the rollout engine (ours, or the HF path) reads the copy exactly as
it reads the live model under DDP (agents/engine/weights.py re-packs when the copy's weights change).
``full_tensors`` yields the same gathered tensors one at a time for an engine that loads weights itself
(vLLM's ``load_weights``): no copy then.

Memory per rank, P parameters over N ranks (``memory_per_rank`` computes it): sharded fp32 weights,
gradients and AdamW moments 16·P/N bytes (0 on the GPU with offload); the rollout copy 2·P (bf16); our
engine packs another 2·P from it (the HF path does not); during the sync one parameter's full tensor.
Against DDP's 16·P + 2·P (engine) that is a 7B model in 16·7/2 + 4·7 = 84 GB per rank on 2 GPUs, or
28 GB + activations with offload, where DDP needs 126 GB.

Lockstep: every forward of a sharded model is a collective, so every rank must run the same number of
micro-batches. ``lockstep`` pads a rank's micro-batches with empty ones up to the largest count any rank has
(the old-logprob loop calls it; the update pads with ``Dist.pad``): an empty one runs a dummy row (a zero loss
in the update), so a rank whose rows were all filtered out still takes part in every collective.

Departures: the packed update (trainers/packing.py) reads the LM head's weight outside the model's forward,
where FSDP has not gathered it, so under fsdp2 the padded update runs (``packing: off``, and with it no
compiled layers and no shared prefixes). LoRA is not sharded (its adapters are small: use DDP). KL-in-reward
shaping and IGPO's scorer run forwards outside the lockstep loops: with several ranks they are a
ConfigError under fsdp2, and so are asynchronous rollouts (``max_staleness > 0``: their actor copies the
learner's live weights, which are shards here).
"""

from __future__ import annotations

import copy
import socket
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from toolgym.errors import ConfigError


def is_sharded(module: Any) -> bool:
    """Whether ``module`` was passed to ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def check(cfg: Any, world: int) -> None:
    """A ConfigError for the options fsdp2 cannot run (module docstring, Departures)."""
    if cfg.lora_r > 0:
        raise ConfigError("parallel=fsdp2 does not shard LoRA adapters: use parallel=ddp with lora_r > 0")
    if world > 1 and getattr(cfg, "kl_in_reward", False) and cfg.kl_coef > 0:
        raise ConfigError(
            "kl_in_reward under parallel=fsdp2 with several ranks is not supported: use kl_coef as a loss term"
        )
    if getattr(cfg, "rollout_ranks", 0) > 0:
        raise ConfigError("rollout_ranks (the split layout) shards nothing: use parallel=ddp with it")
    if getattr(cfg, "max_staleness", 0) > 0:
        raise ConfigError(
            "max_staleness > 0 (asynchronous rollouts) copies the learner's live weights: use parallel=ddp"
        )
    if world > 1 and getattr(cfg, "estimator", None) == "igpo":
        raise ConfigError(
            "estimator=igpo under parallel=fsdp2 with several ranks is not supported: use parallel=ddp"
        )


def join_single_rank(device: torch.device) -> bool:
    """A process group of one rank (fully_shard needs one) when none exists; True when it made one."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    return True


def layer_classes(model: Any) -> tuple[type[torch.nn.Module], ...]:
    """The model's decoder-layer classes (HF lists them in ``_no_split_modules``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    found = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    if not found:
        raise ConfigError(
            f"parallel=fsdp2 found no decoder layers in {type(base).__name__} (it names none in _no_split_modules)"
        )
    return found


def shard(model: Any, device: torch.device, *, bf16: bool, offload: bool, layers: bool = True) -> Any:
    """``fully_shard`` each decoder layer (``layers``), then the root, over all ranks; in place (returns ``model``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda" and bf16
        else MixedPrecisionPolicy()
    )
    # pinned host memory needs CUDA; on CPU the "offloaded" shards simply stay where they are
    off = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    if layers:
        kinds = layer_classes(model)
        layer_modules: list[torch.nn.Module] = [m for m in model.modules() if isinstance(m, kinds)]
        for m in layer_modules:
            fully_shard(m, mesh=mesh, mp_policy=mp, offload_policy=off)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=off)
    return model


def full_tensor(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole of a (possibly sharded) parameter, in ``dtype`` (a collective when ``p`` is a DTensor)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return p.detach().to(dtype or p.dtype)
    local = p.to_local().detach()
    mesh = p.device_mesh
    # offloaded shards live on the CPU: gather them on the mesh's device (nccl cannot gather host memory)
    where = (
        torch.device(mesh.device_type, torch.cuda.current_device())
        if mesh.device_type == "cuda"
        else local.device
    )
    local = local.to(device=where, dtype=dtype or local.dtype)
    whole = DTensor.from_local(local, mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
    return whole.full_tensor()


def full_tensors(model: Any, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter, gathered one at a time (every rank must iterate all of them)."""
    for name, p in model.named_parameters():
        yield name, full_tensor(p, dtype)


def copy_weights(model: Any, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
    """A frozen deep copy of ``model`` whose parameters are made straight in ``dtype`` on ``device`` (no
    full-precision copy in between: for a 7B model that transient would be 28 GB)."""
    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach().to(device=device, dtype=dtype, copy=True), requires_grad=False)
        for p in model.parameters()
    }
    return copy.deepcopy(model, memo).requires_grad_(False)


class RolloutCopy:
    """The rollout's full-weight copy of a model that is about to be sharded (module docstring)."""

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        if is_sharded(model):
            raise ConfigError(
                "RolloutCopy needs the model before fully_shard (FSDP modules cannot be copied)"
            )
        self.model = copy_weights(model, dtype=dtype).eval()
        if hasattr(self.model, "gradient_checkpointing_disable"):
            self.model.gradient_checkpointing_disable()  # it only generates
        self.dtype = dtype
        self.syncs = 0

    @torch.no_grad()
    def sync(self, sharded: Any) -> None:
        """Gathers ``sharded``'s current weights into the copy (a collective: every rank calls it)."""
        own = dict(self.model.named_parameters())
        for name, whole in full_tensors(sharded, self.dtype):
            if name not in own:
                raise ConfigError(
                    f"the rollout copy has no parameter {name!r} (the sharded model's names changed)"
                )
            own[name].copy_(whole)  # bumps the copy's version: the engine re-packs before its next call
        self.syncs += 1


@dataclass
class Memory:
    """Bytes per rank of one layout (``memory_per_rank``)."""

    train_gpu: float  # sharded (fsdp2) or whole (ddp) weights + gradients + AdamW on the GPU
    train_cpu: float  # the same in host memory (fsdp2 with offload)
    rollout: float  # the rollout's full bf16 copy (fsdp2) + our engine's packed bf16 weights

    @property
    def gpu(self) -> float:
        return self.train_gpu + self.rollout


def memory_per_rank(
    params: int, ranks: int, parallel: str, offload: bool = False, engine: bool = True
) -> Memory:
    """Model-state bytes per rank before activations and KV cache (fp32 weights, grads, 2 AdamW moments).

    >>> m = memory_per_rank(7_000_000_000, 2, "fsdp2")
    >>> round(m.train_gpu / 1e9), round(m.rollout / 1e9), round(m.gpu / 1e9)
    (56, 28, 84)
    >>> round(memory_per_rank(7_000_000_000, 2, "ddp").gpu / 1e9)
    126
    >>> round(memory_per_rank(7_000_000_000, 2, "fsdp2", offload=True).gpu / 1e9)
    28
    """
    state = 16.0 * params
    packed = 2.0 * params if engine else 0.0
    if parallel == "ddp":
        return Memory(train_gpu=state, train_cpu=0.0, rollout=packed)
    shard_bytes = state / ranks
    return Memory(
        train_gpu=0.0 if offload else shard_bytes,
        train_cpu=shard_bytes if offload else 0.0,
        rollout=2.0 * params + packed,
    )


_references: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def initial_copy(model: Any) -> Any:
    """The sharded copy of ``model``'s initial weights that ``Sharded.take`` kept for the KL reference."""
    if model not in _references:
        raise ConfigError(
            "this sharded model kept no initial copy for a KL reference (kl_coef was 0 when it was sharded)"
        )
    return _references[model]


# ----- what the trainers call ------------------------------------------------------------------------------
class Sharded:
    """One run's FSDP2 state: the sharded model, its rollout copy, the sharded KL reference."""

    def __init__(self, cfg: Any, device: torch.device, world: int, quiet: bool = False) -> None:
        check(cfg, world)
        self.device = device
        self.bf16 = bool(cfg.bf16)
        self.offload = bool(cfg.fsdp_offload)
        self.own_group = join_single_rank(device)
        self.copy: RolloutCopy | None = None
        self.model: Any = None
        self.reference: Any = None
        if getattr(cfg, "packing", "off") != "off":
            if cfg.packing == "on" and not quiet:
                print(
                    "toolgym: packing is off under parallel=fsdp2 (the padded update runs)", file=sys.stderr
                )
            cfg.packing = "off"  # the packed scorer reads the LM head outside the sharded forward

    def take(self, model: Any, keep_reference: bool) -> RolloutCopy:
        """Copies ``model`` for the rollout (and, when asked, for the KL reference), then shards it."""
        cuda = self.device.type == "cuda"
        self.copy = RolloutCopy(model, torch.bfloat16 if cuda and self.bf16 else torch.float32)
        if keep_reference:  # the initial policy, sharded like the model but never stepped
            ref = copy_weights(model, device=torch.device("cpu")).eval()  # fully_shard moves its shards
            self.reference = shard(ref, self.device, bf16=self.bf16, offload=self.offload)
        self.model = shard(model, self.device, bf16=self.bf16, offload=self.offload)
        if self.reference is not None:
            _references[self.model] = self.reference
        return self.copy

    def shard_extra(self, module: torch.nn.Module) -> torch.nn.Module:
        """Shards a module outside the model (PPO's value head) as one unit."""
        return shard(module, self.device, bf16=self.bf16, offload=self.offload, layers=False)

    def sync(self) -> None:
        if self.copy is not None and self.model is not None:
            self.copy.sync(self.model)

    def close(self) -> None:
        if self.own_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.own_group = False


def lockstep(chunks: list[torch.Tensor], model: Any) -> list[torch.Tensor]:
    """``chunks`` (row indices) followed by empty ones up to the most micro-batches any rank has, so that every
    rank runs as many forwards (each a collective when sharded); the caller runs a dummy row for an empty one
    (``batch.dummy_batch``; with no row at all a rank would otherwise run none). Chunks never grow past
    ``micro_batch_rows`` (or ``micro_batch_tokens``). A no-op unless ``model`` is sharded over several ranks."""
    import torch.distributed as dist

    if not (is_sharded(model) and dist.is_initialized() and dist.get_world_size() > 1):
        return chunks
    count = torch.tensor([float(len(chunks))], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        count = count.cuda()
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return chunks + [torch.zeros(0, dtype=torch.long)] * (int(count.item()) - len(chunks))
