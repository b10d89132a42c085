"""Throughput and MFU of a full GRPO update, timed on the trainer's own update step (``grpo_update.optimize``):
old-policy logprobs + reference logprobs + clipped-loss fwd/bwd + AdamW, eager HF padded micro-batches vs
the packed path (trainers/packing.py: packed rows, per-row causal attention, chunked logprobs), optionally
with ``torch.compile``. Random weights in the model shapes; fp32 master weights under bf16 autocast, as
the trainer runs.

    python benchmarks/update.py [--models smollm2-135m,qwen2.5-0.5b] [--rows 32] [--max-len 1024]
        [--variants eager_padded:8,packed:8,packed:16,packed_compile:16] [--out benchmarks/results/update]
    python benchmarks/update.py --smoke      # tiny shape on CPU: checks the script runs (numbers mean nothing)
    python benchmarks/update.py --profile ...  # also one profiled update a variant: OUT_profile_VARIANT_ROWS.md

The update is the trainer's with ``epochs=1, minibatches=2, kl_coef=0.01`` (so the old-logprob pass and
the reference pass both run, and two optimizer steps), ``micro_batch_rows`` = the number after the colon.
Rows have lengths uniform in [max_len/4, max_len] (multi-turn rows vary), the second half of each row is
"model" tokens. MFU counts 10·N FLOPs a real token (6N fwd/bwd + 2N old + 2N reference) over 989 TFLOP/s
(dense bf16, H100/H200). ``fits_0p5b_32k``: 32 rows × 1024 tokens of the 0.5B shape in one micro-batch
(fwd/bwd + reference pass, packed) without running out of memory; if it does not fit as is, again with
gradient checkpointing (``fit_0p5b_32k.gradient_checkpointing`` says which fit). Keys: gpu, mfu_0p5b
(best variant), fits_0p5b_32k, per-variant tokens/s, MFU and peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generation import SHAPES, build

from toolgym.trainers.batch import TrainBatch

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
    adv = torch.randn((n, T), generator=g) * attn
    roll = (torch.randn((n, T), generator=g) * 0.1 - 2.0) * mask  # engine logprobs (for the IS correction)
    turns = torch.where(mask > 0, 0, -1)
    return TrainBatch(ids, attn, mask, adv, roll, turns, torch.zeros(n), torch.zeros(n))


def config(variant: str, micro: int, device: str, **kw: Any) -> Any:
    from toolgym.trainers.grpo import GRPOConfig

    packing = "off" if variant == "eager_padded" else "on"
    fields: dict[str, Any] = dict(
        env_ids=["toolgym/Calculator-v0"], device=device, epochs=1, minibatches=2, micro_batch_rows=micro,
        kl_coef=0.01, lr=1e-6, progress=False, tensorboard=False, filter_zero_variance=False,
        packing=packing, compile="compile" in variant,
    )  # fmt: skip
    return GRPOConfig(**(fields | kw))


def measure(
    name: str, variant: str, batch: TrainBatch, micro: int, repeats: int, checkpointing: bool = False,
    profile: Path | None = None, **kw: Any,
) -> dict[str, Any]:  # fmt: skip
    """The trainer's update step (grpo_update.optimize) on `batch`, as `toolgym train` sets it up."""
    from toolgym.trainers.grpo_update import optimize
    from toolgym.trainers.modeling import Reference, make_optimizer
    from toolgym.trainers.packing import compile_decoder, update_forward, use_packing

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cfg = config(variant, micro, device.type, gradient_checkpointing=checkpointing, **kw)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build(name, device.type, torch.float32).train()
    if cfg.gradient_checkpointing:  # as modeling.build_policy does
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    ref = Reference(model) if cfg.kl_coef > 0 else None
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay)
    # packed_compile: the trainer's compiled update (policy and reference layers, chunk scorer); packed_compile_layers:
    # the policy's layers only (the update before the profile of 2026-11-26)
    whole = cfg.compile and cuda and variant != "packed_compile_layers"  # as grpo.train compiles
    fwd = update_forward(use_packing(cfg.packing, model, device), cfg.logprob_chunk, compiled=whole)
    if cfg.compile and cuda:
        compile_decoder(model, ref.frozen if ref is not None and whole else None)
    n_params = sum(p.numel() for p in model.parameters())
    b = batch.to(device)
    tokens = int(batch.attention_mask.sum())

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    try:
        t0 = time.perf_counter()
        optimize(cfg, 1, b, model, model, opt, ref=ref, fwd=fwd)  # warm-up (compiles)
        sync()
        first = time.perf_counter() - t0
        best = float("inf")
        for step in range(repeats):
            t0 = time.perf_counter()
            optimize(cfg, 2 + step, b, model, model, opt, ref=ref, fwd=fwd)
            sync()
            best = min(best, time.perf_counter() - t0)
        if profile is not None:
            try:  # a profiler failure costs the profile, not the measurement
                profile_step(
                    profile, partial(optimize, cfg, 99, b, model, model, opt, ref=ref, fwd=fwd), sync
                )
            except Exception as exc:
                print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)
    except torch.OutOfMemoryError as exc:
        peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
        return {"oom": True, "error": str(exc)[:200], "peak_gb": peak}
    finally:
        del model, ref, opt
    return {
        "tok_s": tokens / best, "update_s": best, "first_s": first, "tokens": tokens, "micro_batch_rows": micro,
        "mfu": 10 * n_params * tokens / best / PEAK,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0,
    }  # fmt: skip


