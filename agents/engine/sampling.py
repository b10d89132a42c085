"""Sampling on the device: greedy, temperature, top-k, top-p; the logprob of the distribution sampled from.

``sample`` returns, per row, the token, its log-probability under the distribution it was actually drawn
from (tempered, then truncated by top-k/top-p and renormalised; under ``softmax(logits)`` when greedy), and
optionally the entropy of the tempered distribution before truncation (the model's uncertainty, which
branching policies read). Draws use the exponential race (``argmax log p - log E``, E ~ Exp(1)), which
needs no host sync and runs inside a CUDA graph.

Keyed rows: a row with a nonzero int64 ``key`` (a request's seed, ``request_key``) draws its race from a
counter-based hash of (key, the sampled token's position in its sequence, vocabulary index) instead of the
engine's generator, so its noise does not depend on which other rows share the batch or when it joined
(vLLM keeps a generator per request for the same reason). The hash is splitmix64 in int64 tensor ops (right
shifts masked to be logical), elementwise: on CPU and inside a CUDA graph alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SampleMode:
    """What a decode graph bakes in (one graph per batch bucket and mode)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    entropies: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


_MASK64 = (1 << 64) - 1


def _i64(x: int) -> int:
    """``x`` modulo 2**64 as a signed int64 (torch's integers are signed)."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


_GOLDEN = _i64(0x9E3779B97F4A7C15)  # splitmix64's increment
_MUL1 = _i64(0xBF58476D1CE4E5B9)
_MUL2 = _i64(0x94D049BB133111EB)


def request_key(seed: int, index: int = 0) -> int:
    """The nonzero int64 key of a request's ``index``-th sequence (a choice of ``n``) with OpenAI ``seed``."""
    z = _mix_int((_mix_int(seed & _MASK64) + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64)
    return _i64(z) or 1


def _mix_int(z: int) -> int:
    """splitmix64's finalizer on a Python int in [0, 2**64)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic: negatives would fill with ones)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer in int64 ops (multiplication wraps modulo 2**64 on CPU and CUDA)."""
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def keyed_race(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) noise [B, V] (float32) hashed from (``keys`` [B], ``positions`` [B], vocabulary index)."""
    row = _mix(_mix(keys) + positions * _GOLDEN)  # [B]: one stream per (key, position)
    cols = torch.arange(vocab, device=keys.device) * _GOLDEN  # [V]
    z = _mix(row[:, None] + cols)  # [B, V]
    # the top 23 bits + 1/2, scaled: u in [2**-24, 1 - 2**-24], exact in float32, never 0 or 1
    u = (_shr(z, 41).float() + 0.5) * (1.0 / (1 << 23))
    return -torch.log(u)


def sample(
    logits: torch.Tensor,
    mode: SampleMode,
    generator: torch.Generator | None = None,
    keys: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens [B], logprobs [B], entropies [B] or None) from float32 logits [B, V]. ``keys`` [B] (int64, 0:
    unkeyed) with ``positions`` [B] (where each row's drawn token goes in its sequence): keyed rows draw from
    ``keyed_race``, the others from ``generator`` as without keys (greedy ignores both)."""
    if mode.greedy:
        full = torch.log_softmax(logits, dim=-1)  # [B, V]
        tok = logits.argmax(-1)
        ent = -(full.exp() * full).sum(-1) if mode.entropies else None
        return tok, full.gather(-1, tok[:, None]).squeeze(-1), ent
    scaled = logits / mode.temperature
    full = torch.log_softmax(scaled, dim=-1)
    ent = -(full.exp() * full).sum(-1) if mode.entropies else None
    logp = full
    if mode.top_k > 0 and mode.top_k < scaled.shape[-1]:
        kth = scaled.topk(mode.top_k, dim=-1).values[:, -1:]  # [B, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        logp = torch.log_softmax(scaled, dim=-1)
    if mode.top_p < 1.0:
        probs = logp.exp()
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop_sorted = sorted_p.cumsum(-1) - sorted_p >= mode.top_p  # [B, V]; the top token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)
    race = torch.empty_like(logp).exponential_(generator=generator)
    if keys is not None:  # (the generator still draws for every row: unkeyed rows get what they got before)
        assert positions is not None
        race = torch.where((keys != 0)[:, None], keyed_race(keys, positions, race.shape[-1]), race)
    tok = (logp - race.log()).argmax(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1), ent
