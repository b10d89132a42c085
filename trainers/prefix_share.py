"""Shared prefixes of a packed update: each token whose whole context already occurs in an earlier row is run once.

In a GRPO group every row starts with the same prompt (on the CPU demo ~60% of the update's tokens), and
branched rows (ARPO, TreeRL) also share earlier turns. A token's hidden states depend only on the tokens up
to it, so the token at column ``t`` of row ``r`` is the same computation as column ``t`` of any row whose
first ``t + 1`` ids are equal. ``share_layout`` finds, from the ids alone, the *owner* of every token (the
first row holding that prefix), and the packed update (``packing.packed_forward``) runs the decoder's
projections, MLPs and norms on owned tokens only. Attention then lays each row out as ``[B, H, L, D]`` as
before, gathering keys/values/queries of shared columns from their owner (a row sees the shared prefix
followed by its own tokens, positions continuing after the prefix: tree attention, with SDPA's causal
kernel and no mask); the output of a token is read back from its owner's row. Gradients of shared
keys/values collect from every row through the gather's backward (index_add). Logprobs, entropies, losses
and gradients equal the unshared packed path's (tests/trainers/test_prefix_share.py).

What is wasted: the queries of a shared column are still attended in every row that holds it (their
outputs outside the owner row are dropped); attention is a small part of a short-row update (projections
and MLPs scale with tokens, attention with tokens x row length). Sharing needs at least ``min_share``
equal leading ids between two rows (the chat template's first tokens alone do not switch the layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARE = 16  # equal leading ids two rows need before they share (a few template tokens save nothing)


@dataclass(frozen=True)
class ShareLayout:
    """Owned tokens of a ``[B, T]`` batch and where every ``(row, col)`` reads its token from."""

    keep: torch.Tensor  # [N'] long: flat index r * T + t of each owned token, row-major (the packed order)
    index: torch.Tensor  # [B * T] long: packed index of the token at (r, t); N' (a zero slot) on padding


def lcp(ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Longest common prefix of every pair of rows, in real tokens: ids, real [B, T] -> [B, B] long.

    >>> ids = torch.tensor([[5, 6, 7], [5, 6, 8], [4, 6, 7]])
    >>> lcp(ids, torch.ones_like(ids, dtype=torch.bool)).tolist()
    [[3, 2, 0], [2, 3, 0], [0, 0, 3]]
    """
    same = (ids[:, None] == ids[None]) & real[:, None] & real[None]  # [B, B, T]
    return same.to(torch.uint8).cumprod(-1).sum(-1)  # [B, B]


def share_layout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, min_share: int = MIN_SHARE
) -> ShareLayout | None:
    """The owner layout of right-padded rows, or None when no two rows share ``min_share`` leading ids.

    Token (r, t) is owned by the first row r' <= r whose first t + 1 ids equal row r's, among rows sharing at
    least ``min_share`` ids with r (r itself otherwise). Sharing is transitive (lcp(a, c) >= min(lcp(a, b),
    lcp(b, c))), so an owner owns its own token and every shared column reads a computed one.
    """
    B, T = input_ids.shape
    real = attention_mask > 0  # [B, T]
    common = lcp(input_ids, real)  # [B, B]
    earlier = torch.ones((B, B), dtype=torch.bool, device=input_ids.device).tril(-1)  # [r, r']: r' < r
    pairs = earlier & (common >= max(min_share, 1))  # [B, B]
    if not bool(pairs.any()):  # one host sync; nothing to share: the caller keeps the plain packed path
        return None
    cols = torch.arange(T, device=input_ids.device)  # [T]
    eye = torch.eye(B, dtype=torch.bool, device=input_ids.device)  # [B, B]
    cand = (pairs[:, :, None] & (common[:, :, None] > cols)) | eye[:, :, None]  # [B, B', T]
    owner = cand.to(torch.uint8).argmax(1)  # [B, T]: the first candidate (argmax returns the first maximum)
    rows = torch.arange(B, device=input_ids.device)[:, None]  # [B, 1]
    own = (owner == rows) & real  # [B, T]
    keep = own.reshape(-1).nonzero().squeeze(-1)  # [N'] (the pass's token-count sync)
    n = keep.numel()
    slot = torch.full((B * T,), n, dtype=torch.long, device=input_ids.device)  # [B * T]
    slot[keep] = torch.arange(n, device=input_ids.device)
    index = slot[(owner * T + cols).reshape(-1)]  # [B * T]: the owner's packed index
    index = torch.where(real.reshape(-1), index, n)  # padding reads the zero slot
    return ShareLayout(keep, index)
