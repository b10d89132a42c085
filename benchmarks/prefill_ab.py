"""The engine's prefill alone, A/B: the varlen pass (Triton kernels on a GPU, plain torch otherwise or with
``--no-kernels``) against the earlier padded pass, for B prompts of P tokens (``--mixed``: lengths spread
over P/8…P), in the engine's own passes of at most ``prefill_tokens`` new tokens, with the first token
sampled (what ``Engine.step`` does before the first decode step). Random weights in a benchmark shape.

    python benchmarks/prefill_ab.py [--model smollm2-135m] [--batch 256] [--prompt 960] [--mixed]
        [--prefix 0] [--calls 3] [--out benchmarks/results/prefill_ab]
    python benchmarks/prefill_ab.py --smoke   # tiny shape on CPU: checks the script runs

``--prefix N``: every prompt continues N cached tokens (a prefix-cache hit). ``--sweep "bm=64,bn=64;bm=128,
warps=8"``: the varlen pass again under each ``TOOLGYM_PREFILL_ATTN`` launch config. Prints and writes (``--out``)
per mode: best seconds of a whole prefill, new tokens/s, and achieved TFLOP/s of the matmuls (linear layers
and causal attention; the LM head runs on the last token only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation import SHAPES, build, prompts, sync


def flops(shape: dict[str, Any], lens: list[int], prefix: int) -> float:
    """Matmul FLOPs of prefilling ``lens`` new tokens after ``prefix`` cached ones each."""
    hidden, L = shape["hidden_size"], shape["num_hidden_layers"]
    head = hidden // shape["num_attention_heads"]
    kvh, inter = shape["num_key_value_heads"], shape["intermediate_size"]
    per_token = 2 * L * (hidden * (hidden + 2 * kvh * head) + hidden * hidden + 3 * hidden * inter)
    keys = sum(n * prefix + n * (n + 1) / 2 for n in lens)  # (query, key) pairs, causal
    return per_token * sum(lens) + 4 * L * hidden * keys


def time_mode(
    model: Any, ids: list[list[int]], prefix: int, mode: str, kernels: bool | None, calls: int
) -> float:
    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.sampling import SampleMode

    cap = prefix + max(map(len, ids)) + 8
    eng = Engine(model, slots=len(ids), capacity=cap, prefill=mode, kernels=kernels, cuda_graphs=False)
    head = prompts(1, prefix, eng.weights.shape.vocab, 5)[0].tolist() if prefix else []
    seqs = [eng.new([*head, *x]) for x in ids]
    for s in seqs:
        s.slot = eng.scheduler.alloc()
    if prefix:
        eng.prefill_only(seqs, [prefix] * len(seqs))
    greedy = SampleMode(temperature=0)
    best = float("inf")
    for _ in range(calls + 1):  # the first call compiles the kernels
        for s in seqs:
            s.kv, s.mode = prefix, greedy
        sync()
        t0 = time.perf_counter()
        outs = [o for b in eng.scheduler.prefill_batches(seqs) for o in eng.runner.prefill(b)]
        [o[1].tolist() for o in outs]  # the samples on the host: as the engine's step reads them
        sync()
        best = min(best, time.perf_counter() - t0)
    del eng
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=960)
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--prefix", type=int, default=0)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--no-kernels", action="store_true", help="the varlen pass in plain torch on a GPU too")
    ap.add_argument(
        "--sweep",
        default="",
        help="';'-separated TOOLGYM_PREFILL_ATTN configs to time the varlen pass with too",
    )
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.batch, args.prompt, args.calls = "tiny", 4, 48, 1
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build(args.model, "cuda" if cuda else "cpu", dtype)
    shape = SHAPES[args.model]
    g = torch.Generator().manual_seed(0)
    if args.mixed:
        lens = torch.randint(max(1, args.prompt // 8), args.prompt + 1, (args.batch,), generator=g).tolist()
    else:
        lens = [args.prompt] * args.batch
    rows = prompts(args.batch, args.prompt, shape["vocab_size"], 1).tolist()
    ids = [r[:n] for r, n in zip(rows, lens, strict=True)]
    kern = False if args.no_kernels else None
    work = flops(shape, lens, args.prefix)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv), "new_tokens": sum(lens), "tflop": work / 1e12,
    }  # fmt: skip
    for mode in ("varlen", "padded"):
        s = time_mode(model, ids, args.prefix, mode, kern, args.calls)
        res[mode] = {"s": s, "tok_s": sum(lens) / s, "tflop_s": work / s / 1e12}
        print(mode, json.dumps(res[mode]), flush=True)
    res["speedup"] = res["padded"]["s"] / res["varlen"]["s"]
    for cfg in filter(None, args.sweep.split(";")):  # the attention's launch (kernels.PrefillAttnConfig)
        os.environ["TOOLGYM_PREFILL_ATTN"] = cfg
        sec = time_mode(model, ids, args.prefix, "varlen", kern, args.calls)
        res[f"varlen[{cfg}]"] = {"s": sec, "tok_s": sum(lens) / sec, "tflop_s": work / sec / 1e12}
        print(cfg, json.dumps(res[f"varlen[{cfg}]"]), flush=True)
    os.environ.pop("TOOLGYM_PREFILL_ATTN", None)
    print(json.dumps(res))
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
