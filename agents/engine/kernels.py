"""Triton kernels of the decode step (CUDA only; ``model.py`` has the plain-torch versions used on CPU).

- ``add_rms_norm``: residual add and RMSNorm in one pass over a row.
- ``rope_kv_write``: rotary embedding of q and k from the fused qkv row, k and v written into the slotted
  cache at each row's position, rotated q written out.
- ``decode_attention``: one query token per row against its slot's cache, read up to the row's length only;
  one program per (row, KV head, split) holds the whole GQA group of query heads, so every K/V element is
  read once per step. With few rows the cache is split along time (flash-decoding) and a second kernel
  merges the partial softmaxes. Two versions (``TOOLGYM_DECODE_ATTN=v1|v2``, default v1): v1 splits the
  capacity into ``nsplit`` equal parts and only when rows are few; v2 splits into fixed chunks of tokens at
  every batch size (a large batch is many short programs: a small last partial wave), skips chunks past a
  row's length, uses int32 tile offsets, masks only the last tile and uses exp2 (``AttnConfig``). On an H100
  v1 was faster at every shape (benchmarks/results/decode_attn.md: 0.82 of the bandwidth at B=256 vs 0.77),
  so v2 stays opt-in.
- ``silu_mul``: the gated MLP's ``silu(gate) * up``.
- ``prefill_attention``: the varlen prefill's attention: the packed new tokens of several sequences, each
  against its own slot up to its position (causal; what was cached before the pass included), one program per
  (query head, block of a sequence's new tokens), flash-attention style (online softmax over key tiles, only
  the tiles at the diagonal masked). K/V are read from the cache the pass just wrote: no packed K/V copies.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_kernel(X, Dlt, W, Y, n, eps, HAS_D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # (a prefill's rows x width can pass 2^31)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(X + row * n + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_D:
        x = x + tl.load(Dlt + row * n + cols, mask=m, other=0.0).to(tl.float32)
        x = x.to(X.dtype.element_ty)
        tl.store(X + row * n + cols, x, mask=m)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / n
    y = (x * tl.rsqrt(var + eps)).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * n + cols, (y * w).to(Y.dtype.element_ty), mask=m)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x += delta`` in place (when given), then RMSNorm(x)·w.  x, delta: [B, n]."""
    y = torch.empty_like(x)
    n = x.shape[-1]
    _add_rms_kernel[(x.shape[0],)](
        x, delta if delta is not None else x, w, y, n, eps, HAS_D=delta is not None,
        BLOCK=triton.next_power_of_2(n), num_warps=4,
    )  # fmt: skip
    return y


