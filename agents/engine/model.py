"""The forward passes: a packed prefill of new tokens into their slots, and one decode step.

Both read ``PackedWeights`` and write the slotted ``KVCache``. The prefill runs every new token of several
sequences as one packed batch (no padding through the GEMMs); its attention pads queries per sequence and
reads each sequence's slot up to its new end, causally. The decode step takes one token per row and has
two implementations of the same math: plain torch (CPU, and CUDA without Triton) and Triton kernels
(``kernels.py``), which the engine captures in CUDA graphs.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from toolgym.agents.engine.kv_slots import KVCache
from toolgym.agents.engine.weights import PackedWeights


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalised in float32, cast back, times the weight."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (HF's rotate-half layout). x [N, h, D]; cos/sin [N, D/2] float32."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, w, b)


def _bias(buf: torch.Tensor | None, layer: int) -> torch.Tensor | None:
    return None if buf is None else buf[layer]


@torch.no_grad()
def prefill(
    w: PackedWeights, cache: KVCache, seqs: list[tuple[int, int, list[int]]], want_logits: bool = True
) -> torch.Tensor | None:
    """Run new tokens into their slots. ``seqs``: (slot, start, ids) with the ids written at start…; returns
    the logits after each sequence's last token ([B, V], float32) when ``want_logits``."""
    s = w.shape
    dev = w.device
    B = len(seqs)
    lens = [len(ids) for _, _, ids in seqs]
    nmax = max(lens)
    # every index built on the host and moved in one copy: no device-sized repeat_interleave (a host sync)
    # and no arange per sequence (a launch each)
    flat = [
        [t for _, _, ids in seqs for t in ids],
        [b for b, n in enumerate(lens) for _ in range(n)],
        [i for n in lens for i in range(n)],
        [st + i for (_, st, _), n in zip(seqs, lens, strict=True) for i in range(n)],
    ]
    tokens, row, offs, pos = torch.tensor(flat).to(dev, non_blocking=True)  # [N] each
    starts, slots, last = torch.tensor(
        [[st for _, st, _ in seqs], [sl for sl, _, _ in seqs], list(itertools.accumulate(lens))]
    ).to(dev, non_blocking=True)  # [B] each
    tmax = max(st + n for (_, st, _), n in zip(seqs, lens, strict=True))
    cos, sin = cache.cos[pos], cache.sin[pos]  # [N, D/2]
    # rows with nothing cached run causal attention over their new tokens (right padding is harmless:
    # real queries never see it); otherwise key t may be read by query i of row b when t <= start_b + i
    # (padded queries read junk, dropped)
    fresh = all(st == 0 for _, st, _ in seqs)
    mask = None
    if not fresh:
        q_abs = starts[:, None] + torch.arange(nmax, device=dev)[None, :]  # [B, nmax]
        mask = torch.arange(tmax, device=dev)[None, None, :] <= q_abs[:, :, None]  # [B, nmax, tmax]
    H, Hkv, D = s.heads, s.kv_heads, s.head_dim
    x = w.embed[tokens]  # [N, hidden]
    # the pass is launch-bound on a GPU (~50 kernels a layer for ~1k tokens): what every layer shares is
    # computed once, and q and k take their rotary embedding in one go
    token_slot = slots[row]  # [N]
    for layer in range(s.layers):
        h = rms_norm(x, w.ln1[layer], s.eps)
        qkv = _linear(h, w.wqkv[layer], _bias(w.bqkv, layer))  # [N, qkv_dim]
        qk = rope(qkv[:, : (H + Hkv) * D].view(-1, H + Hkv, D), cos, sin)
        q, k = qk[:, :H], qk[:, H:]
        v = qkv[:, (H + Hkv) * D :].view(-1, Hkv, D)
        kc, vc = cache.k[layer], cache.v[layer]  # [S, Hkv, T, D]
        kc[token_slot, :, pos] = k
        vc[token_slot, :, pos] = v
        qp = q.new_zeros((B, nmax, H, D))
        qp[row, offs] = q
        if fresh:  # nothing cached before: plain causal attention over the new tokens (flash on CUDA)
            kp, vp = k.new_zeros((B, nmax, Hkv, D)), v.new_zeros((B, nmax, Hkv, D))
            kp[row, offs], vp[row, offs] = k, v
            keys = kp.transpose(1, 2).repeat_interleave(s.group, dim=1)  # [B, H, nmax, D]
            vals = vp.transpose(1, 2).repeat_interleave(s.group, dim=1)
            o = F.scaled_dot_product_attention(qp.transpose(1, 2), keys, vals, is_causal=True)
        else:
            keys = kc[slots, :, :tmax].repeat_interleave(s.group, dim=1)  # [B, H, tmax, D]
            vals = vc[slots, :, :tmax].repeat_interleave(s.group, dim=1)
            assert mask is not None
            o = F.scaled_dot_product_attention(qp.transpose(1, 2), keys, vals, attn_mask=mask[:, None])
        o = o.transpose(1, 2)[row, offs].reshape(-1, H * D)  # [N, H*D]
        x = x + _linear(o, w.wo[layer], _bias(w.bo, layer))
        h = rms_norm(x, w.ln2[layer], s.eps)
        gu = _linear(h, w.wgu[layer], _bias(w.bgu, layer))  # [N, 2I]
        g, u = gu.chunk(2, dim=-1)
        x = x + _linear(F.silu(g) * u, w.wd[layer], _bias(w.bd, layer))
    if not want_logits:
        return None
    h = rms_norm(x[last - 1], w.norm, s.eps)
    return F.linear(h, w.lm_head).float()  # [B, V]


