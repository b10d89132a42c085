"""Throughput and MFU of a full GRPO update: old and reference logprob passes + clipped-loss fwd/bwd +
AdamW, eager HF padded micro-batches vs our packed path (trainers/packing.py: packed rows, chunked
logprobs, optionally torch.compile), same rows, same run. Random weights in the model shapes; fp32
master weights under bf16 autocast, as the trainer runs.

    python benchmarks/update.py [--models smollm2-135m,qwen2.5-0.5b] [--rows 32] [--max-len 1024]
        [--out benchmarks/results/update]

Rows have lengths uniform in [max_len/4, max_len] (multi-turn rows vary), the second half of each row is
"model" tokens. MFU counts 10·N FLOPs a real token (6N fwd/bwd + 2N old + 2N reference) over 989 TFLOP/s
(dense bf16, H100/H200). Keys: gpu, mfu_0p5b (best variant), fits_0p5b_32k (32 rows × 1024 tokens of
the 0.5B shape in one update without running out of memory), per-variant tokens/s and peak memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generation import SHAPES, build

from toolgym.trainers.batch import TrainBatch, forward
from toolgym.trainers.packing import packed_forward

PEAK = 989e12


def rows(n: int, max_len: int, vocab: int, full: bool, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    lens = [max_len] * n if full else torch.randint(max_len // 4, max_len + 1, (n,), generator=g).tolist()
    T = max(lens)
    ids = torch.zeros((n, T), dtype=torch.long)
    attn = torch.zeros((n, T), dtype=torch.long)
    mask = torch.zeros((n, T))
    for i, L in enumerate(lens):
        ids[i, :L] = torch.randint(100, vocab - 100, (L,), generator=g)
        attn[i, :L] = 1
        mask[i, L // 2 : L] = 1.0
    adv = torch.randn((n, T), generator=g)
    z = torch.zeros((n, T))
    return TrainBatch(ids, attn, mask, adv, z, torch.full((n, T), -1), torch.zeros(n), torch.zeros(n))


def split(batch: TrainBatch, parts: int) -> list[TrainBatch]:
    n = batch.input_ids.shape[0]
    step = -(-n // parts)
    return [batch.select(torch.arange(i, min(n, i + step))) for i in range(0, n, step)]


def update(model: Any, ref: Any, opt: Any, batch: TrainBatch, fwd: Any, micro: int) -> None:
    """Old + reference logprobs, then clipped policy loss + k3 KL fwd/bwd per micro-batch, one AdamW step."""
    dev = next(model.parameters()).device
    mbs = [mb.to(dev) for mb in split(batch, micro)]
    denom = float(batch.loss_mask.sum())
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        olds = [fwd(model, mb)[0] for mb in mbs]
        refs = [fwd(ref, mb)[0] for mb in mbs]
    opt.zero_grad(set_to_none=True)
    for mb, old, rf in zip(mbs, olds, refs, strict=True):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp, _, _ = fwd(model, mb)
        ratio = (logp - old).exp()
        pg = -torch.minimum(ratio * mb.advantages, ratio.clamp(0.8, 1.28) * mb.advantages)
        kl = (rf - logp).exp() - (rf - logp) - 1
        loss = ((pg + 0.01 * kl) * mb.loss_mask).sum() / denom
        loss.backward()
    opt.step()


def measure(name: str, variant: str, batch: TrainBatch, micro: int, repeats: int) -> dict[str, Any]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build(name, "cuda", torch.float32).train()
    ref = build(name, "cuda", torch.float32).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    fwd = forward if variant == "eager_padded" else packed_forward
    if variant == "packed_compile":
        model.model.compile()
        ref.model.compile()
    n_params = sum(p.numel() for p in model.parameters())
    tokens = int(batch.attention_mask.sum())
    try:
        update(model, ref, opt, batch, fwd, micro)  # warm-up (compiles)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            update(model, ref, opt, batch, fwd, micro)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    except torch.OutOfMemoryError as exc:
        return {"oom": True, "error": str(exc)[:200], "peak_gb": torch.cuda.max_memory_allocated() / 1e9}
    finally:
        del model, ref, opt
    return {
        "tok_s": tokens / best, "update_s": best, "tokens": tokens, "micro_batches": micro,
        "mfu": 10 * n_params * tokens / best / PEAK, "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default="eager_padded,packed,packed_compile")
    ap.add_argument("--out", default="benchmarks/results/update")
    args = ap.parse_args()
    res: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "command": "python " + " ".join(sys.argv),
        "rows": [],
    }
    for name in args.models.split(","):
        batch = rows(args.rows, args.max_len, SHAPES[name]["vocab_size"], full=False)
        for variant in args.variants.split(","):
            micro = (
                4 if variant == "eager_padded" else 1
            )  # eager: 8 rows a micro-batch, as the trainer's default
            r = {"model": name, "variant": variant, **measure(name, variant, batch, micro, args.repeats)}
            print(json.dumps(r), flush=True)
            res["rows"].append(r)
    if "qwen2.5-0.5b" in args.models:
        full = rows(32, 1024, SHAPES["qwen2.5-0.5b"]["vocab_size"], full=True)
        fit = measure("qwen2.5-0.5b", "packed", full, 1, 1)
        res["fit_0p5b_32k"] = fit
        res["fits_0p5b_32k"] = not fit.get("oom", False)
        res["mfu_0p5b"] = max(r.get("mfu", 0.0) for r in res["rows"] if r["model"] == "qwen2.5-0.5b")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2))
    lines = ["# update", "", f"Command: `{res['command']}`", f"Machine: {res['gpu']}; torch {torch.__version__}", "",
             "| model | variant | tok/s | MFU (10N) | update s | peak GB |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in res["rows"]:
        if r.get("oom"):
            lines.append(f"| {r['model']} | {r['variant']} | OOM | | | {r['peak_gb']:.1f} |")
        else:
            lines.append(
                f"| {r['model']} | {r['variant']} | {r['tok_s']:,.0f} | {r['mfu']:.3f} | {r['update_s']:.2f} | {r['peak_gb']:.1f} |"
            )
    for k in ("mfu_0p5b", "fits_0p5b_32k"):
        if k in res:
            lines.append(f"- `{k}`: {res[k]}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
