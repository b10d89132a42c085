"""The slotted KV cache of the engine: ``slots`` sequences of up to ``capacity`` tokens each, allocated once.

``k``/``v`` are ``[layers, slots + 1, kv_heads, capacity, head_dim]``; a slot's positions hold its sequence
in order, so a sequence's cache is one contiguous run per (layer, head) and a prefix fork is one strided
copy. The extra last slot is scratch: CUDA-graph padding rows write there. ``cos``/``sin`` are the rotary
tables for every position ([capacity, head_dim / 2], float32).
"""

from __future__ import annotations

import torch

from toolgym.agents.engine.weights import ModelShape


class SlotNumbers:
    """Which of ``slots`` slots of ``capacity`` tokens are free: the part of the cache the scheduler uses (no
    tensors, so the scheduler is tested on it alone)."""

    def __init__(self, slots: int, capacity: int) -> None:
        self.slots, self.capacity = slots, capacity
        self.free = list(range(slots))[::-1]

    def alloc(self) -> int | None:
        return self.free.pop() if self.free else None

    def release(self, slot: int) -> None:
        self.free.append(slot)


class KVCache(SlotNumbers):
    def __init__(
        self, shape: ModelShape, slots: int, capacity: int, device: torch.device, dtype: torch.dtype,
        inv_freq: torch.Tensor, rope_scale: float = 1.0,
    ) -> None:  # fmt: skip
        super().__init__(slots, capacity)
        size = (shape.layers, slots + 1, shape.kv_heads, capacity, shape.head_dim)
        self.k = torch.zeros(size, device=device, dtype=dtype)
        self.v = torch.zeros(size, device=device, dtype=dtype)
        freqs = torch.arange(capacity, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos = (freqs.cos() * rope_scale).contiguous()  # [T, D/2]
        self.sin = (freqs.sin() * rope_scale).contiguous()
        self.scratch = slots

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """The first ``n`` positions of slot ``src`` into slot ``dst`` (a fork: no recomputation)."""
        if n > 0:
            self.k[:, dst, :, :n].copy_(self.k[:, src, :, :n])
            self.v[:, dst, :, :n].copy_(self.v[:, src, :, :n])

    def copy_prefix_many(self, src: int, dsts: list[int], n: int) -> None:
        """One source prefix into several slots with one gather/scatter per tensor."""
        if n <= 0 or not dsts:
            return
        if len(dsts) == 1:
            self.copy_prefix(src, dsts[0], n)
            return
        idx = torch.tensor(dsts, device=self.k.device)
        for buf in (self.k, self.v):
            part = buf[:, src, :, :n]  # [L, Hkv, n, D]
            buf[:, idx, :, :n] = part[:, None].expand(-1, len(dsts), -1, -1, -1)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
