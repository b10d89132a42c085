"""One GRPO step: TRL's ``GRPOTrainer`` vs ``toolgym train``, same model, batch and GPU, in one process.

The single-turn task of GPU.md's TRL anchor: 8 prompts x 8 samples, <= 64 new tokens, one turn, SmolLM2-135M
(its shape with random weights by default, which never stops early, so both sides generate exactly 8 x 8 x 64
tokens; ``--real DIR`` loads real weights for both). TRL runs twice: with its defaults (gradient
checkpointing on, fp32) and tuned (checkpointing off, bf16), since a user may run either. Ours is
``benchmarks/grpo_step.py``'s step (``engine: fast`` on CUDA). Seconds a step are the mean after ``--warmup``
steps (compiles, graph captures).

    python benchmarks/trl_speed.py [--model .bench/smollm2] [--steps 6] [--out benchmarks/results/trl_speed]

Writes NAME.json with ``trl_step_s``, ``trl_tuned_step_s``, ``toolgym_step_s`` and ``speedup_vs_trl``
(TRL's default step time over ours; ``speedup_vs_trl_tuned`` too), and NAME.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

PROBLEMS = [(12, 7), (23, 4), (31, 9), (45, 6), (17, 8), (64, 3), (28, 5), (53, 7)]


def _model(args: Any, device: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    if args.real:
        return AutoModelForCausalLM.from_pretrained(args.real, dtype=torch.float32).to(device)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model), dtype=torch.float32)


def run_trl(args: Any, tuned: bool) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(args.real or args.model)
    tok.pad_token = tok.pad_token or tok.eos_token
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a}*{b}? Answer with just the number."}],
            "answer": a * b,
        }
        for a, b in PROBLEMS
    ] * (args.steps + 2)

    def reward(completions: list[Any], answer: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [float(str(x) in t) for t, x in zip(texts, answer, strict=True)]

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, num_generations=args.samples, per_device_train_batch_size=args.prompts * args.samples,
            max_completion_length=args.new, max_steps=args.steps, learning_rate=1e-6, logging_steps=1,
            report_to="none", save_strategy="no", temperature=1.0, use_cpu=device == "cpu",
            gradient_checkpointing=not tuned, bf16=tuned and device == "cuda", seed=0,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=_model(args, device), reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
            processing_class=tok, callbacks=[Clock()],
        )  # fmt: skip
        trainer.train()
    steady = times[args.warmup :] or times[-1:]
    return {"step_s": sum(steady) / len(steady), "steps": float(len(times))}


def run_ours(args: Any, variant: str) -> dict[str, float]:
    spec = importlib.util.spec_from_file_location("grpo_step", Path(__file__).with_name("grpo_step.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not torch.cuda.is_available():
        variant = "hf"
    ns = argparse.Namespace(
        model=args.model,
        steps=args.steps,
        prompts=args.prompts,
        samples=args.samples,
        new=args.new,
        smoke=False,
    )
    return dict(mod.run_variant(variant, ns))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=".bench/smollm2", help="config + tokenizer dir (random weights)")
    ap.add_argument(
        "--real", default="", help="a HF model dir with weights: TRL loads them (ours: see grpo_step)"
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument(
        "--variants",
        default="fast",
        help="our step's variants (grpo_step.py's names); the first is the headline",
    )
    ap.add_argument("--no-warm", dest="warm", action="store_false", help="no discarded warm-up run of ours")
    ap.add_argument("--out", default="benchmarks/results/trl_speed")
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    variants = [v for v in args.variants.split(",") if v]
    if args.warm:  # a discarded run first: the process's one-time costs (Triton JIT, graph captures, cuBLAS
        # handles) landed in whichever variant ran first, by 0.3-0.4 s a step over 3 steps on an H100
        run_ours(argparse.Namespace(**{**vars(args), "steps": 4}), variants[0])
    each = {v: run_ours(args, v) for v in variants}
    ours = each[variants[0]]
    trl_default = run_trl(args, tuned=False)
    trl_tuned = run_trl(args, tuned=True)
    import trl

    result = {
        "gpu": gpu,
        "trl_version": trl.__version__,
        "trl_step_s": trl_default["step_s"],
        "trl_tuned_step_s": trl_tuned["step_s"],
        "toolgym_step_s": ours["step_s"],
        "toolgym_generate_s": ours["generate_s"],
        "speedup_vs_trl": trl_default["step_s"] / ours["step_s"],
        "speedup_vs_trl_tuned": trl_tuned["step_s"] / ours["step_s"],
        "variant": variants[0],
        "variants": {
            v: {**r, "speedup_vs_trl": trl_default["step_s"] / r["step_s"]} for v, r in each.items()
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# One GRPO step: TRL GRPOTrainer vs toolgym train",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Machine: {gpu}; torch {torch.__version__}; trl {trl.__version__}",
        "",
        f"{args.prompts} prompts x {args.samples} samples, <= {args.new} new tokens, one turn; "
        f"mean seconds a step after {args.warmup} warm-up steps, {args.steps} steps each.",
        "",
        "| trainer | s / step |",
        "|---|---:|",
        f"| TRL GRPOTrainer, defaults (gradient checkpointing, fp32) | {trl_default['step_s']:.3f} |",
        f"| TRL GRPOTrainer, tuned (no checkpointing, bf16) | {trl_tuned['step_s']:.3f} |",
        *[f"| toolgym train, {v} | {r['step_s']:.3f} |" for v, r in each.items()],
        "",
        f"- `speedup_vs_trl`: {result['speedup_vs_trl']:.2f} (ours: {variants[0]})",
        f"- `speedup_vs_trl_tuned`: {result['speedup_vs_trl_tuned']:.2f}",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
