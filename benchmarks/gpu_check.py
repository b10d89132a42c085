"""Before spending GPU minutes on training: does the fast engine sample the trainer's current weights on CUDA?

Two faults once flattened whole GPU runs while every CPU test passed (CUDA's fused AdamW bumps no version
counter; a decode step could hold more rows than slots). This check runs the same paths on the GPU in about a
minute, with random weights of a real model's shape:

1. the engine's logprobs of its own greedy tokens equal an HF forward's, before and after a fused AdamW step
   (and differ from the pre-step ones: the step is seen);
2. many prompts of mixed lengths through few slots (admission under pressure), every sequence finished.

    python benchmarks/gpu_check.py --model .bench/smollm2      # exits 1 when a check fails
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def hf_logprobs(model: torch.nn.Module, prompt: list[int], out: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + out], device=device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(ids).logits.float()
    lp = torch.log_softmax(logits[0, len(prompt) - 1 : -1], dim=-1)
    return lp.gather(1, torch.tensor(out, device=lp.device)[:, None])[:, 0].cpu()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=".bench/smollm2", help="a folder with config.json and a tokenizer")
    ap.add_argument("--device", default="cuda", help="cpu: a slow smoke run of this script itself")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device")
        return 1
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.policy import SamplingParams

    t0 = time.monotonic()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.model)).to(a.device)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    policy = EnginePolicy(model, tok, slots=16, capacity=1024, engine_dtype=dtype)
    policy.engine.stop_ids = set()
    sp = SamplingParams(temperature=0, max_new_tokens=16)
    prompt = tok.encode("The calculator says that 12 times 34 is")
    failures: list[str] = []

    (g0,) = policy.generate([prompt], sp)
    diff0 = (torch.tensor(g0.logprobs) - hf_logprobs(model, prompt, g0.token_ids)).abs().max().item()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=a.device == "cuda")
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    (g1,) = policy.generate([prompt], sp)
    diff1 = (torch.tensor(g1.logprobs) - hf_logprobs(model, prompt, g1.token_ids)).abs().max().item()
    moved = g1.token_ids != g0.token_ids or abs(sum(g1.logprobs) - sum(g0.logprobs)) > 1e-3
    print(f"engine vs HF logprobs: before the step {diff0:.4f}, after {diff1:.4f}; step seen: {moved}")
    if diff0 > 0.15 or diff1 > 0.15:
        failures.append(f"engine logprobs differ from HF's by {max(diff0, diff1):.3f}")
    if not moved:
        failures.append("the engine did not see the fused AdamW step")

    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(10, 1000, (int(n),), generator=gen).tolist() for n in torch.randint(2, 300, (96,))
    ]
    outs = policy.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=48, seed=0))
    short = sum(len(o.token_ids) != 48 for o in outs)
    print(f"96 prompts through 16 slots: {len(outs)} generations, {short} not at their 48 tokens")
    if len(outs) != 96 or short:
        failures.append("admission under pressure lost or cut sequences")

    print(
        f"gpu_check: {'FAILED: ' + '; '.join(failures) if failures else 'ok'} ({time.monotonic() - t0:.0f} s)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
