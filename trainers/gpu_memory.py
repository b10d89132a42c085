"""Handing GPU memory back between the phases of a run: a rollout engine's KV cache and packed weights
before the update (LSPO's DPO), one pipeline unit's models before the next unit's."""

from __future__ import annotations

import gc


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
