"""The update side of issue 32's scale benchmarks: a GRPO update step (``grpo_update.optimize``, as
``toolgym train`` runs it) of a large shape under ``parallel: ddp`` and ``fsdp2`` on 1, 2, 4 GPUs, with
random weights built from the shape (no network, no checkpoint), and the hybrid engine's weight sync
(full weights gathered into the rollout's bf16 copy, ``RolloutCopy.sync``).

One variant per torchrun invocation (a rank that runs out of memory must not leave the others waiting);
``--all`` runs each variant as its own torchrun with a timeout and merges what they wrote:

    python benchmarks/scale_fsdp.py --all --model qwen2.5-7b --gpus 2 --out /tmp/scale_fsdp_7b_2gpu.json
    torchrun --nproc_per_node 2 benchmarks/scale_fsdp.py --model qwen2.5-1.5b --parallel fsdp2 --out OUT.json
    python benchmarks/scale_fsdp.py --all --smoke --gpus 2    # tiny shape, gloo on CPU: checks it runs
    python benchmarks/scale_fsdp.py --report /tmp/scale_fsdp_7b_2gpu.json [--machine "2 x NVIDIA H200"]

``--report`` turns ``--all`` outputs into benchmarks/results/scale_fsdp.{md,json} (rows of earlier reports
kept) and an ``update_<model>_<g>gpu`` key each in benchmarks/results/scale.json.

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
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generation import SHAPES as PUBLIC
from generation import build_shape

RESULTS = Path(__file__).parent / "results"
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
                           "max_len": args.max_len, "micro_batch_rows": args.micro,
                           "gradient_checkpointing": args.checkpointing}  # fmt: skip
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
                "timeout_s": args.timeout,
            }
        print(json.dumps(results[variant]), flush=True)
    return {"model": args.model, "gpus": args.gpus, "command": "python " + shlex.join(sys.argv),
            "machine": machine(), "variants": results}  # fmt: skip


def machine() -> dict[str, Any]:
    """The GPUs this ran on. Asked after the variants ran: CUDA started in this parent process would hold
    memory on GPU 0 while the children measure."""
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": props.name, "gpu_count": torch.cuda.device_count(),
                "gpu_memory_mib": props.total_memory // 2**20}  # fmt: skip
    return out


# the variant whose numbers the scale.json key carries, when several fit
PREFERENCE = ("fsdp2", "ddp", "fsdp2_offload")


def what_it_times() -> str:
    """The module docstring's first paragraph and its "Per variant" one, unwrapped, as markdown."""
    paragraphs = [" ".join(p.split()) for p in (__doc__ or "").split("\n\n")]
    keep = [paragraphs[0], *(p for p in paragraphs if p.startswith("Per variant"))]
    return "\n\n".join(keep).replace("``", "`")