@triton.jit
def _rope_kv_kernel(
    QKV, COS, SIN, POS, SLOT, KC, VC, QO,
    s_kslot, s_khead, s_kt,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, HP: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # (a prefill's rows x width can pass 2^31)
    pos = tl.load(POS + row)
    slot = tl.load(SLOT + row)
    d = tl.arange(0, HALF)
    hh = tl.arange(0, HP)
    cos = tl.load(COS + pos * HALF + d)[None, :]
    sin = tl.load(SIN + pos * HALF + d)[None, :]
    base = QKV + row * (H + 2 * HKV) * D
    # q heads
    qm = hh[:, None] < H
    q1 = tl.load(base + hh[:, None] * D + d[None, :], mask=qm, other=0.0).to(tl.float32)
    q2 = tl.load(base + hh[:, None] * D + HALF + d[None, :], mask=qm, other=0.0).to(tl.float32)
    qo = QO + row * H * D + hh[:, None] * D + d[None, :]
    tl.store(qo, (q1 * cos - q2 * sin).to(QO.dtype.element_ty), mask=qm)
    tl.store(qo + HALF, (q2 * cos + q1 * sin).to(QO.dtype.element_ty), mask=qm)
    # k heads (rotated) and v heads into the cache
    km = hh[:, None] < HKV
    kb = base + H * D
    k1 = tl.load(kb + hh[:, None] * D + d[None, :], mask=km, other=0.0).to(tl.float32)
    k2 = tl.load(kb + hh[:, None] * D + HALF + d[None, :], mask=km, other=0.0).to(tl.float32)
    dst = slot.to(tl.int64) * s_kslot + hh[:, None] * s_khead + pos.to(tl.int64) * s_kt + d[None, :]
    tl.store(KC + dst, (k1 * cos - k2 * sin).to(KC.dtype.element_ty), mask=km)
    tl.store(KC + dst + HALF, (k2 * cos + k1 * sin).to(KC.dtype.element_ty), mask=km)
    vb = base + (H + HKV) * D
    v1 = tl.load(vb + hh[:, None] * D + d[None, :], mask=km, other=0.0)
    v2 = tl.load(vb + hh[:, None] * D + HALF + d[None, :], mask=km, other=0.0)
    tl.store(VC + dst, v1.to(VC.dtype.element_ty), mask=km)
    tl.store(VC + dst + HALF, v2.to(VC.dtype.element_ty), mask=km)


def rope_kv_write(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
) -> torch.Tensor:  # fmt: skip
    """Rotated q [B, H, D]; rotated k and v written to ``k_cache/v_cache[slot, :, pos]`` ([S, Hkv, T, D])."""
    B = qkv.shape[0]
    q = torch.empty((B, heads, head_dim), device=qkv.device, dtype=qkv.dtype)
    _rope_kv_kernel[(B,)](
        qkv, cos, sin, pos, slots, k_cache, v_cache, q,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        H=heads, HKV=kv_heads, D=head_dim, HALF=head_dim // 2, HP=triton.next_power_of_2(max(heads, kv_heads)),
        num_warps=2,
    )  # fmt: skip
    return q


@triton.jit
def _decode_attn_kernel(
    Q, KC, VC, SLOT, POS, OUT, ML, sm_scale, chunk,
    s_kslot, s_khead, s_kt,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
    NSPLIT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    slot = tl.load(SLOT + row).to(tl.int64)
    length = tl.load(POS + row) + 1
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    gm = g[:, None] < G
    q = tl.load(Q + row * H * D + (kvh * G + g)[:, None] * D + d[None, :], mask=gm, other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)
    kbase = KC + slot * s_kslot + kvh * s_khead
    vbase = VC + slot * s_kslot + kvh * s_khead
    for start in range(lo, hi, BT):
        t = start + tl.arange(0, BT)
        tm = t < hi
        k = tl.load(kbase + t[:, None].to(tl.int64) * s_kt + d[None, :], mask=tm[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale  # [GP, BT]
        s = tl.where(tm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vbase + t[:, None].to(tl.int64) * s_kt + d[None, :], mask=tm[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if NSPLIT == 1:
        out = acc / l_i[:, None]
        tl.store(
            OUT + row * H * D + (kvh * G + g)[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=gm
        )
    else:
        # partial results: acc [B, H, NSPLIT, D] (float32), (m, l) [B, H, NSPLIT, 2]
        head = kvh * G + g
        obase = (row * H + head)[:, None] * NSPLIT * D + split * D + d[None, :]
        tl.store(OUT + obase, acc, mask=gm)
        mbase = (row * H + head) * NSPLIT * 2 + split * 2
        tl.store(ML + mbase, m_i, mask=g < G)
        tl.store(ML + mbase + 1, l_i, mask=g < G)


@triton.jit
def _merge_kernel(P, ML, OUT, H: tl.constexpr, D: tl.constexpr, NSPLIT: tl.constexpr):
    rh = tl.program_id(0)  # row * H + head
    s = tl.arange(0, NSPLIT)
    d = tl.arange(0, D)
    m = tl.load(ML + rh * NSPLIT * 2 + s * 2)
    lse = tl.load(ML + rh * NSPLIT * 2 + s * 2 + 1)
    mx = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp(m - mx), 0.0)
    acc = tl.load(P + rh * NSPLIT * D + s[:, None] * D + d[None, :])
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lse * w, 0)
    tl.store(OUT + rh * D + d, out.to(OUT.dtype.element_ty))


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor,
    nsplit: int, capacity: int, version: str | None = None, config: AttnConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """q [B, H, D] against ``cache[slot, :, :pos+1]`` ([S, Hkv, T, D]); returns [B, H, D].

    ``version``: "v1" or "v2" (default: ``TOOLGYM_DECODE_ATTN``, else v1). ``nsplit`` is v1's time split;
    v2 takes ``config``, else ``TOOLGYM_DECODE_ATTN_CFG`` (``AttnConfig.parse``), else ``default_config``.
    Read at each call: under CUDA graphs the choice is fixed when a batch bucket's graph is captured."""
    version = version or os.environ.get("TOOLGYM_DECODE_ATTN", "v1")
    if version == "v2":
        return decode_attention_v2(q, k_cache, v_cache, slots, pos, capacity, config)
    if version != "v1":
        raise ValueError(f"TOOLGYM_DECODE_ATTN must be v1 or v2, not {version!r}")
    B, H, D = q.shape
    hkv = k_cache.shape[1]
    G = H // hkv
    BT = 64
    chunk = triton.cdiv(triton.cdiv(capacity, nsplit), BT) * BT
    out = torch.empty_like(q)
    grid = (B, hkv, nsplit)
    common = dict(H=H, G=G, GP=max(16, triton.next_power_of_2(G)), D=D, BT=BT, NSPLIT=nsplit, num_warps=4)
    strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    if nsplit == 1:
        _decode_attn_kernel[grid](
            q, k_cache, v_cache, slots, pos, out, out, D**-0.5, chunk, *strides, **common
        )
        return out
    part = torch.empty((B, H, nsplit, D), device=q.device, dtype=torch.float32)
    ml = torch.empty((B, H, nsplit, 2), device=q.device, dtype=torch.float32)
    _decode_attn_kernel[grid](q, k_cache, v_cache, slots, pos, part, ml, D**-0.5, chunk, *strides, **common)
    _merge_kernel[(B * H,)](part, ml, out, H=H, D=D, NSPLIT=nsplit, num_warps=1)
    return out


@dataclass(frozen=True)
class AttnConfig:
    """A v2 launch: ``bt`` tokens a tile, ``chunk`` tokens a program (0: a whole row, no merge kernel),
    ``warps`` and ``stages`` (loads in flight: Triton pipelines the K/V tiles through shared memory)."""

    bt: int = 64
    chunk: int = 256
    warps: int = 4
    stages: int = 3

    @staticmethod
    def parse(text: str) -> AttnConfig:
        """``"bt=64,chunk=256,warps=4,stages=3"`` (missing keys keep their defaults)."""
        kv = dict(item.split("=") for item in text.replace(" ", "").split(",") if item)
        return AttnConfig(**{k: int(v) for k, v in kv.items()})


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_config(rows: int, kv_heads: int, group: int, capacity: int, sms: int) -> AttnConfig:
    """Chunks short enough for ~24 programs an SM (several waves of ~6 resident programs, so the last
    partial wave is a small share of the step); no split when one chunk covers the capacity. Each chunk
    writes ``group`` fp32 partial rows that the merge reads back: 2·group/chunk of the K/V traffic, so
    once the rows alone fill the SMs chunks stay >= 64·group tokens (<= ~3% extra); 128 below that."""
    floor = 128 if rows * kv_heads < sms else max(128, triton.next_power_of_2(64 * group))
    chunk = 1024
    while chunk > floor and rows * kv_heads * math.ceil(capacity / chunk) < 24 * sms:
        chunk //= 2
    return AttnConfig(bt=64, chunk=0 if chunk >= capacity else chunk, warps=4, stages=3)


@triton.jit
def _attn_tile(
    q, kp, vp, start, hi, m_i, l_i, acc, qk_scale,
    D: tl.constexpr, BT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # one BT-token tile of the online softmax (base 2: qk_scale includes log2(e)); offsets are int32 within
    # the (slot, head) run, whose base pointer is 64-bit
    t = start + tl.arange(0, BT)
    d = tl.arange(0, D)
    if MASKED:
        tm = t < hi
        kt = tl.load(kp + t[None, :] * D + d[:, None], mask=tm[None, :], other=0.0)  # [D, BT]
        s = tl.dot(q, kt) * qk_scale
        s = tl.where(tm[None, :], s, float("-inf"))
        v = tl.load(vp + t[:, None] * D + d[None, :], mask=tm[:, None], other=0.0)
    else:
        kt = tl.load(kp + t[None, :] * D + d[:, None])
        s = tl.dot(q, kt) * qk_scale
        v = tl.load(vp + t[:, None] * D + d[None, :])
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _decode_attn_v2_kernel(
    Q, KC, VC, SLOT, POS, OUT, ML, qk_scale, s_kslot, s_khead,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
    CHUNK: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    nsplit = tl.num_programs(2)
    length = tl.load(POS + row).to(tl.int32) + 1
    lo = split * CHUNK
    if lo < length:  # chunks past the row's length do nothing (the merge reads only the valid ones)
        slot = tl.load(SLOT + row).to(tl.int64)
        hi = tl.minimum(lo + CHUNK, length)
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        gm = g[:, None] < G
        head = kvh * G + g
        q = tl.load(Q + row * H * D + head[:, None] * D + d[None, :], mask=gm, other=0.0)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        kp = KC + slot * s_kslot + kvh * s_khead
        vp = VC + slot * s_kslot + kvh * s_khead
        full = lo + ((hi - lo) // BT) * BT
        for start in range(lo, full, BT):
            m_i, l_i, acc = _attn_tile(q, kp, vp, start, hi, m_i, l_i, acc, qk_scale, D, BT, False)
        if full < hi:
            m_i, l_i, acc = _attn_tile(q, kp, vp, full, hi, m_i, l_i, acc, qk_scale, D, BT, True)
        if SPLIT:
            # partials: acc [B, H, nsplit, D] float32, (m, l) [B, H, nsplit, 2]
            rh = row * H + head
            tl.store(OUT + (rh[:, None] * nsplit + split) * D + d[None, :], acc, mask=gm)
            tl.store(ML + (rh * nsplit + split) * 2, m_i, mask=g < G)
            tl.store(ML + (rh * nsplit + split) * 2 + 1, l_i, mask=g < G)
        else:
            out = acc / l_i[:, None]
            tl.store(
                OUT + row * H * D + head[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=gm
            )


@triton.jit
def _merge_v2_kernel(
    P, ML, POS, OUT, nsplit, H: tl.constexpr, D: tl.constexpr, NSP: tl.constexpr, CHUNK: tl.constexpr
):
    rh = tl.program_id(0)  # row * H + head
    length = tl.load(POS + rh // H).to(tl.int32) + 1
    s = tl.arange(0, NSP)
    d = tl.arange(0, D)
    valid = s < (length + CHUNK - 1) // CHUNK  # chunks at or past the length were never written
    m = tl.load(ML + (rh * nsplit + s) * 2, mask=valid, other=float("-inf"))
    lsum = tl.load(ML + (rh * nsplit + s) * 2 + 1, mask=valid, other=0.0)
    w = tl.where(valid, tl.math.exp2(m - tl.max(m, 0)), 0.0)
    acc = tl.load(P + (rh * nsplit + s[:, None]) * D + d[None, :], mask=valid[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    tl.store(OUT + rh * D + d, out.to(OUT.dtype.element_ty))


def decode_attention_v2(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor,
    capacity: int, config: AttnConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """v2 of ``decode_attention`` (same contract); the cache's last two dims must be contiguous."""
    B, H, D = q.shape
    hkv = k_cache.shape[1]
    G = H // hkv
    assert k_cache.stride(3) == 1 and k_cache.stride(2) == D and v_cache.stride() == k_cache.stride()
    if config is None:
        env = os.environ.get("TOOLGYM_DECODE_ATTN_CFG")
        sms = _sm_count(q.device.index or 0) if q.is_cuda else 132
        config = AttnConfig.parse(env) if env else default_config(B, hkv, G, capacity, sms)
    bt, chunk = config.bt, config.chunk
    split = 0 < chunk < capacity
    if not split:  # one program a row: a fixed constant, so a new capacity compiles nothing new
        chunk = 1 << 30
    assert chunk % bt == 0, "a chunk is whole tiles"
    nsplit = triton.cdiv(capacity, chunk)
    out = torch.empty_like(q)
    qk_scale = D**-0.5 * 1.4426950408889634  # log2(e): the kernel's softmax is base 2
    common = dict(
        H=H, G=G, GP=max(16, triton.next_power_of_2(G)), D=D, BT=bt, CHUNK=chunk, SPLIT=split,
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    strides = (k_cache.stride(0), k_cache.stride(1))
    grid = (B, hkv, nsplit)
    if not split:
        _decode_attn_v2_kernel[grid](q, k_cache, v_cache, slots, pos, out, out, qk_scale, *strides, **common)
        return out
    part = torch.empty((B, H, nsplit, D), device=q.device, dtype=torch.float32)
    ml = torch.empty((B, H, nsplit, 2), device=q.device, dtype=torch.float32)
    _decode_attn_v2_kernel[grid](q, k_cache, v_cache, slots, pos, part, ml, qk_scale, *strides, **common)
    _merge_v2_kernel[(B * H,)](
        part, ml, pos, out, nsplit, H=H, D=D, NSP=triton.next_power_of_2(nsplit), CHUNK=chunk, num_warps=1
    )
    return out


@triton.jit
def _silu_mul_kernel(GU, Y, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # (a prefill's rows x width can pass 2^31)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    gate = tl.load(GU + row * 2 * n + col, mask=m, other=0.0).to(tl.float32)
    up = tl.load(GU + row * 2 * n + n + col, mask=m, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * n + col, (act * up).to(Y.dtype.element_ty), mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """``silu(gu[:, :I]) * gu[:, I:]`` for gu [B, 2I]."""
    B, n2 = gu.shape
    n = n2 // 2
    y = torch.empty((B, n), device=gu.device, dtype=gu.dtype)
    BLOCK = 1024
    _silu_mul_kernel[(B, triton.cdiv(n, BLOCK))](gu, y, n, BLOCK=BLOCK, num_warps=4)
    return y


@triton.jit
def _prefill_attn_kernel(
    Q, KC, VC, OUT, BSEQ, BOFF, CU, START, SLOT, qk_scale,
    s_kslot, s_khead, s_kt,
    H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    # one flat grid (no 65,535 cap on a second axis); the query heads of a block are neighbours: they share
    # its K/V in L2
    head = tl.program_id(0) % H
    blk = tl.program_id(0) // H
    kvh = head // G
    b = tl.load(BSEQ + blk)
    off = tl.load(BOFF + blk).to(tl.int32)  # the block's first new token, within its sequence
    q0 = tl.load(CU + b)
    n = (tl.load(CU + b + 1) - q0).to(tl.int32)
    start = tl.load(START + b).to(tl.int32)  # positions cached before this pass (int32: < capacity)
    slot = tl.load(SLOT + b).to(tl.int64)
    i = tl.arange(0, BM)
    d = tl.arange(0, D)
    qm = (off + i) < n
    rows = (q0 + off + i).to(tl.int64)
    q = tl.load(Q + rows[:, None] * (H * D) + head * D + d[None, :], mask=qm[:, None], other=0.0)
    qpos = start + off + i  # absolute positions (rows past n: discarded, but still see key start + off)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    kp = KC + slot * s_kslot + kvh * s_khead
    vp = VC + slot * s_kslot + kvh * s_khead
    first = start + off
    full = (first // BN) * BN  # keys below the block's first position are seen by every query of it
    hi = tl.minimum(first + BM, start + n)  # one past the last key any (real) query of the block sees
    for s0 in range(0, full, BN):
        t = s0 + tl.arange(0, BN)
        kt = tl.load(kp + t[None, :].to(tl.int64) * s_kt + d[:, None])  # [D, BN] (64-bit: long slots)
        s = tl.dot(q, kt) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vp + t[:, None].to(tl.int64) * s_kt + d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    for s0 in range(full, hi, BN):  # the diagonal: key t is seen by the queries at t or later
        t = s0 + tl.arange(0, BN)
        tm = t < hi
        kt = tl.load(kp + t[None, :].to(tl.int64) * s_kt + d[:, None], mask=tm[None, :], other=0.0)
        s = tl.dot(q, kt) * qk_scale
        s = tl.where((t[None, :] <= qpos[:, None]) & tm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: key `full` <= first is seen by every row
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vp + t[:, None].to(tl.int64) * s_kt + d[None, :], mask=tm[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        OUT + rows[:, None] * (H * D) + head * D + d[None, :], out.to(OUT.dtype.element_ty), mask=qm[:, None]
    )


@dataclass(frozen=True)
class PrefillAttnConfig:
    """A ``prefill_attention`` launch: ``bm`` new tokens a program (the plan's block), ``bn`` keys a tile,
    ``warps``, ``stages`` (K/V tiles in flight). Powers of two, ``bm``/``bn`` >= 16."""

    bm: int = 64
    bn: int = 64
    warps: int = 4
    stages: int = 2

    @staticmethod
    def current() -> PrefillAttnConfig:
        """``TOOLGYM_PREFILL_ATTN`` (``"bm=128,bn=64,warps=8,stages=2"``; missing keys keep the defaults,
        read at each pass: for timing sweeps), else the defaults."""
        text = os.environ.get("TOOLGYM_PREFILL_ATTN", "")
        kv = dict(item.split("=") for item in text.replace(" ", "").split(",") if item)
        return PrefillAttnConfig(**{k: int(v) for k, v in kv.items()})


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu: torch.Tensor, starts: torch.Tensor,
    slots: torch.Tensor, blk_seq: torch.Tensor, blk_off: torch.Tensor, config: PrefillAttnConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """q [N, H, D]: the packed new tokens of B sequences (sequence b's at ``cu[b]:cu[b + 1]``, at positions
    ``starts[b]…``), each against ``cache[slots[b], :, :its position + 1]`` ([S, Hkv, T, D], already holding
    the new K/V); returns [N, H, D]. ``blk_seq``/``blk_off``: one entry per ``block`` new tokens of a
    sequence (``PrefillPlan``) of ``config.bm`` new tokens."""
    cfg = config or PrefillAttnConfig()
    _, H, D = q.shape
    hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    if blk_seq.numel() == 0:
        return out
    qk_scale = D**-0.5 * 1.4426950408889634  # log2(e): the kernel's softmax is base 2
    _prefill_attn_kernel[(H * blk_seq.shape[0],)](
        q, k_cache, v_cache, out, blk_seq, blk_off, cu, starts, slots, qk_scale,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        H=H, G=H // hkv, D=D, BM=cfg.bm, BN=cfg.bn, num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    return out
