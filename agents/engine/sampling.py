"""Sampling on the device: greedy, temperature, top-k, top-p; the logprob of the distribution sampled from.

``sample`` returns, per row, the token, its log-probability under the distribution it was actually drawn
from (tempered, then truncated by top-k/top-p and renormalised; under ``softmax(logits)`` when greedy), and
optionally the entropy of the tempered distribution before truncation (the model's uncertainty, which
branching policies read). Draws use the exponential race (``argmax log p - log E``, E ~ Exp(1)), which
needs no host sync and runs inside a CUDA graph.
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


def sample(
    logits: torch.Tensor, mode: SampleMode, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens [B], logprobs [B], entropies [B] or None) from float32 logits [B, V]."""
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
    tok = (logp - race.log()).argmax(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1), ent
