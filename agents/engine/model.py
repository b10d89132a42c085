"""The forward passes: a packed prefill of new tokens into their slots, and one decode step.

Both read ``PackedWeights`` and write the slotted ``KVCache``. The prefill runs every new token of several
sequences as one packed batch (no padding through the GEMMs). Two prefills (``TOOLGYM_PREFILL`` or the
engine's ``prefill`` option, default ``varlen``):

- ``varlen``: the new tokens' K/V go into their slots first (one scatter a layer), then each new token
  attends to its own slot up to its position, packed: no padded query or key tensor, no mask tensor, GQA
  without copying K/V per query head. On CUDA with Triton: the decode step's fused kernels (norms, rotary
  embedding + cache write, SiLU) and a varlen flash-attention kernel over the slots (``kernels.py``),
  ~9 launches a layer; elsewhere plain torch (one SDPA call per sequence, ``enable_gqa``).
- ``padded``: the earlier pass, kept for A/B runs: queries padded to ``[B, longest]``, K/V repeated per
  query head, a ``[B, longest, T]`` mask when anything was cached.

Every index of a pass (``PrefillPlan``) is built on the host with vectorised torch ops and moved in one copy.
The decode step takes one token per row and has two implementations of the same math: plain torch (CPU,
and CUDA without Triton) and Triton kernels (``kernels.py``), which the engine captures in CUDA graphs.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from toolgym.agents.engine.kv_slots import KVCache
from toolgym.agents.engine.weights import PackedWeights
from toolgym.errors import ConfigError

PREFILL_MODES = ("varlen", "padded")


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


def prefill_mode(mode: str | None = None) -> str:
    """``mode``, else ``TOOLGYM_PREFILL``, else ``varlen``; a ``ConfigError`` for anything else."""
    mode = mode or os.environ.get("TOOLGYM_PREFILL") or "varlen"
    if mode not in PREFILL_MODES:
        raise ConfigError(f"the prefill must be one of {', '.join(PREFILL_MODES)}, not {mode!r}")
    return mode


@torch.no_grad()
def prefill(
    w: PackedWeights, cache: KVCache, seqs: list[tuple[int, int, list[int]]], want_logits: bool = True,
    *, mode: str | None = None, kernels: bool = False,
) -> torch.Tensor | None:  # fmt: skip
    """Run new tokens into their slots. ``seqs``: (slot, start, ids) with the ids written at start…; returns
    the logits after each sequence's last token ([B, V], float32) when ``want_logits``. ``mode``: see the
    module docstring; ``kernels``: the Triton varlen pass (CUDA)."""
    if prefill_mode(mode) == "padded":
        return prefill_padded(w, cache, seqs, want_logits)
    if not seqs:
        return w.embed.new_zeros((0, w.lm_head.shape[0]), dtype=torch.float32) if want_logits else None
    if kernels:
        from toolgym.agents.engine import kernels as K

        cfg = K.PrefillAttnConfig.current()
        return prefill_triton(w, cache, PrefillPlan.build(seqs, w.device, cfg.bm), want_logits, cfg)
    return prefill_varlen(w, cache, PrefillPlan.build(seqs, w.device), want_logits)


@dataclass
class PrefillPlan:
    """The indices of one varlen prefill pass, on the device. Per new token ([N]): ``tokens``, absolute
    position ``pos``, cache ``slot``; per sequence ([B]): ``cu`` (where its tokens start in the pack, [B + 1]),
    ``starts`` (positions cached before), ``slots``; the Triton attention's block table ([NB]): ``blk_seq``
    (the sequence) and ``blk_off`` (its first new token), heaviest blocks first. ``lens``/``starts_host``
    /``slots_host``: the same per-sequence numbers as host ints (the torch path loops over them)."""

    tokens: torch.Tensor
    pos: torch.Tensor
    slot: torch.Tensor
    cu: torch.Tensor
    starts: torch.Tensor
    slots: torch.Tensor
    blk_seq: torch.Tensor
    blk_off: torch.Tensor
    lens: list[int]
    starts_host: list[int]
    slots_host: list[int]
    block: int = 0

    @staticmethod
    def build(seqs: list[tuple[int, int, list[int]]], device: torch.device, block: int = 0) -> PrefillPlan:
        """The plan of ``seqs`` ((slot, start, ids) each); ``block`` > 0 also builds the block table of
        ``block`` query tokens a program. Host work is a few vectorised ops on [N] (no Python per token)."""
        lens_l = [len(ids) for _, _, ids in seqs]
        starts_l = [st for _, st, _ in seqs]
        slots_l = [sl for sl, _, _ in seqs]
        if min(lens_l, default=1) < 1:
            raise ConfigError("every prefilled sequence needs at least one new token")
        B = len(seqs)
        lens = torch.tensor(lens_l)
        starts = torch.tensor(starts_l)
        slots = torch.tensor(slots_l)
        cu = torch.zeros(B + 1, dtype=torch.long)
        torch.cumsum(lens, 0, out=cu[1:])
        N = int(cu[-1])
        tokens = torch.tensor(
            list(itertools.chain.from_iterable(ids for _, _, ids in seqs)), dtype=torch.long
        )
        row = torch.repeat_interleave(torch.arange(B), lens)  # [N] the sequence of each new token
        pos = starts[row] + torch.arange(N) - cu[:-1][row]
        if block > 0:
            nb = (lens + block - 1) // block
            blk_seq = torch.repeat_interleave(torch.arange(B), nb)
            cnb = torch.cumsum(nb, 0) - nb
            blk_off = (torch.arange(int(nb.sum())) - cnb[blk_seq]) * block
            # the longest key runs first: the last wave of programs is then short ones
            order = torch.argsort(starts[blk_seq] + blk_off, descending=True, stable=True)
            blk_seq, blk_off = blk_seq[order], blk_off[order]
        else:
            blk_seq = blk_off = torch.zeros(0, dtype=torch.long)
        parts = [tokens, pos, slots[row], cu, starts, slots, blk_seq, blk_off]
        # each part starts 16-byte aligned in the one buffer (an even number of int64 before it): Triton
        # compiles a kernel per alignment of its pointer arguments
        sizes = [p.numel() + p.numel() % 2 for p in parts]
        flat = torch.cat([F.pad(p, (0, z - p.numel())) for p, z in zip(parts, sizes, strict=True)])
        if device.type == "cuda":  # pinned: the copy is queued behind the running pass, the host goes on
            flat = flat.pin_memory()
        flat = flat.to(device, non_blocking=True)  # one host-to-device copy
        views = [v[: p.numel()] for v, p in zip(flat.split(sizes), parts, strict=True)]
        tok, pos_d, slot_d, cu_d, starts_d, slots_d, bseq, boff = views
        return PrefillPlan(
            tok, pos_d, slot_d, cu_d, starts_d, slots_d, bseq, boff, lens_l, starts_l, slots_l, block
        )


def _attend_varlen(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, plan: PrefillPlan) -> torch.Tensor:
    """q [N, H, D] (packed new tokens) against each sequence's slot up to each token's position, in plain
    torch: one SDPA call a sequence over its slot's prefix (the new K/V already written), GQA by SDPA."""
    out = torch.empty_like(q)
    a = 0
    for n, st, sl in zip(plan.lens, plan.starts_host, plan.slots_host, strict=True):
        qb = q[a : a + n].transpose(0, 1)[None]  # [1, H, n, D]
        kb, vb = kc[sl, :, : st + n][None], vc[sl, :, : st + n][None]  # [1, Hkv, st + n, D]
        if st == 0:
            o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
        else:  # query i sits at position st + i: it sees keys 0 … st + i
            mask = (
                torch.arange(st + n, device=q.device)[None, :]
                <= st + torch.arange(n, device=q.device)[:, None]
            )
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
        out[a : a + n] = o[0].transpose(0, 1)
        a += n
    return out


