"""The update side of issue 32's scale benchmarks: a GRPO update step (``grpo_update.optimize``, as
``toolgym train`` runs it) of a large shape under ``parallel: ddp`` and ``fsdp2`` on 1, 2, 4 GPUs, with
random weights built from the shape (no network, no checkpoint), and the hybrid engine's weight sync
(full weights gathered into the rollout's bf16 copy, ``RolloutCopy.sync``).

One variant per torchrun invocation (a rank that runs out of memory must not leave the others waiting);
``--all`` runs each variant as its own torchrun with a timeout and merges what they wrote:

    python benchmarks/scale_fsdp.py --all --model qwen2.5-7b --gpus 2 --out benchmarks/results/scale_fsdp_7b.json
    torchrun --nproc_per_node 2 benchmarks/scale_fsdp.py --model qwen2.5-1.5b --parallel fsdp2 --out OUT.json
    python benchmarks/scale_fsdp.py --all --smoke --gpus 2    # tiny shape, gloo on CPU: checks it runs

Per variant (``ddp``, ``fsdp2``, ``fsdp2_offload``): ``ok`` or ``oom``, the step's seconds (best of
``--repeats`` after one warm-up), tokens/s over all ranks, MFU (6·N FLOPs a real token over 989 TFLOP/s a
GPU; gradient checkpointing's recompute not counted), peak GPU memory of rank 0, and ``weight_sync_s``
(update end → every rank's rollout copy holds the new weights). The rollout itself (vLLM or our engine) is
not in this script: the full-step keys ``fits_7b_2gpu`` and ``scaling_1p5b_1_to_2`` combine these numbers
with the rollout helpers' (benchmarks/scale.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generation import SHAPES as PUBLIC
from generation import build_shape

PEAK = 989e12  # dense bf16 FLOP/s, H100/H200
# the shapes the issue names (generation.py's table of public HF configs); weights are random
SHAPES: dict[str, dict[str, Any]] = {
    **{name: PUBLIC[name] for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3-8b")},
    "tiny": {**PUBLIC["tiny"], "tie_word_embeddings": False},  # --smoke on CPU: numbers mean nothing
}
VARIANTS = ("ddp", "fsdp2", "fsdp2_offload")


def build(name: str, device: torch.device) -> Any:
    """The shape with random fp32 weights on ``device`` (the trainer's master weights)."""
    return build_shape(SHAPES[name], device).float()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One variant on the ranks torchrun started (or one process)."""
    from update import rows

    from toolgym.trainers.distributed import Dist
    from toolgym.trainers.fsdp import Sharded
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo_update import optimize
    from toolgym.trainers.modeling import make_optimizer

    cuda = torch.cuda.is_available() and not args.smoke
    dist = Dist.from_env("cuda" if cuda else "cpu")
    device = torch.device(dist.device_name("cuda") if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    fsdp = args.parallel.startswith("fsdp2")
    cfg = GRPOConfig(
        env_ids=["toolgym/Calculator-v0"], device=device.type, micro_batch_rows=args.micro, kl_coef=0.0,
        lr=1e-6, progress=False, tensorboard=False, packing="off", compile="off",
        gradient_checkpointing=args.checkpointing, parallel="fsdp2" if fsdp else "ddp",
        fsdp_offload=args.parallel == "fsdp2_offload",
    )  # fmt: skip
    per_rank = args.rows // dist.world
    out: dict[str, Any] = {"variant": args.parallel, "model": args.model, "gpus": dist.world, "rows": args.rows,
                           "max_len": args.max_len, "micro_batch_rows": args.micro}  # fmt: skip
    try:
        model = build(args.model, device).train()
        n_params = sum(p.numel() for p in model.parameters())
        if args.checkpointing:
            model.gradient_checkpointing_enable()
        copy = None
        if fsdp:
            dist.fsdp = Sharded(cfg, device, dist.world, quiet=not dist.main)
            copy = dist.fsdp.take(model, keep_reference=False)
            trainer = model
        else:
            trainer = dist.wrap(model, device)
        opt = make_optimizer(model, cfg.lr, cfg.weight_decay)
        vocab = SHAPES[args.model]["vocab_size"]
        batch = rows(per_rank, args.max_len, vocab, full=False, seed=dist.rank).to(device)
        tokens = dist.sum(float(batch.attention_mask.sum()))

        def step(i: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            optimize(cfg, i, batch, model, trainer, opt, dist=dist)
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            dist.after_update()
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            return t1 - t0, time.perf_counter() - t1

        step(1)  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        timed = [step(2 + i) for i in range(args.repeats)]
        best = min(t for t, _ in timed)
        out |= {
            "result": "ok",
            "params": n_params,
            "step_s": best,
            "tokens_per_s": tokens / best,
            "mfu": 6 * n_params * tokens / best / (PEAK * dist.world) if cuda else None,
            "weight_sync_s": min(s for _, s in timed) if copy is not None else 0.0,
            "peak_gb_rank0": torch.cuda.max_memory_allocated(device) / 1e9 if cuda else None,
        }
    except torch.OutOfMemoryError as e:
        out |= {"result": "oom", "error": str(e).splitlines()[0][:200]}
    finally:
        dist.close()
    return out


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant as its own torchrun (a timeout or a crash is recorded, not fatal); merged results."""
    results: dict[str, Any] = {}
    for variant in args.variants.split(","):
        part = Path(args.out).with_suffix(f".{variant}.json")
        part.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.gpus),
               "--master_port", str(29500 + VARIANTS.index(variant)), __file__, "--model", args.model,
               "--parallel", variant, "--rows", str(args.rows), "--max-len", str(args.max_len),
               "--micro", str(args.micro), "--repeats", str(args.repeats), "--out", str(part)]  # fmt: skip
        cmd += ["--checkpointing"] if args.checkpointing else []
        cmd += ["--smoke"] if args.smoke else []
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        try:
            proc = subprocess.run(cmd, timeout=args.timeout, env=env, capture_output=True, text=True)
            tail = proc.stderr[-1500:]
        except subprocess.TimeoutExpired:
            tail = "timeout"
        if part.is_file():
            results[variant] = json.loads(part.read_text())
        else:
            oom = "OutOfMemoryError" in tail or "out of memory" in tail
            results[variant] = {
                "variant": variant,
                "result": "oom" if oom else "failed",
                "error": tail[-600:],
            }
        print(json.dumps(results[variant]), flush=True)
    return {"model": args.model, "gpus": args.gpus, "variants": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-7b", choices=sorted(SHAPES))
    p.add_argument("--parallel", default="fsdp2", choices=VARIANTS)
    p.add_argument("--all", action="store_true", help="every variant of --variants, each its own torchrun")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--gpus", type=int, default=2, help="--all: ranks per torchrun")
    p.add_argument("--rows", type=int, default=64, help="rows of the step over all ranks")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--micro", type=int, default=4, help="micro_batch_rows")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--checkpointing", action="store_true", help="gradient_checkpointing")
    p.add_argument("--timeout", type=float, default=280, help="--all: seconds a variant may take")
    p.add_argument("--smoke", action="store_true", help="the tiny shape on CPU (gloo)")
    p.add_argument("--out", default="benchmarks/results/scale_fsdp.json")
    args = p.parse_args()
    if args.smoke:
        args.model, args.rows, args.max_len, args.repeats = "tiny", 8, 64, 1
    if args.all:
        merged = run_all(args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(merged, indent=2) + "\n")
        return
    result = measure(args)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
