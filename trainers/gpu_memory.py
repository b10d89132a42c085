"""GPU memory of a run: handing it back between the phases of a run (a rollout engine's KV cache and packed
weights before the update, LSPO's DPO; one pipeline unit's models before the next unit's), and the one
estimate of what a run holds, checked at start (``memory_plan``)."""

from __future__ import annotations

import gc
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError


def free_gpu_memory() -> None:
    """Collects unreachable objects first (a reference cycle can keep CUDA tensors alive), then gives the
    CUDA caching allocator's unused blocks back to the driver, so the next phase or another process on the
    GPU can take them. Without CUDA (or without torch) it only collects."""
    gc.collect()
    try:
        import torch
    except ImportError:  # (the benchmark pipeline's parent process need not have torch)
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the run's memory estimate, checked at start --------------------------------------------------------------
#
# ``engine_memory`` is a share of the GPU memory free at start (after the learner's model is loaded). Before
# this estimate each engine took that share of what was free when *it* was made, and the weight copies a run
# makes (the engines' packed weights, a frozen self-play opponent, an asynchronous actor, the KL reference)
# came on top, uncounted: a share near the free memory ran out mid-run (the optimizer's state is allocated
# at the first step). Now the copies come off the free memory first, the KV caches take ``engine_memory`` of
# what is left, and the rest must hold the optimizer's state and gradients, or the run stops at start with a
# ``ConfigError`` saying what to lower.

GB = 1e9


def free_bytes(device: Any) -> int | None:
    """Free memory of a CUDA device (None elsewhere: a CPU run is not budgeted)."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info(device)[0])


def weights_bytes(model: Any, itemsize: int | None = None) -> int:
    """Bytes of ``model``'s parameters and buffers (each at ``itemsize`` bytes when given, else its own)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * (itemsize or t.element_size()) for t in tensors)


def packed_bytes(model: Any, itemsize: int) -> int:
    """Bytes of our engine's packed copy of ``model`` (agents/engine/weights.py ``PackedWeights``: the
    embedding, the head unless tied, the norms and every layer's fused projections; biases are negligible)."""
    from toolgym.agents.engine.weights import shape_of

    s = shape_of(model)
    per_layer = (
        2 * s.hidden + s.qkv_dim * s.hidden + s.hidden * s.heads * s.head_dim + 3 * s.intermediate * s.hidden
    )
    head = 0 if s.tied else s.vocab * s.hidden
    return (s.vocab * s.hidden + head + s.hidden + s.layers * per_layer) * itemsize


