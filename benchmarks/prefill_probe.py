"""Where the engine's eager prefill pass spends its time on a GPU, per SDPA backend.

On an H100 the single-turn GRPO step spent ~0.3 s a step in 4 prefill passes of ~1k tokens (host_profile:
SDPA ~1.3 ms of host time a call), far above their arithmetic. This times ``model.prefill`` for the
real shape (random weights) under each SDPA backend choice, with lengths that change every call (as in
training), and prints a profiler table of one pass:

    python benchmarks/prefill_probe.py --model .bench/smollm2 [--calls 20] [--out OUT]

Per setting: host ms (until the call returns) and wall ms (after a sync), medians, for a fresh pass (8 new
prompts) and a continuing one (8 sequences that already hold 100 tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch


def _settings() -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B = SDPBackend
    return {
        "default": nullcontext,
        "no_cudnn": lambda: sdpa_kernel([B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]),
        "efficient": lambda: sdpa_kernel([B.EFFICIENT_ATTENTION]),
        "math": lambda: sdpa_kernel([B.MATH]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=".bench/smollm2")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    from toolgym.agents.engine.engine import Engine
    from toolgym.agents.engine.model import prefill

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model), dtype=torch.float32)
    eng = Engine(model, slots=32, capacity=1096)
    rng = torch.Generator().manual_seed(0)

    def lengths(lo: int, hi: int) -> list[int]:
        return torch.randint(lo, hi, (8,), generator=rng).tolist()

    def one(kind: str) -> tuple[float, float]:
        if kind == "fresh":
            seqs = [(i, 0, torch.randint(0, 1000, (n,)).tolist()) for i, n in enumerate(lengths(120, 180))]
        else:
            seqs = [(i, 100, torch.randint(0, 1000, (n,)).tolist()) for i, n in enumerate(lengths(20, 60))]
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        prefill(eng.weights, eng.cache, seqs)
        host = time.perf_counter() - t0
        if dev == "cuda":
            torch.cuda.synchronize()
        return host * 1e3, (time.perf_counter() - t0) * 1e3

    res: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    for name, ctx in _settings().items():
        row: dict[str, float] = {}
        try:
            for kind in ("fresh", "continue"):
                with ctx():
                    for _ in range(3):
                        one(kind)
                    times = [one(kind) for _ in range(args.calls)]
                row[f"{kind}_host_ms"] = statistics.median(t[0] for t in times)
                row[f"{kind}_wall_ms"] = statistics.median(t[1] for t in times)
        except RuntimeError as e:  # a backend this device lacks (efficient attention on CPU)
            print(name, "unavailable:", str(e).splitlines()[0], flush=True)
            continue
        res[name] = row
        print(name, {k: round(v, 2) for k, v in row.items()}, flush=True)
    if dev == "cuda":
        from torch.profiler import ProfilerActivity, profile

        for kind in ("fresh", "continue"):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                one(kind)
            print(f"== profile: one {kind} pass (default backends)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
