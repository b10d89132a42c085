"""Run by test_distributed.py under torchrun (2 gloo processes): one GRPO step, then each rank's weights."""

from __future__ import annotations

import os
import sys


def main(out: str) -> None:
    import torch

    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )  # repo root
    from tests.trainers.conftest import FAKE_ENV, register_fake_env, tiny_model, tiny_tokenizer
    from toolgym.trainers.grpo import GRPOConfig, train

    torch.set_num_threads(1)
    register_fake_env()
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))  # type: ignore[arg-type]
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, f"{out}/init.pt")
    cfg = GRPOConfig(
        env_ids=[FAKE_ENV], env_kwargs={}, steps=1, prompts_per_step=2, budget=4, max_new_tokens=6,
        max_total_tokens=256, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=1,
        micro_batch_rows=3, output_dir=out,
    )  # fmt: skip
    rank = int(os.environ["RANK"])
    train(cfg, model, tok)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, f"{out}/rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
