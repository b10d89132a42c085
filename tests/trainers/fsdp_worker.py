"""Run by test_fsdp.py under torchrun (gloo processes on CPU).

``train OUT PARALLEL [offload] [kl] [gc] [resume] [FIELD=INT ...]``: one GRPO step (checkpoint saved), each rank's rollout copy after the
step's weight sync written to OUT/copy{rank}.pt. ``load OUT CKPT``: a fresh sharded model and AdamW load CKPT;
rank 0 writes the full weights and optimizer state to OUT/loaded{world}.pt. ``lockstep OUT -``: ranks with
unequal micro-batch counts run in lockstep (OUT/lockstep{rank}.pt: each rank's micro-batches).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def config(out: str, parallel: str, **kw: Any) -> Any:
    from tests.trainers.conftest import FAKE_ENV
    from toolgym.trainers.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        env_ids=[FAKE_ENV], env_kwargs={}, steps=1, prompts_per_step=2, budget=4, max_new_tokens=6,
        max_total_tokens=256, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=1,
        micro_batch_rows=3, output_dir=out, parallel=parallel,
    )  # fmt: skip
    return GRPOConfig(**(base | kw))


def train(out: str, parallel: str, extra: list[str]) -> None:
    import torch

    from tests.trainers.conftest import register_fake_env, tiny_model, tiny_tokenizer
    from toolgym.trainers.distributed import Dist
    from toolgym.trainers.grpo import train as train_grpo

    register_fake_env()
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))  # type: ignore[arg-type]
    rank = int(os.environ.get("RANK", "0"))
    synced = Dist.after_update

    def after_update(self: Dist) -> None:  # records what the rollout reads after the step
        synced(self)
        if self.fsdp is not None:
            state = {k: v.clone() for k, v in self.fsdp.copy.model.state_dict().items()}
            torch.save(state, f"{out}/copy{rank}.pt")

    Dist.after_update = after_update  # type: ignore[method-assign]
    kw: dict[str, Any] = {"fsdp_offload": "offload" in extra}
    if "gc" in extra:
        kw["gradient_checkpointing"] = True
    if "kl" in extra:
        kw["kl_coef"] = 0.05
    for arg in extra:  # steps=2, minibatches=2, ...: integer fields
        if "=" in arg:
            key, value = arg.split("=", 1)
            kw[key] = int(value)
    if "resume" in extra:
        kw["resume"] = True
    train_grpo(config(out, parallel, **kw), model, tok)


def load(out: str, ckpt: str) -> None:
    """Loads CKPT into a fresh model (sharded when a process group runs) and dumps full state on rank 0."""
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from tests.trainers.conftest import tiny_model, tiny_tokenizer
    from toolgym.trainers import checkpoint
    from toolgym.trainers.fsdp import full_tensors, join_single_rank, shard
    from toolgym.trainers.modeling import make_optimizer

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    join_single_rank(torch.device("cpu"))  # (one process: a group of one)
    model = tiny_model(len(tiny_tokenizer()), seed=123)  # type: ignore[arg-type]
    shard(model, torch.device("cpu"), bf16=False, offload=False)
    optimizer = make_optimizer(model, 1e-2, 0.0)
    checkpoint.load(Path(ckpt), {"model": model}, optimizer)
    dump = full_state(model, optimizer)
    weights = dict(full_tensors(model))
    if dist.get_rank() == 0:
        torch.save({"weights": weights, "optimizer": dump}, f"{out}/loaded{dist.get_world_size()}.pt")
    dist.barrier()
    dist.destroy_process_group()


def lockstep_run(out: str) -> None:
    """Rank 0 holds 5 rows in 3 micro-batches, rank 1 holds 2 rows in 1: both run 3 (forward + backward each;
    rank 1's last two are dummy rows with a zero loss)."""
    import torch
    import torch.distributed as dist

    from tests.trainers.conftest import tiny_model
    from toolgym.trainers.batch import micro_batches
    from toolgym.trainers.fsdp import lockstep, shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_model(300)
    shard(model, torch.device("cpu"), bf16=False, offload=False)
    n = 5 if rank == 0 else 2
    chunks = lockstep(micro_batches(n, 2), model)
    for idx in chunks:
        ids = torch.randint(0, 300, (max(len(idx), 1), 4), generator=torch.Generator().manual_seed(rank))
        scale = 1.0 if len(idx) else 0.0  # (an empty chunk: a dummy row)
        (model(input_ids=ids).logits.sum() * scale).backward()  # every forward and backward is a collective
    torch.save([c.tolist() for c in chunks], f"{out}/lockstep{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def full_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """AdamW's state keyed by parameter name, full tensors (a collective when sharded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    sd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {name: {k: v.clone() for k, v in st.items()} for name, st in sd["state"].items()}


def main() -> None:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    torch.set_num_threads(1)
    mode, out, arg, *extra = sys.argv[1:]
    if mode == "train":
        train(out, arg, extra)
    elif mode == "lockstep":
        lockstep_run(out)
    else:
        load(out, arg)


if __name__ == "__main__":
    main()
