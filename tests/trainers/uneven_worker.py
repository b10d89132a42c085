"""Run by test_uneven_ranks.py under torchrun (2 gloo processes on CPU): ranks whose batches differ.

``update OUT PARALLEL``: `optimize` on hand-made batches whose rows differ per rank (CASES: rank 1 empty,
unequal row counts, no rows anywhere, rank 1's rows all filtered; with several minibatches and epochs, and a
KL reference); rank 0 writes OUT/{case}.pt: the full weights after the step and the rank-averaged metrics.
``train OUT PARALLEL``: two GRPO steps where rank 1's first batch has no rows (every episode an env error);
each rank writes its weights to OUT/rank{rank}.pt.
``UNEVEN_DEVICE=cuda`` runs ``update`` on one GPU a rank (NCCL; fp32, no bf16), for the device check.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# case -> (rank 0's rows, rank 1's rows, rank 1's rows kept, GRPOConfig fields)
CASES: dict[str, tuple[list[int], list[int], bool, dict[str, Any]]] = {
    "rank1_empty": ([0, 1, 2, 3, 4], [], True, {}),
    "unequal": ([0, 1, 2, 3, 4], [5, 6], True, {}),
    "none": ([], [], True, {}),
    "rank1_filtered": ([0, 1, 2, 3, 4], [5, 6], False, {}),
    "rank0_empty_kl": ([], [5, 6, 0], True, {"kl_coef": 0.1}),
    "minibatches_empty": ([0, 1, 2, 3, 4, 5], [], True, {"minibatches": 2, "epochs": 2}),
    "minibatches_unequal": ([0, 1, 2, 3, 4, 5], [6], True, {"minibatches": 2, "epochs": 2}),
}
VOCAB = 300


def rows_batch(rows: list[int], kept: bool = True) -> Any:
    """A TrainBatch of the given rows (row i is the same on every rank and in one process: seeded by i)."""
    import torch

    from toolgym.trainers.batch import TrainBatch

    lengths = [6 + 3 * (i % 3) for i in rows]
    B, T = len(rows), max(lengths, default=1)
    ids = torch.zeros(B, T, dtype=torch.long)  # [B, T]
    attn = torch.zeros(B, T, dtype=torch.long)  # [B, T]
    mask = torch.zeros(B, T)  # [B, T]
    adv = torch.zeros(B, T)  # [B, T]
    roll = torch.zeros(B, T)  # [B, T]
    turns = torch.full((B, T), -1, dtype=torch.long)  # [B, T]
    for b, (i, n) in enumerate(zip(rows, lengths, strict=True)):
        g = torch.Generator().manual_seed(1000 + i)
        ids[b, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        attn[b, :n] = 1
        mask[b, 3:n] = float(kept)
        adv[b, 3:n] = 1.0 if i % 2 else -0.5
        roll[b, 3:n] = -5.7
        turns[b, 3:n] = 0
    rewards = torch.tensor([1.0 if i % 2 else 0.0 for i in rows])
    return TrainBatch(ids, attn, mask, adv, roll, turns, rewards, torch.zeros(B))


def config(out: str, parallel: str, **kw: Any) -> Any:
    from tests.trainers.conftest import FAKE_ENV
    from toolgym.trainers.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        env_ids=[FAKE_ENV], env_kwargs={}, steps=1, prompts_per_step=2, budget=4, max_new_tokens=6,
        max_total_tokens=256, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=1,
        micro_batch_rows=2, output_dir=out, parallel=parallel, grad_clip=0.0,
    )  # fmt: skip
    return GRPOConfig(**(base | kw))


def update_case(out: str, parallel: str, case: str, dist: Any) -> dict[str, Any]:
    """One `optimize` call (SGD, lr 1: the weights move by minus the gradient) on this rank's rows of `case`;
    the full weights after it and the metrics averaged over ranks (world 1: one process, all the rows)."""
    import torch

    from tests.trainers.conftest import tiny_model
    from toolgym.trainers.fsdp import Sharded, full_tensors
    from toolgym.trainers.grpo_update import optimize
    from toolgym.trainers.modeling import Reference

    r0, r1, kept1, kw = CASES[case]
    cfg = config(out, parallel, **kw)
    device = torch.device(f"cuda:{dist.local_rank}" if os.environ.get("UNEVEN_DEVICE") == "cuda" else "cpu")
    model: Any = tiny_model(VOCAB).to(device)
    if dist.world == 1:
        batch = rows_batch(r0 + r1) if kept1 else rows_batch(r0)  # (filtered rows add nothing)
    else:
        batch = rows_batch(r0) if dist.rank == 0 else rows_batch(r1, kept1)
    batch = batch.to(device)
    dist.fsdp = None
    if parallel == "fsdp2" and dist.world > 1:
        dist.fsdp = Sharded(cfg, device, dist.world, quiet=True)
        dist.fsdp.take(model, keep_reference=cfg.kl_coef > 0)
    ref = Reference(model) if cfg.kl_coef > 0 else None
    trainer = model if dist.fsdp is not None or dist.world == 1 else dist.wrap(model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    metrics = optimize(cfg, 1, batch, model, trainer, optimizer, ref=ref, dist=dist)
    metrics = dist.mean_metrics(metrics)
    weights = {n: w.cpu().clone() for n, w in full_tensors(model)}
    return {"weights": weights, "metrics": metrics}


def update(out: str, parallel: str) -> None:
    import torch

    from toolgym.trainers.distributed import Dist

    dist = Dist.from_env(os.environ.get("UNEVEN_DEVICE", "cpu"))
    for case in CASES:
        got = update_case(out, parallel, case, dist)
        torch.save(got, f"{out}/{case}.rank{dist.rank}.pt")
    dist.close()


def train(out: str, parallel: str) -> None:
    """Two GRPO steps; at step 1 rank 1's credit has no rows (as when every episode is an env error)."""
    import torch

    from tests.trainers.conftest import register_fake_env, tiny_model, tiny_tokenizer
    from toolgym.trainers import grpo

    register_fake_env()
    tok = tiny_tokenizer()
    model: Any = tiny_model(len(tok))  # type: ignore[arg-type]
    rank = int(os.environ["RANK"])
    real = grpo.credit
    calls = [0]

    def credit(cfg: Any, forest: Any, scorer: Any) -> Any:
        c = real(cfg, forest, scorer)
        calls[0] += 1
        if rank == 1 and calls[0] == 1:  # no rows: the step's batch is empty on this rank only
            c.rows, c.rewards, c.advantages, c.keep, c.turn_masks = [], [], [], [], None
        return c

    grpo.credit = credit  # type: ignore[assignment]
    cfg = config(out, parallel, steps=2, micro_batch_rows=3, lr=1e-2, grad_clip=1.0)
    grpo.train(cfg, model, tok)
    if parallel == "fsdp2":
        return  # (the sharded weights: the checkpoint and the rollout copy are checked by test_fsdp.py)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, f"{out}/rank{rank}.pt")


def main() -> None:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    torch.set_num_threads(1)
    mode, out, parallel = sys.argv[1:4]
    if mode == "update":
        update(out, parallel)
    else:
        train(out, parallel)


if __name__ == "__main__":
    main()
