"""Cross-turn KV reuse for ``HFPolicy(reuse_kv=True)``.

In a multi-turn episode the prompt of turn k+1 starts with the prompt and the sampled ids of turn k. When a
row finishes, its KV cache (prompt + sampled ids but the last, which was never fed) is kept under those
ids; the next ``generate`` call that gets a prompt extending them starts from that cache and runs only the
new tokens (the closed turn and the env's messages). Entries are used once, at most ``capacity`` are kept
(oldest dropped), and all are dropped when the weights may have changed (``agents/weights_version.py``: any
optimizer step, fused ones included, or an in-place write), so a trainer never reads a stale cache.

Only models whose cache is a plain ``DynamicCache`` of full-attention layers take part; others run as if
``reuse_kv`` were off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolgym.agents.weights_version import WeightsVersion


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
    import torch
    from transformers.cache_utils import DynamicCache

    sample = next(h for h in hits if h is not None)
    n_layers = len(sample.layers)
    B = len(hits)
    k0 = sample.layers[0][0]
    mask = torch.zeros((B, width), dtype=torch.long, device=k0.device)
    cache = DynamicCache(config=model.config)
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