def trainer_state_bytes(model: Any) -> int:
    """The optimizer's state and the gradients the first step allocates: AdamW's two moments and one
    gradient per trainable parameter, each in the parameter's dtype."""
    return sum(3 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@dataclass(frozen=True)
class MemoryPlan:
    """One estimate of what a run holds on its GPU beyond the learner's weights (module comment above).
    ``free`` None: not budgeted (CPU, fsdp2); the engines then size themselves as before."""

    free: int | None
    memory: float
    copies: tuple[tuple[str, int, str], ...] = ()  # (what, bytes, how to avoid it)
    state: int = 0
    kv_shares: tuple[tuple[str, float], ...] = ()  # (engine, its share of the KV budget)
    kv_reserved: bool = True  # False: no engine reserves a KV cache (engine=hf, or auto falling back to it)

    @property
    def copies_bytes(self) -> int:
        return sum(c[1] for c in self.copies)

    @property
    def kv_bytes(self) -> int:
        """What the KV caches take together: ``engine_memory`` of the free memory the copies leave."""
        if not self.kv_reserved:
            return 0
        return int(self.memory * max(0, (self.free or 0) - self.copies_bytes))

    def kv(self, engine: str) -> int | None:
        """The KV-cache bytes of ``engine`` ("learner", "frozen", "actor"); None when not budgeted."""
        if self.free is None:
            return None
        share = dict(self.kv_shares).get(engine)
        return None if share is None else int(self.kv_bytes * share)

    def describe(self) -> str:
        if self.free is None:
            return "toolgym: GPU memory not budgeted (no CUDA device, or fsdp2)"
        copies = ", ".join(f"{what} {n / GB:.2f}" for what, n, _ in self.copies) or "none"
        return (
            f"toolgym: GPU memory at start {self.free / GB:.2f} GB free; weight copies "
            f"{self.copies_bytes / GB:.2f} GB ({copies}); optimizer state and gradients {self.state / GB:.2f} GB; "
            f"KV caches {self.kv_bytes / GB:.2f} GB (engine_memory={self.memory:.3g} of what the copies leave)"
        )

    def check(self) -> None:
        """A ``ConfigError`` naming what to lower when the copies, the KV caches and the optimizer's state
        do not fit in the free memory together."""
        if self.free is None:
            return
        avoid = "; ".join(f"{what}: {how}" for what, _, how in self.copies if how)
        if self.copies_bytes + self.state >= self.free:
            raise ConfigError(
                f"GPU memory: {self.free / GB:.2f} GB free at start cannot hold the run's weight copies "
                f"({self.copies_bytes / GB:.2f} GB) and the optimizer state and gradients ({self.state / GB:.2f} GB)"
                f"; drop a copy ({avoid or 'none to drop'}), train LoRA adapters (lora_r), or use a larger GPU"
            )
        rest = self.free - self.copies_bytes - self.kv_bytes
        if rest < self.state:
            top = math.floor(100 * (1 - self.state / (self.free - self.copies_bytes))) / 100
            raise ConfigError(
                f"GPU memory: engine_memory={self.memory:.3g} gives the KV caches {self.kv_bytes / GB:.2f} GB of the "
                f"{(self.free - self.copies_bytes) / GB:.2f} GB the weight copies leave, and the optimizer state and "
                f"gradients need {self.state / GB:.2f} GB of the {rest / GB:.2f} GB left: lower engine_memory to at "
                f"most {top:.2f}" + (f", or drop a copy ({avoid})" if avoid else "")
            )


def memory_plan(
    cfg: Any, model: Any, device: Any, *, actor: bool = False, quiet: bool = False, free: int | None = None
) -> MemoryPlan:
    """The memory estimate of a run of ``cfg`` (its ``engine``, ``engine_memory``, ``selfplay``, ``kl_coef``,
    ``parallel``) with ``model`` loaded on ``device``, checked (``MemoryPlan.check``) and printed on stderr
    unless ``quiet``. ``actor``: an asynchronous run of one process (an actor copy and its own engine).
    Call it before the first engine is made: ``free`` (bytes; measured now when None) is the start."""
    memory = float(cfg.engine_memory)
    free = free_bytes(device) if free is None else free
    if free is None or getattr(cfg, "parallel", "ddp") == "fsdp2":
        return MemoryPlan(None, memory)
    from toolgym.agents.engine.weights import unsupported

    ours = cfg.engine == "fast" or (
        cfg.engine == "auto" and device.type == "cuda" and unsupported(model) is None
    )
    itemsize = 2 if device.type == "cuda" else 4  # the engine's dtype: bf16 on CUDA (select.py)
    copies: list[tuple[str, int, str]] = []
    shares: dict[str, float] = {"learner": 1.0} if ours else {}
    if ours:
        copies.append(("the learner engine's packed weights", packed_bytes(model, itemsize), "engine=hf"))
    lora = getattr(cfg, "lora_r", 0) > 0 or hasattr(model, "disable_adapter")
    if getattr(cfg, "kl_coef", 0) > 0 and not lora:
        copies.append(("the KL reference", weights_bytes(model), "kl_coef=0"))
    play = _selfplay(cfg)
    if play is not None and play.frozen_seats:
        # snapshot "initial" and a transformers folder load in fp32 (selfplay.load_snapshot); model.pt copies
        pt = play.snapshot != "initial" and Path(play.snapshot, "model.pt").is_file()
        copies.append(
            ("the frozen opponent", weights_bytes(model, None if pt else 4), "selfplay.frozen_seats=0")
        )
        if ours:
            copies.append(
                ("the frozen opponent engine's packed weights", packed_bytes(model, itemsize), "engine=hf")
            )
            seats = play.learner_seats + play.frozen_seats
            shares = {"learner": play.learner_seats / seats, "frozen": play.frozen_seats / seats}
    if actor:
        copies.append(("the asynchronous actor", weights_bytes(model), "max_staleness=0"))
        if ours:
            copies.append(("the actor engine's packed weights", packed_bytes(model, itemsize), "engine=hf"))
            shares = {"learner": 0.5, "actor": 0.5}  # the learner's engine only runs the evaluations
    # vLLM in this process reserves its engine_memory too; on rollout servers or HF nothing here does
    reserved = ours or (cfg.engine == "vllm" and not getattr(cfg, "rollout_servers", None))
    plan = MemoryPlan(
        free, memory, tuple(copies), trainer_state_bytes(model), tuple(shares.items()), kv_reserved=reserved
    )
    if not quiet:
        print(plan.describe(), file=sys.stderr)
    plan.check()
    return plan


def _selfplay(cfg: Any) -> Any:
    """``cfg``'s self-play options (a ``SelfPlayConfig``), or None."""
    options = getattr(cfg, "selfplay", None)
    if not options:
        return None
    from toolgym.trainers.selfplay import SelfPlayConfig

    return options if isinstance(options, SelfPlayConfig) else SelfPlayConfig.from_dict(options)
