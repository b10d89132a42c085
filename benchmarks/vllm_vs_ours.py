"""vLLM and our engine side by side in one run (``vllm_vs_ours_b256`` of benchmarks/results/scale.json).

The workload of benchmarks/generation.py: random weights in the exact SmolLM2-135M and Qwen2.5-0.5B shapes,
B = 256 prompts of 960 random tokens, 128 sampled tokens each (temperature 1, no early stop), tokens/s counting
the 128·B sampled tokens over the whole call (prefill included), best of ``--repeats`` after a warm-up.
Ours: ``Engine`` (generation.py's ``run_ours``). vLLM 0.26: ``LLM.generate`` on token-id prompts, dummy weights,
bf16, prefix caching off (the prompts share nothing), ``logprobs=0`` (the sampled token's logprob, as ours
returns), CUDA graphs on. Each (engine, model) runs in its own process, so neither holds memory for the other.

    python benchmarks/vllm_vs_ours.py [--models smollm2-135m,qwen2.5-0.5b] [--batch 256] [--out benchmarks/results/scale.json]
    python benchmarks/vllm_vs_ours.py --smoke     # tiny shape on CPU, ours only: checks the script runs

Merges ``vllm_vs_ours_b{B}`` into OUT (a JSON object of named keys): per model both tok/s and vllm / ours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def case_ours(model_name: str, B: int, P: int, N: int, repeats: int, device: str) -> dict[str, Any]:
    import torch
    from generation import build, prompts, run_ours

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(model_name, device, dtype)
    ids = prompts(B, P, model.config.vocab_size, seed=0)
    return run_ours(model, ids, N, repeats)


def case_vllm(model_name: str, B: int, P: int, N: int, repeats: int, memory: float) -> dict[str, Any]:
    import torch
    from generation import SHAPES, prompts
    from transformers import LlamaConfig, Qwen2Config
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = dict(SHAPES[model_name])
    kind = spec.pop("kind")
    config = (LlamaConfig if kind == "llama" else Qwen2Config)(**spec)
    config.architectures = ["LlamaForCausalLM" if kind == "llama" else "Qwen2ForCausalLM"]
    folder = Path(tempfile.mkdtemp(prefix=f"vllm-{model_name}-"))
    config.save_pretrained(folder)
    llm = LLM(
        model=str(folder), skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
        gpu_memory_utilization=memory, max_model_len=P + N + 8, max_num_seqs=B, enable_prefix_caching=False,
        seed=0,  # (chunked prefill and its token budget: vLLM's own defaults)
    )  # fmt: skip
    rows = prompts(B, P, config.vocab_size, seed=0).tolist()
    sp = SamplingParams(
        temperature=1.0, max_tokens=N, min_tokens=N, ignore_eos=True, logprobs=0, detokenize=False
    )
    batch = [TokensPrompt(prompt_token_ids=r) for r in rows]
    best: dict[str, Any] = {}
    for rep in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == N for o in outs)
        if rep and (not best or B * N / dt > best["tok_s"]):
            best = {"tok_s": B * N / dt, "call_s": dt}
    best["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return best


def run_case(args: argparse.Namespace, engine: str, model: str) -> dict[str, Any]:
    """One case in a child process (its GPU memory is gone when it ends); its JSON result."""
    cmd = [
        sys.executable, __file__, "--case", f"{engine}:{model}", "--batch", str(args.batch), "--prompt",
        str(args.prompt), "--new", str(args.new), "--repeats", str(args.repeats), "--memory", str(args.memory),
        "--device", args.device,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"error": (proc.stderr or proc.stdout)[-2000:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=960)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--memory", type=float, default=0.6, help="vLLM's gpu_memory_utilization")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="benchmarks/results/scale.json")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.case:
        engine, model = args.case.split(":", 1)
        if engine == "ours":
            res = case_ours(model, args.batch, args.prompt, args.new, args.repeats, args.device)
        else:
            res = case_vllm(model, args.batch, args.prompt, args.new, args.repeats, args.memory)
        print("RESULT " + json.dumps(res))
        return
    if args.smoke:
        args.models, args.batch, args.prompt, args.new, args.repeats, args.device = "tiny", 4, 16, 8, 1, "cpu"
        args.out = str(Path(tempfile.gettempdir()) / "vllm_vs_ours_smoke.json")
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    rows: dict[str, Any] = {}
    for model in args.models.split(","):
        ours = run_case(args, "ours", model)
        vllm = run_case(args, "vllm", model) if not args.smoke else {"skipped": "smoke run"}
        row: dict[str, Any] = {"ours": ours, "vllm": vllm}
        if "tok_s" in ours and "tok_s" in vllm:
            row["vllm_over_ours"] = vllm["tok_s"] / ours["tok_s"]
        rows[model] = row
        print(model, json.dumps(row), flush=True)
    key = f"vllm_vs_ours_b{args.batch}"
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    data[key] = {
        "gpu": gpu, "workload": f"B={args.batch}, {args.prompt} prompt + {args.new} sampled tokens, random weights",
        "vllm": "0.26.0", **rows,
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {key} to {out}")


if __name__ == "__main__":
    main()
