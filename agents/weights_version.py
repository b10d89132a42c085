"""When may a live model's weights have changed? For caches derived from them (the engine's packed weights,
``HFPolicy``'s reused KV), which must be rebuilt after every optimizer step.

Parameters' in-place version counters alone miss fused optimizer kernels (CUDA's fused AdamW updates every
parameter without bumping one), so the version also counts the optimizer steps taken in this process,
through torch's global step hook. A write through ``p.data`` or from outside torch is still invisible:
whoever does that forces a refresh.
"""

from __future__ import annotations

from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

_optimizer_steps = 0


def _count_optimizer_step(*_: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)

WeightsVersion = tuple[int, int, int]


def weights_version(model: Any) -> WeightsVersion:
    """Changes whenever an optimizer steps or a parameter is modified or replaced in place."""
    params = list(model.parameters())
    return _optimizer_steps, sum(int(p._version) for p in params), sum(id(p) for p in params)
