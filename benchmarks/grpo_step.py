"""One full GRPO step of ``toolgym train`` with ``engine: fast`` vs ``engine: hf``, time shares per step.

The single-turn Calculator task of the TRL anchor in GPU.md (8 prompts × 8 samples, ≤ 64 new tokens,
one turn), SmolLM2-135M's shape with random weights and its real tokenizer/template (``--model DIR``).
Per step: rollout generate time, env time, the rest (update: logprob passes, fwd/bwd, AdamW, logging).
TRL's ``GRPOTrainer`` is not installed on the device machine, so its anchor (≈1.9 s a step on an H200,
GPU.md) is quoted, not rerun: ``speedup_vs_trl`` is only written when ``trl`` imports and ``--trl`` is
given (not implemented here yet: the anchor must run in the same process).

    python benchmarks/grpo_step.py --model DIR [--steps 4] [--out benchmarks/results/grpo_step]
    python benchmarks/grpo_step.py --smoke   # a 2-layer model with the same tokenizer, on CPU: checks the script
    python benchmarks/grpo_step.py --variants fast,fast_block1,fast_compile,hf   # the engine's options, one run

Variants: ``fast`` (the defaults: on CUDA the update's decoder layers compiled), ``fast_block1`` (the engine
reads its samples after every decode step instead of every ``engine.block`` steps), ``fast_eager``
(``compile: off``), ``fast_compile`` (``compile: on``), ``fast_nocudnn`` (SDPA's cuDNN backend off),
``fast_share`` (``share_prefix: on``: each group's prompt runs once in the update), ``hf``.

``speedup_vs_trl_quoted`` divides the quoted TRL anchor (1.9 s, another run, an H200) by our step: a
reference point, not a same-run measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch


def run(
    engine: str, args: Any, block: int = 0, compile: str = "auto", cudnn: bool = True, share: str = "auto"
) -> dict[str, float]:
    """One variant's mean step times; ``block`` > 0 sets the fast engine's decode steps per host read;
    ``cudnn=False`` keeps SDPA off its cuDNN backend (engine prefill and update alike) for this run."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from toolgym.agents.engine.engine import Engine
    from toolgym.trainers.grpo import GRPOConfig, train

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    conf = AutoConfig.from_pretrained(args.model)
    if args.smoke:  # the same tokenizer and layout, 2 small layers
        conf.update(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16))  # fmt: skip
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            env_ids=["toolgym/Calculator-v0"], env_kwargs={"prompt_format": "text", "max_turns": 1},
            steps=args.steps, prompts_per_step=args.prompts, budget=args.samples, max_new_tokens=args.new,
            max_total_tokens=1024, lr=1e-6, device=device, tensorboard=False, progress=False, eval_episodes=1,
            eval_every=0, micro_batch_rows=64, engine=engine, output_dir=out, filter_zero_variance=False,
            compile=compile, share_prefix=share,
        )  # fmt: skip
        inner = Engine.__init__

        def init(self: Any, *a: Any, **k: Any) -> None:
            inner(self, *a, **k)
            if block > 0:
                self.block = block

        Engine.__init__ = init  # type: ignore[method-assign]
        cudnn_was = torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(cudnn and cudnn_was)
        try:
            train(cfg, model, tok)
        finally:
            Engine.__init__ = inner  # type: ignore[method-assign]
            torch.backends.cuda.enable_cudnn_sdp(cudnn_was)
        recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    # drop the first two (graph captures, compiles, the allocator's growth) and the last (evaluation)
    steady = recs[2:-1] or recs[-1:]
    step = sum(r["time/step_s"] for r in steady) / len(steady)
    gen = sum(r["rollout/generate_s"] for r in steady) / len(steady)
    env = sum(r["rollout/env_s"] for r in steady) / len(steady)
    return {"step_s": step, "generate_s": gen, "env_s": env, "rest_s": step - gen - env,
            "tokens": sum(r["rollout/generated_tokens"] for r in steady) / len(steady)}  # fmt: skip


# name: (engine, decode steps a host read (0: the engine's default), compile the update, SDPA's cuDNN backend,
# share_prefix)
VARIANTS: dict[str, tuple[str, int, str, bool, str]] = {
    "fast": ("fast", 0, "auto", True, "auto"),
    "fast_block1": ("fast", 1, "auto", True, "auto"),
    "fast_eager": ("fast", 0, "off", True, "auto"),
    "fast_compile": ("fast", 0, "on", True, "auto"),
    "fast_nocudnn": ("fast", 0, "auto", False, "auto"),
    "fast_share": ("fast", 0, "auto", True, "on"),
    "hf": ("hf", 0, "auto", True, "auto"),
}


def run_variant(name: str, args: Any) -> dict[str, float]:
    engine, block, compiled, cudnn, share = VARIANTS[name]
    return run(engine, args, block, compiled, cudnn, share)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=".bench/smollm2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="2-layer model, 2 steps, on CPU: checks the script")
    ap.add_argument(
        "--variants", default="fast,hf", help="comma-separated: fast, fast_block1, fast_compile, hf"
    )
    ap.add_argument("--no-warm", dest="warm", action="store_false", help="no discarded warm-up run first")
    ap.add_argument("--out", default="benchmarks/results/grpo_step")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.prompts, args.samples, args.new = 3, 2, 2, 8
    res: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "command": "python " + " ".join(sys.argv),
        "trl_reference_s": 1.9,
    }
    names = [v for v in args.variants.split(",") if v]
    if not {"fast", "hf"} <= set(names) or not set(names) <= set(VARIANTS):
        sys.exit(f"--variants must name fast and hf, and only {sorted(VARIANTS)}")
    if args.warm:  # a discarded run first: one-time costs of the process (Triton JIT, graph captures) land
        # in whichever variant runs first (0.3-0.4 s a step on an H100 over 3 steady steps)
        run_variant(names[0], argparse.Namespace(**{**vars(args), "steps": 4}))
    for name in names:
        res[name] = run_variant(name, args)
    res["speedup_vs_hf"] = res["hf"]["step_s"] / res["fast"]["step_s"]
    res["speedup_vs_trl_quoted"] = res["trl_reference_s"] / res["fast"]["step_s"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2))
    lines = ["# grpo_step", "", f"Command: `{res['command']}`", f"Machine: {res['gpu']}", "",
             "| engine | step s | generate s | env s | update + rest s | generated tokens |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for k in names:
        r = res[k]
        lines.append(
            f"| {k} | {r['step_s']:.2f} | {r['generate_s']:.2f} | {r['env_s']:.2f} | {r['rest_s']:.2f} | {r['tokens']:.0f} |"
        )
    lines += ["", f"- `speedup_vs_hf`: {res['speedup_vs_hf']:.2f}",
              f"- `speedup_vs_trl_quoted`: {res['speedup_vs_trl_quoted']:.2f} (quoted anchor, not rerun)",
              "- TRL GRPOTrainer (not rerun here: not installed on the device machine): ≈1.9 s a step on an H200 (GPU.md)"]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
