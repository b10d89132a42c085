"""A model with one free logit vector per (row, position): the update loops (`grpo.optimize`) run on it
without a transformer, and every gradient is written out by hand. Row b of a batch carries its row id as its
first token; the token at t is scored by `theta[row, t]` (no shift: the table is not a language model) over
a vocabulary of `VOCAB` (ids are taken mod VOCAB). With theta = 0 every token has probability 1/VOCAB and
d logp_t / d theta[t, v] = 1[v = token] - 1/VOCAB."""

from __future__ import annotations

from typing import Any

import torch

from toolgym.trainers.batch import TrainBatch

VOCAB = 2


class Table(torch.nn.Module):
    def __init__(self, rows: int, length: int, scale: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.theta = torch.nn.Parameter(torch.randn((rows, length, VOCAB), generator=g) * scale)


def table_forward(
    model: Any, mb: TrainBatch, temperature: float = 1.0, entropy: bool = False,
    value_head: Any = None, entropy_grad: bool = False, host: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:  # fmt: skip
    """`batch.forward`'s signature: (logprobs [B, T], entropy [B, T] or None, None)."""
    T = mb.input_ids.shape[1]
    logits = model.theta[mb.input_ids[:, 0], :T] / (temperature if temperature > 0 else 1.0)  # [B, T, V]
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, (mb.input_ids % VOCAB)[..., None]).squeeze(-1)  # [B, T]
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent, None


def table_batch(
    tokens: list[list[int]], masks: list[list[float]], advantages: list[list[float]]
) -> TrainBatch:
    """Rows of the given tokens (the first is replaced by the row id), loss masks and advantages."""
    B, T = len(tokens), max(len(t) for t in tokens)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    adv = torch.zeros((B, T))
    for i, (t, m, a) in enumerate(zip(tokens, masks, advantages, strict=True)):
        ids[i, : len(t)] = torch.tensor([i, *t[1:]])
        attn[i, : len(t)] = 1
        mask[i, : len(t)] = torch.tensor(m)
        adv[i, : len(t)] = torch.tensor(a)
    turns = torch.where(mask > 0, 0, -1)
    return TrainBatch(ids, attn, mask, adv, torch.zeros((B, T)), turns, torch.zeros(B), torch.zeros(B))