def decode_torch(
    w: PackedWeights, cache: KVCache, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor,
    span: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """One token per row (plain torch). tokens/slots/pos [B]; reads each slot's cache up to ``pos``
    (``span``: how much of the cache to gather, the full capacity when None, as CUDA graphs need)."""
    s = w.shape
    H, Hkv, D, G = s.heads, s.kv_heads, s.head_dim, s.group
    B = tokens.shape[0]
    tspan = span or cache.capacity
    cos, sin = cache.cos[pos], cache.sin[pos]
    mask = (torch.arange(tspan, device=tokens.device)[None, :] <= pos[:, None])[:, None, None, :]  # [B,1,1,T]
    x = w.embed[tokens]  # [B, hidden]
    for layer in range(s.layers):
        h = rms_norm(x, w.ln1[layer], s.eps)
        qkv = _linear(h, w.wqkv[layer], _bias(w.bqkv, layer))
        q = rope(qkv[:, : H * D].view(B, H, D), cos, sin)
        k = rope(qkv[:, H * D : (H + Hkv) * D].view(B, Hkv, D), cos, sin)
        v = qkv[:, (H + Hkv) * D :].view(B, Hkv, D)
        kc, vc = cache.k[layer], cache.v[layer]
        kc[slots, :, pos] = k
        vc[slots, :, pos] = v
        # the G query heads of a KV head attend as G queries of that head: each K/V head is read once
        qg = q.view(B, Hkv, G, D)
        o = F.scaled_dot_product_attention(qg, kc[slots, :, :tspan], vc[slots, :, :tspan], attn_mask=mask)
        x = x + _linear(o.reshape(B, H * D), w.wo[layer], _bias(w.bo, layer))
        h = rms_norm(x, w.ln2[layer], s.eps)
        g, u = _linear(h, w.wgu[layer], _bias(w.bgu, layer)).chunk(2, dim=-1)
        x = x + _linear(F.silu(g) * u, w.wd[layer], _bias(w.bd, layer))
    return F.linear(rms_norm(x, w.norm, s.eps), w.lm_head).float()  # [B, V]


def decode_triton(
    w: PackedWeights,
    cache: KVCache,
    tokens: torch.Tensor,
    slots: torch.Tensor,
    pos: torch.Tensor,
    nsplit: int,
) -> torch.Tensor:
    """The same step as ``decode_torch`` with the Triton kernels: 9 launches a layer."""
    from toolgym.agents.engine import kernels as K

    s = w.shape
    x = w.embed[tokens]  # [B, hidden]
    h = K.add_rms_norm(x, None, w.ln1[0], s.eps)
    delta: Any = None
    for layer in range(s.layers):
        if layer > 0:
            h = K.add_rms_norm(x, delta, w.ln1[layer], s.eps)
        qkv = _linear(h, w.wqkv[layer], _bias(w.bqkv, layer))
        q = K.rope_kv_write(
            qkv,
            cache.cos,
            cache.sin,
            pos,
            slots,
            cache.k[layer],
            cache.v[layer],
            s.heads,
            s.kv_heads,
            s.head_dim,
        )
        o = K.decode_attention(q, cache.k[layer], cache.v[layer], slots, pos, nsplit, cache.capacity)
        attn = _linear(o.view(o.shape[0], -1), w.wo[layer], _bias(w.bo, layer))
        h = K.add_rms_norm(x, attn, w.ln2[layer], s.eps)
        gu = _linear(h, w.wgu[layer], _bias(w.bgu, layer))
        delta = _linear(K.silu_mul(gu), w.wd[layer], _bias(w.bd, layer))
    h = K.add_rms_norm(x, delta, w.norm, s.eps)
    return F.linear(h, w.lm_head).float()  # [B, V]