def kernel_kind(name: str) -> str:
    """A CUDA kernel's family, for the profile's summary (by the names cuBLAS, FlashAttention and Inductor use)."""
    n = name.lower()
    for kind, keys in (
        ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul")),
        ("attention", ("flash", "fmha", "attention", "efficient")),
        ("optimizer", ("adam", "multi_tensor", "foreach", "l2norm")),
        ("inductor (fused)", ("triton_",)),
        ("copy / cast", ("copy", "cast", "convert", "fill")),
        ("index / scatter", ("index", "scatter", "gather")),
        ("reduction", ("reduce", "softmax", "logsumexp", "norm")),
    ):
        if any(k in n for k in keys):
            return kind
    return "other elementwise"


def profile_step(path: Path, step: Any, sync: Any) -> None:
    """One update under torch.profiler: the top CUDA kernels and each family's share, as markdown at `path`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        sync()
        wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events) or 1.0
    kinds: dict[str, float] = {}
    for e in events:
        kinds[kernel_kind(e.key)] = kinds.get(kernel_kind(e.key), 0.0) + e.self_device_time_total
    lines = [f"# update profile: {path.stem}", "",
             f"GPU kernel time {total / 1e3:.1f} ms in one update of {wall * 1e3:.1f} ms (under the profiler)", "",
             "| family | ms | share |", "|---|---:|---:|"]  # fmt: skip
    lines += [
        f"| {k} | {v / 1e3:.1f} | {v / total:.1%} |" for k, v in sorted(kinds.items(), key=lambda x: -x[1])
    ]
    lines += ["", "| kernel | calls | ms | share |", "|---|---:|---:|---:|"]
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:40]:
        lines.append(f"| `{e.key[:110]}` | {e.count} | {e.self_device_time_total / 1e3:.1f} "
                     f"| {e.self_device_time_total / total:.1%} |")  # fmt: skip
    host = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    lines += ["", "Host side, by self CPU time (syncs show as cudaStreamSynchronize / item / nonzero):", "",
              "| op | calls | self CPU ms |", "|---|---:|---:|"]  # fmt: skip
    for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:20]:
        lines.append(f"| `{e.key[:90]}` | {e.count} | {e.self_cpu_time_total / 1e3:.1f} |")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]), flush=True)


def guarded(fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    """A variant that fails (a compile error, say) is reported, not fatal to the run."""
    try:
        return fn(*args, **kw)  # type: ignore[no-any-return]
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--variants",
        default="eager_padded:8,packed:8,packed:16,packed_compile:16",
        help="VARIANT:MICRO_BATCH_ROWS, VARIANT in eager_padded | packed | packed_compile | packed_compile_layers",
    )
    ap.add_argument("--no-fit", action="store_true", help="skip the 0.5B 32x1024 fit check")
    ap.add_argument(
        "--profile", action="store_true", help="profile one update of each variant (OUT_profile_*.md)"
    )
    ap.add_argument("--smoke", action="store_true", help="tiny shape, few rows, on CPU: checks the script")
    ap.add_argument("--out", default="benchmarks/results/update")
    args = ap.parse_args()
    if args.smoke:
        args.models, args.rows, args.max_len, args.repeats = "tiny", 6, 48, 1
        args.variants, args.no_fit = "eager_padded:2,packed:2,packed:4", True
    cuda = torch.cuda.is_available()
    res: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "command": "python " + " ".join(sys.argv),
        "load_avg": os.getloadavg()[0],
        "rows": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run cut by its time limit keeps what it measured
        best = [r.get("mfu", 0.0) for r in res["rows"] if r["model"] == "qwen2.5-0.5b"]
        if best:
            res["mfu_0p5b"] = max(best)
        out.with_suffix(".json").write_text(json.dumps(res, indent=2))

    specs = [s.partition(":") for s in args.variants.split(",")]
    eager = [(v, m) for v, _, m in specs if "compile" not in v]
    compiled = [(v, m) for v, _, m in specs if "compile" in v]  # last: compiling takes a while

    def run(todo: list[tuple[str, str]]) -> None:
        for name in args.models.split(","):
            batch = rows(args.rows, args.max_len, SHAPES[name]["vocab_size"], full=False)
            for variant, micro in todo:
                r = {"model": name, "variant": variant}
                prof = out.with_name(f"{out.name}_profile_{variant}_{micro}.md") if args.profile else None
                r |= guarded(measure, name, variant, batch, int(micro or 8), args.repeats, profile=prof)
                print(json.dumps(r), flush=True)
                res["rows"].append(r)
                save()

    run(eager)
    if "qwen2.5-0.5b" in args.models and not args.no_fit:
        full = rows(32, 1024, SHAPES["qwen2.5-0.5b"]["vocab_size"], full=True)
        fit: dict[str, Any] = {}
        for ckpt in (False, True):  # one micro-batch of 32 rows: fwd/bwd + the reference pass
            fit = guarded(measure, "qwen2.5-0.5b", "packed", full, 32, 1, ckpt, minibatches=1)
            fit["gradient_checkpointing"] = ckpt
            print("fit", json.dumps(fit), flush=True)
            if "tok_s" in fit:
                break
        res["fit_0p5b_32k"] = fit
        res["fits_0p5b_32k"] = "tok_s" in fit
        save()
    run(compiled)
    save()
    lines = ["# update", "", f"Command: `{res['command']}`",
             f"Machine: {res['gpu']}; torch {torch.__version__}; load average {res['load_avg']:.1f}", "",
             "The trainer's update step (`grpo_update.optimize`: old + reference logprob passes, fwd/bwd, 2 AdamW steps).", "",
             "| model | variant | micro-batch rows | tok/s | MFU (10N) | update s | first call s | peak GB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in res["rows"]:
        if "tok_s" not in r:
            why = "OOM" if r.get("oom") else r.get("error", "failed")
            lines.append(f"| {r['model']} | {r['variant']} | | {why} | | | | {r.get('peak_gb', 0):.1f} |")
        else:
            lines.append(
                f"| {r['model']} | {r['variant']} | {r['micro_batch_rows']} | {r['tok_s']:,.0f} | {r['mfu']:.3f} "
                f"| {r['update_s']:.2f} | {r['first_s']:.1f} | {r['peak_gb']:.1f} |"
            )
    lines.append("")
    for k in ("mfu_0p5b", "fits_0p5b_32k"):
        if k in res:
            lines.append(f"- `{k}`: {res[k]}")
    if "fit_0p5b_32k" in res:
        f = res["fit_0p5b_32k"]
        lines.append(f"- 0.5B, 32 x 1024 tokens in one micro-batch: peak {f.get('peak_gb', 0):.1f} GB, "
                     f"gradient checkpointing {f.get('gradient_checkpointing')}")  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
