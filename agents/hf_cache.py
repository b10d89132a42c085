"""``HFPolicy``'s KV cache: decoding in place, and reuse across the turns of an episode.

**Decoding in place.** transformers' ``DynamicLayer`` appends a token's keys/values with ``torch.cat``, which
copies the whole layer cache at every step: for 32 rows of 300 tokens that is ~440 MB of memory traffic per
token of SmolLM2-135M, a third of a CPU decode step (memory bandwidth, not arithmetic, bounds decoding
there). ``with_room(cache, room)`` moves each full-attention layer into a buffer with ``room`` spare
positions; new tokens are written in place and ``keys``/``values`` are views of the filled part, so
everything that reads a ``DynamicLayer`` (attention, masks, ``row_layers``) reads these the same way. A
layer that runs out of room doubles its buffer. Other cache kinds (sliding windows, older transformers)
are left as they are.

**Reuse across turns** (``HFPolicy(reuse_kv=True)``). In a multi-turn episode the prompt of turn k+1 starts
with the prompt and the sampled ids of turn k. When a row finishes, its KV cache (prompt + sampled ids but
the last, which was never fed) is kept under those ids in a ``KVStore``; the next ``generate`` call that
gets a prompt extending them starts from that cache (``build_cache``) and runs only the new tokens (the
closed turn and the env's messages). Entries are used once, at most ``capacity`` are kept (oldest
dropped), and all are dropped when the weights may have changed (``agents/weights_version.py``: any
optimizer step, fused ones included, or an in-place write), so a trainer never reads a stale cache. Only
models whose cache is a plain ``DynamicCache`` of full-attention layers take part; others run as if
``reuse_kv`` were off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import cache_utils

from toolgym.agents.weights_version import WeightsVersion

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


@dataclass
class KVEntry:
    ids: tuple[int, ...]
    layers: list[tuple[Any, Any]]  # per layer (keys [H, L, D], values [H, L, D])


def cache_layers(cache: Any) -> list[tuple[Any, Any]] | None:
    """(keys, values) per layer [B, H, T, D], or None when the cache is not plain full attention."""
    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer).__name__ not in ("DynamicLayer", "RoomyLayer") for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


class KVStore:
    """Finished rows' caches, looked up by the longest stored prefix of a new prompt."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[int, KVEntry] = OrderedDict()
        self.version: WeightsVersion | None = None
        self.hits = 0
        self.reused_tokens = 0

    def check_version(self, version: WeightsVersion) -> None:
        if version != self.version:
            self.entries.clear()
            self.version = version

    def put(self, ids: Sequence[int], layers: list[tuple[Any, Any]]) -> None:
        if not ids:
            return
        entry = KVEntry(tuple(ids), layers)
        self.entries[id(entry)] = entry
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def take(self, prompt: Sequence[int]) -> KVEntry | None:
        """The longest entry whose ids are a proper prefix of ``prompt`` (removed from the store)."""
        best_key, best = None, None
        n = len(prompt)
        for key, e in self.entries.items():
            m = len(e.ids)
            if m >= n or (best is not None and m <= len(best.ids)) or prompt[m - 1] != e.ids[-1]:
                continue  # cheap checks first: most entries belong to other episodes
            if tuple(prompt[max(0, m - 16) : m]) == e.ids[-16:] and tuple(prompt[:m]) == e.ids:
                best_key, best = key, e
        if best_key is not None and best is not None:
            del self.entries[best_key]
            self.hits += 1
            self.reused_tokens += len(best.ids)
        return best

    def clear(self) -> None:
        self.entries.clear()


def row_layers(cache: Any, row: int, valid: Any) -> list[tuple[Any, Any]] | None:
    """One row's keys/values at the ``valid`` positions (a bool mask [T]), copied out of a batch cache."""
    layers = cache_layers(cache)
    if layers is None:
        return None
    idx = valid.nonzero().squeeze(-1)
    return [(k[row].index_select(1, idx).clone(), v[row].index_select(1, idx).clone()) for k, v in layers]


def build_cache(model: Any, hits: Sequence[KVEntry | None], width: int) -> tuple[Any, Any]:
    """A batch ``DynamicCache`` of ``width`` positions, each row's entry right-aligned (left zeros), and its
    mask [B, width]."""
    sample = next(h for h in hits if h is not None)
    n_layers = len(sample.layers)
    B = len(hits)
    k0 = sample.layers[0][0]
    mask = torch.zeros((B, width), dtype=torch.long, device=k0.device)
    cache = cache_utils.DynamicCache(config=model.config)
    for layer in range(n_layers):
        kh, vh = sample.layers[layer]
        keys = kh.new_zeros((B, kh.shape[0], width, kh.shape[2]))  # [B, H, W, D]
        values = vh.new_zeros((B, vh.shape[0], width, vh.shape[2]))  # [B, H, W, D]
        for i, h in enumerate(hits):
            if h is not None:
                k, v = h.layers[layer]
                keys[i, :, width - k.shape[1] :] = k
                values[i, :, width - v.shape[1] :] = v
        cache.update(keys, values, layer)
    for i, h in enumerate(hits):
        if h is not None:
            mask[i, width - len(h.ids) :] = 1
    return cache, mask
