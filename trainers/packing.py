"""The packed update path: every row's real tokens in one sequence, logprobs through a chunked LM head.

``packed_forward`` is a drop-in for ``batch.forward`` (same outputs, same alignment) that
1. packs the rows of a padded ``TrainBatch`` into one ``[1, N]`` sequence whose position ids restart at
   each row (transformers then masks attention block-diagonally: no row sees another, no padding is run);
2. runs the decoder once and scores only the tokens the loss reads (``loss_mask``), in chunks of
   ``chunk`` tokens, each chunk recomputed in the backward pass (activation checkpointing), so the float32
   logits of a 152k vocabulary never exist for more than ``chunk`` tokens at a time;
3. scatters the token logprobs (and entropies) back to ``[B, T]``, zero elsewhere.

What is not covered: value heads (PPO reads hidden states of every position; use ``batch.forward``), and
DDP (the decoder and head are called directly, which bypasses DistributedDataParallel's forward: use it
with a single process).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from toolgym.trainers.batch import TrainBatch


def pack(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [1, N], positions [1, N], row [N], col [N]) of every real token, rows one after another."""
    lens = batch.attention_mask.sum(1)  # [B]
    dev = batch.input_ids.device
    row = torch.repeat_interleave(torch.arange(len(lens), device=dev), lens)  # [N]
    starts = torch.cumsum(lens, 0) - lens  # [B]
    col = torch.arange(int(lens.sum()), device=dev) - starts[row]  # [N]
    return batch.input_ids[row, col][None], col[None], row, col


def _score(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, tgt: torch.Tensor, temp: float
) -> torch.Tensor:
    logits = F.linear(h, w, b).float() / temp  # [c, V]
    return logits.gather(-1, tgt[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)  # [c]


def _entropy(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temp: float) -> torch.Tensor:
    logits = F.linear(h, w, b).float() / temp
    lse = torch.logsumexp(logits, -1)
    return lse - (torch.softmax(logits, -1) * logits).sum(-1)


def packed_forward(
    model: Any,
    batch: TrainBatch,
    temperature: float = 1.0,
    entropy: bool = False,
    value_head: torch.nn.Module | None = None,
    entropy_grad: bool = False,
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """(logprobs [B, T], entropy [B, T] or None, None) like ``batch.forward``, on the loss-mask tokens."""
    if value_head is not None:
        raise ValueError("packed_forward has no value head: use toolgym.trainers.batch.forward")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    ids, pos, row, col = pack(batch)
    hidden = decoder(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state[0]  # [N, H]
    scored = (col >= 1) & (batch.loss_mask[row, col] > 0)  # [N] tokens the loss reads
    k = scored.nonzero().squeeze(-1)  # [M]
    src, tgt = hidden[k - 1], ids[0, k]  # [M, H], [M]: token k is scored by the hidden state before it
    temp = temperature if temperature > 0 else 1.0
    w, b = head.weight, getattr(head, "bias", None)
    parts = []
    for i in range(0, len(k), chunk):
        parts.append(
            checkpoint(_score, src[i : i + chunk], w, b, tgt[i : i + chunk], temp, use_reentrant=False)
        )
    B, T = batch.input_ids.shape
    logp = torch.zeros((B, T), device=hidden.device, dtype=torch.float32)
    if parts:
        logp = logp.index_put((row[k], col[k]), torch.cat(parts))
    ent = None
    if entropy:
        ent = torch.zeros((B, T), device=hidden.device, dtype=torch.float32)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            eparts = [
                checkpoint(_entropy, src[i : i + chunk], w, b, temp, use_reentrant=False)
                if entropy_grad
                else _entropy(src[i : i + chunk], w, b, temp)
                for i in range(0, len(k), chunk)
            ]
            if eparts:
                ent = ent.index_put((row[k], col[k]), torch.cat(eparts))
    return logp, ent, None
