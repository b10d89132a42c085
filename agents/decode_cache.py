"""A KV cache that decodes without copying itself at every token (``HFPolicy``'s sampling loop).

transformers' ``DynamicLayer`` appends a token's keys/values with ``torch.cat``, which copies the whole
layer cache at every step: for 32 rows of 300 tokens that is ~440 MB of memory traffic per token of
SmolLM2-135M, a third of a CPU decode step (memory bandwidth, not arithmetic, bounds decoding there).
``with_room(cache, room)`` moves each full-attention layer into a buffer with ``room`` spare positions;
new tokens are written in place and ``keys``/``values`` are views of the filled part, so everything that
reads a ``DynamicLayer`` (attention, masks, ``kv_reuse.row_layers``) reads these the same way. A layer
that runs out of room doubles its buffer. Other cache kinds (sliding windows, older transformers) are
left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import cache_utils

# transformers >= 4.56 keeps one object per layer; with an older one the cache stays as it is
DynamicLayer: Any = getattr(cache_utils, "DynamicLayer", None)


if DynamicLayer is not None:

    class RoomyLayer(DynamicLayer):  # type: ignore[misc]
        """A full-attention layer cache [B, H, T, D] written into preallocated room."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
            super().__init__()
            self.room = room
            self._fill(keys, values, room)

        def _fill(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
            B, H, n, D = keys.shape
            self._k = keys.new_empty((B, H, n + room, D))  # [B, H, cap, D]
            self._v = values.new_empty((B, values.shape[1], n + room, values.shape[3]))
            self._k[:, :, :n] = keys
            self._v[:, :, :n] = values
            self._n = n
            self.device, self.is_initialized = keys.device, True
            self._views()

        def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys, self.values = keys, values = self._k[:, :, : self._n], self._v[:, :, : self._n]
            return keys, values

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:  # after reset()
                self._fill(key_states, value_states, self.room)
                return self._views()
            m = key_states.shape[-2]
            if self._n + m > self._k.shape[-2]:  # out of room: twice the size (rare: room is the turn's)
                self._fill(*self._views(), max(self._n, m))
            self._k[:, :, self._n : self._n + m] = key_states
            self._v[:, :, self._n : self._n + m] = value_states
            self._n += m
            return self._views()

        def get_seq_length(self) -> int:
            return self._n

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0 or not self.is_initialized:
                super().crop(tokens_to_remove)  # (transformers' errors and no-ops)
                return
            self._n = max(0, self._n + tokens_to_remove)
            self._views()


def with_room(cache: Any, room: int) -> Any:
    """``cache`` with its plain full-attention layers moved into buffers of ``room`` more positions."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return cache
    for i, layer in enumerate(layers):
        full = type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None
        if full and layer.keys.numel():
            layers[i] = RoomyLayer(layer.keys, layer.values, room)
    return cache