def _last_rows(plan: PrefillPlan) -> torch.Tensor:
    return plan.cu[1:] - 1  # [B] each sequence's last new token in the pack


def _qkv_into_cache(
    w: PackedWeights, cache: KVCache, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    slot: torch.Tensor, pos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """A prefill layer's attention inputs for N new tokens: q and k with their rotary embedding, v; k and v
    are written into the cache at (``slot``, ``pos``) first (one scatter each)."""
    s = w.shape
    H, Hkv, D = s.heads, s.kv_heads, s.head_dim
    h = rms_norm(x, w.ln1[layer], s.eps)
    qkv = _linear(h, w.wqkv[layer], _bias(w.bqkv, layer))  # [N, qkv_dim]
    qk = rope(qkv[:, : (H + Hkv) * D].view(-1, H + Hkv, D), cos, sin)
    q, k = qk[:, :H], qk[:, H:]
    v = qkv[:, (H + Hkv) * D :].view(-1, Hkv, D)
    cache.k[layer][slot, :, pos] = k  # [S, Hkv, T, D]
    cache.v[layer][slot, :, pos] = v
    return q, k, v


def _after_attention(w: PackedWeights, layer: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The rest of a layer once attention gave ``o`` [N, H*D]: output projection, residual, MLP, residual."""
    s = w.shape
    x = x + _linear(o, w.wo[layer], _bias(w.bo, layer))
    h = rms_norm(x, w.ln2[layer], s.eps)
    g, u = _linear(h, w.wgu[layer], _bias(w.bgu, layer)).chunk(2, dim=-1)
    return x + _linear(F.silu(g) * u, w.wd[layer], _bias(w.bd, layer))


def prefill_varlen(
    w: PackedWeights, cache: KVCache, plan: PrefillPlan, want_logits: bool = True
) -> torch.Tensor | None:
    """The varlen prefill in plain torch (CPU, CUDA without Triton)."""
    s = w.shape
    cos, sin = cache.cos[plan.pos], cache.sin[plan.pos]  # [N, D/2]
    x = w.embed[plan.tokens]  # [N, hidden]
    for layer in range(s.layers):
        q, _, _ = _qkv_into_cache(w, cache, layer, x, cos, sin, plan.slot, plan.pos)
        o = _attend_varlen(q, cache.k[layer], cache.v[layer], plan).reshape(-1, s.heads * s.head_dim)
        x = _after_attention(w, layer, x, o)
    if not want_logits:
        return None
    h = rms_norm(x[_last_rows(plan)], w.norm, s.eps)
    return F.linear(h, w.lm_head).float()  # [B, V]


def prefill_triton(
    w: PackedWeights, cache: KVCache, plan: PrefillPlan, want_logits: bool = True, config: Any = None
) -> torch.Tensor | None:
    """The varlen prefill with the Triton kernels (the decode step's, plus ``prefill_attention``): per layer
    4 GEMMs and 5 kernels over all new tokens of the pass. The plan needs its block table
    (``PrefillPlan.build(..., block > 0)``) of the attention's ``config`` (``kernels.PrefillAttnConfig``,
    default: its ``bm`` is the plan's block)."""
    from toolgym.agents.engine import kernels as K

    cfg = config or K.PrefillAttnConfig(bm=plan.block)
    assert plan.block == cfg.bm, "the plan's block table is of the attention's query blocks"
    s = w.shape
    x = w.embed[plan.tokens]  # [N, hidden] (a copy: the norms add into it in place)
    h = K.add_rms_norm(x, None, w.ln1[0], s.eps)
    delta: Any = None
    for layer in range(s.layers):
        if layer > 0:
            h = K.add_rms_norm(x, delta, w.ln1[layer], s.eps)
        qkv = _linear(h, w.wqkv[layer], _bias(w.bqkv, layer))
        kc, vc = cache.k[layer], cache.v[layer]
        q = K.rope_kv_write(
            qkv, cache.cos, cache.sin, plan.pos, plan.slot, kc, vc, s.heads, s.kv_heads, s.head_dim
        )
        o = K.prefill_attention(q, kc, vc, plan.cu, plan.starts, plan.slots, plan.blk_seq, plan.blk_off, cfg)
        attn = _linear(o.view(o.shape[0], -1), w.wo[layer], _bias(w.bo, layer))
        h = K.add_rms_norm(x, attn, w.ln2[layer], s.eps)
        gu = _linear(h, w.wgu[layer], _bias(w.bgu, layer))
        delta = _linear(K.silu_mul(gu), w.wd[layer], _bias(w.bd, layer))
    if not want_logits:
        return None
    last = _last_rows(plan)
    h = K.add_rms_norm(x[last], delta[last], w.norm, s.eps)  # (gathered copies: the add stays local)
    return F.linear(h, w.lm_head).float()  # [B, V]


@torch.no_grad()
def prefill_padded(
    w: PackedWeights, cache: KVCache, seqs: list[tuple[int, int, list[int]]], want_logits: bool = True
) -> torch.Tensor | None:
    """The earlier prefill (``TOOLGYM_PREFILL=padded``): padded attention, kept for A/B runs."""
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
        q, k, v = _qkv_into_cache(w, cache, layer, x, cos, sin, token_slot, pos)
        kc, vc = cache.k[layer], cache.v[layer]  # [S, Hkv, T, D]
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
        x = _after_attention(w, layer, x, o)
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