def _num(x: Any, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _result(variant: dict[str, Any], command: str | None) -> str:
    """``ok``, or the result and the first line of its error (a timeout with the seconds it had)."""
    result = str(variant.get("result", "failed"))
    if result == "ok":
        return result
    line = (str(variant.get("error", "")).strip().splitlines() or [""])[0]
    if line == "timeout":
        seconds = variant.get("timeout_s")
        if seconds is None and command and "--timeout" in (argv := shlex.split(command)):
            seconds = argv[argv.index("--timeout") + 1]
        line = f"no result within {float(seconds):g} s (timeout)" if seconds is not None else "timeout"
    return f"{result}: {line}".replace("|", "\\|")


def _machine(entry: dict[str, Any]) -> str:
    m = entry.get("machine")
    if m is None or isinstance(m, str):
        return m or "not recorded"
    gpus = f"{m['gpu_count']} x {m['gpu']}, {m['gpu_memory_mib']} MiB each" if m.get("gpu") else "no GPU"
    return f"{gpus}, torch {m.get('torch')} CUDA {m.get('cuda')}"


def _settings(entry: dict[str, Any]) -> str:
    """The step's shape, from the first variant that recorded it (a timed-out one records none)."""
    v = next((v for v in entry["variants"].values() if "rows" in v), None)
    if v is None:
        return "settings not recorded"
    ckpt = v.get("gradient_checkpointing")
    if ckpt is None and entry.get("command"):
        ckpt = "--checkpointing" in shlex.split(entry["command"])
    ckpt_text = {True: "gradient checkpointing on", False: "gradient checkpointing off", None: ""}[ckpt]
    return ", ".join(x for x in (f"{v['rows']} rows of up to {v['max_len']} tokens over all ranks",
                                 f"micro-batches of {v['micro_batch_rows']} rows", ckpt_text) if x)  # fmt: skip


def update_key(entry: dict[str, Any]) -> dict[str, Any]:
    """scale.json's ``update_<model>_<g>gpu``: which variants fit, and the numbers of the preferred one."""
    variants = entry["variants"]
    by = {r: [name for name, v in variants.items() if v.get("result") == r] for r in ("ok", "oom", "failed")}
    best = next((name for name in (*PREFERENCE, *variants) if name in by["ok"]), None)
    numbers = variants[best] if best else {}
    return {"fits": by["ok"], "oom": by["oom"], "failed": by["failed"], "variant": best,
            **{k: numbers.get(k) for k in ("step_s", "tokens_per_s", "mfu", "weight_sync_s", "peak_gb_rank0")},
            "source": "scale_fsdp.json"}  # fmt: skip


def missing(entries: dict[str, Any]) -> str:
    """Why the issue's full-step keys are not written, and what they still need."""
    seven = entries.get("qwen2.5-7b_2gpu", {}).get("variants", {})
    fsdp2, offload = seven.get("fsdp2", {}), seven.get("fsdp2_offload", {})
    needs = ["rollouts with vLLM in the same step (this script times the update and the weight sync only)"]
    if offload.get("result") != "ok":
        needs.append("the `fsdp2_offload` variant's step time (it has not finished a step here)")
    peak = f"{fsdp2['peak_gb_rank0']:.0f} GB" if fsdp2.get("peak_gb_rank0") else "measured"
    needs.append(f"a run on 2 x 80 GB GPUs, where fsdp2's {peak} peak on rank 0 would not fit without offload "
                 "or smaller micro-batches")  # fmt: skip
    listed = "; ".join(f"({i}) {n}" for i, n in enumerate(needs, 1))
    return ("Not written yet: the issue's keys `fits_7b_2gpu`, `step_s_7b_2gpu` and `weight_sync_s_7b`. They "
            f"are defined for a full GRPO step with vLLM rollouts, which has not run. Still missing: {listed}.")  # fmt: skip


def render(entries: dict[str, Any]) -> str:
    lines = ["# scale_fsdp: the GRPO update step of large shapes under ddp, fsdp2 and fsdp2_offload", "",
             what_it_times(), "", "Runs:", ""]  # fmt: skip
    for key, entry in sorted(entries.items()):
        lines.append(f"- `{key}`: {_machine(entry)}; {_settings(entry)}.")
        if entry.get("command"):
            lines.append(f"  Command: `{entry['command']}`")
    lines += ["", "| model | GPUs | variant | result | step s | tok/s | MFU | weight sync s | peak GB rank 0 |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for _, entry in sorted(entries.items()):
        variants = entry["variants"]
        for name in sorted(
            variants, key=lambda n: (VARIANTS.index(n) if n in VARIANTS else len(VARIANTS), n)
        ):
            v = variants[name]
            cells = [entry["model"], str(entry["gpus"]), name, _result(v, entry.get("command")),
                     _num(v.get("step_s"), 2), _num(v.get("tokens_per_s"), 0), _num(v.get("mfu"), 3),
                     _num(v.get("weight_sync_s"), 3), _num(v.get("peak_gb_rank0"), 1)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Peak GB is `torch.cuda.max_memory_allocated` of rank 0 over the timed steps (after the "
              "warm-up); the allocator's cache and the CUDA context come on top. `ddp` has no weight sync "
              "(its model is the rollout's), so 0.", "", missing(entries), ""]  # fmt: skip
    return "\n".join(lines)


def write_report(
    inputs: list[dict[str, Any]],
    results: Path = RESULTS,
    machine: str | None = None,
    command: str | None = None,
) -> None:
    """``results``/scale_fsdp.{json,md} from ``--all`` outputs (rows already there kept, a shape run again
    replaced), and an ``update_<model>_<g>gpu`` key per input in ``results``/scale.json (other keys kept).
    ``machine`` and ``command`` stand in for outputs that did not record them (before ``--all`` did)."""
    results.mkdir(parents=True, exist_ok=True)
    store = results / "scale_fsdp.json"
    entries: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {}
    scale = results / "scale.json"
    keys: dict[str, Any] = json.loads(scale.read_text()) if scale.is_file() else {}
    for entry in inputs:
        entry = {
            **entry,
            **({"machine": machine} if machine else {}),
            **({"command": command} if command else {}),
        }
        entries[f"{entry['model']}_{entry['gpus']}gpu"] = entry
        keys[f"update_{entry['model']}_{entry['gpus']}gpu"] = update_key(entry)
    store.write_text(json.dumps(entries, indent=2) + "\n")
    scale.write_text(json.dumps(keys, indent=2) + "\n")
    (results / "scale_fsdp.md").write_text(render(entries))


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
    p.add_argument("--out", default="/tmp/scale_fsdp.json", help="the run's JSON (for --report)")
    p.add_argument(
        "--report",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="--all outputs into benchmarks/results/scale_fsdp.{md,json} and scale.json; runs nothing",
    )
    p.add_argument("--results", type=Path, default=RESULTS, help="--report: where the md and JSONs go")
    p.add_argument("--machine", help='--report: the machine, for outputs that lack it ("2 x NVIDIA H200")')
    p.add_argument("--command", help="--report: the command that made the outputs, when they lack it")
    args = p.parse_args()
    if args.report:
        inputs = [json.loads(f.read_text()) for f in args.report]
        write_report(inputs, args.results, machine=args.machine, command=args.command)
        print(f"wrote {args.results / 'scale_fsdp.md'}", flush=True)
        return
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
