"""Step 4 of the GRPO loop (grpo.py): `optimize`, the update on one rollout batch (old logprobs, then
epochs x minibatches optimizer steps over micro-batches); benchmarks/update.py times exactly this."""

from __future__ import annotations

import time
from typing import Any

import torch

from toolgym.trainers.addons import AddonState
from toolgym.trainers.advantages import entropy_scaled
from toolgym.trainers.batch import HostMasks, TrainBatch, dummy_batch, forward, micro_batches, to_device
from toolgym.trainers.distributed import Dist
from toolgym.trainers.fsdp import lockstep
from toolgym.trainers.grpo_config import GRPOConfig
from toolgym.trainers.loss import PolicyBatch, StatLog, denominator, policy_loss
from toolgym.trainers.modeling import Reference, autocast, clip_gradients, trainable_parameters
from toolgym.trainers.packing import Forward


def optimize(
    cfg: GRPOConfig, step: int, batch: TrainBatch, model: Any, trainer: Any, optimizer: Any, *,
    ref: Reference | None = None, dist: Dist | None = None, addons: AddonState | None = None,
    fwd: Forward = forward,
) -> dict[str, float]:  # fmt: skip
    """Step 4 of the loop (benchmarks/update.py times exactly this): the sampling policy's logprobs when
    several optimizer steps follow (eval mode, no dropout), then epochs x minibatches optimizer steps;
    micro-batches of a minibatch share one global denominator. `trainer` is `model` or its DDP wrapper;
    `fwd` the forward of every pass (`packing.update_forward`). Returns the losses/time metrics."""
    dist = dist or Dist()
    addons = addons or AddonState(cfg, dist.world)
    loss_cfg = cfg.loss_config()
    device = batch.input_ids.device
    n_rows = batch.input_ids.shape[0]
    # per-row counts read once: the micro-batch loop then never waits on the GPU for them
    mask_cpu = batch.loss_mask.cpu()  # [B, T]
    # packing reads these, not the GPU; it scores the loss mask's tokens and EPO's (`TrainBatch.row_mask`)
    masks = HostMasks(batch.attention_mask.cpu(), batch.scored_mask().cpu())
    row_mask: list[float] = mask_cpu.sum(1).tolist()  # [B]
    row_len: list[int] = batch.attention_mask.sum(1).tolist()  # [B]
    # EPO's rows: every kept row with a model token (with shared="once", also one whose nodes others train)
    epo_live: list[bool] = (batch.turn_mask().cpu().sum(1) > 0).tolist() if cfg.epo else [False] * n_rows
    metrics: dict[str, float] = {}
    multi = cfg.epochs * cfg.minibatches > 1
    old = _old_logprobs(model, batch, cfg, device, fwd, row_len, masks) if multi else None
    model.train()
    stats = StatLog()  # the loss stats stay on the device until each optimizer step ends
    addons.start_step(step)
    ent_grad = cfg.entropy_coef > 0 or cfg.epo  # EPO's entropy terms need the entropy's gradient
    t_train, trained_tokens, updates = time.perf_counter(), 0, 0
    g = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    for epoch in range(cfg.epochs):
        order = torch.randperm(n_rows, generator=g) if cfg.minibatches > 1 else torch.arange(n_rows)
        per_mb = -(-n_rows // cfg.minibatches)
        # every rank runs as many minibatches and micro-batches (a rank short of rows: empty ones, whose
        # dummy rows meet the others' collectives; distributed.py "Uneven ranks")
        for mb_index, mb_rows in enumerate(dist.pad(micro_batches(n_rows, per_mb, order))):
            # before the first optimizer step the policy is the sampling one: its own logprobs are the old
            # ones, exactly (the eval pass differs by rounding, ~1e-7, which would fire LLDS's gate)
            fresh = old is None or (epoch == 0 and mb_index == 0)
            # (a token budget may give ranks different counts: dist.pad evens them)
            chunks = micro_batches(
                len(mb_rows), cfg.micro_batch_rows, mb_rows, row_len, cfg.micro_batch_tokens
            )
            chunks = dist.pad(chunks)
            denom = dist.sum(sum(denominator(mask_cpu[i], loss_cfg) for i in chunks))  # all ranks
            # EPO's mean is over the minibatch's rows that train, on all ranks
            epo_rows = sum(epo_live[r] for r in mb_rows.tolist()) if cfg.epo else 0
            epo_rows = int(dist.sum(float(epo_rows))) if cfg.epo else 0
            if denom == 0 and epo_rows == 0:
                continue  # nothing to learn from these rows (every group was filtered out)
            optimizer.zero_grad(set_to_none=True)
            for i, idx in enumerate(chunks):
                if len(idx) == 0:  # a dummy: zero gradient, but its backward syncs (the last one) / reduces
                    _dummy_step(cfg, trainer, ref, dist, device, sync=i == len(chunks) - 1, ent_grad=ent_grad)
                    continue
                rows = idx.tolist()
                w = sum(row_mask[r] for r in rows)
                if w == 0 and not any(epo_live[r] for r in rows) and dist.world == 1:
                    continue  # (under DDP every rank runs every micro-batch: the last one syncs gradients)
                T = max(row_len[r] for r in rows)
                host = HostMasks(*(m[idx, :T] for m in masks))
                idx = to_device(idx, device)  # every index below reads it on the device, copied once
                mb = batch.select(idx, T)
                sync = dist.no_sync(trainer, sync=i == len(chunks) - 1)
                with sync, autocast(device, cfg.bf16):
                    logp, ent, _ = fwd(
                        trainer, mb, cfg.temperature, entropy=True, entropy_grad=ent_grad, host=host
                    )
                    ref_logp = None
                    if ref is not None:
                        with torch.no_grad(), ref.active() as ref_model:
                            ref_logp, _, _ = fwd(ref_model, mb, cfg.temperature, host=host)
                adv = mb.advantages  # [b, t]
                if cfg.entropy_advantage and ent is not None:
                    adv = entropy_scaled(adv, ent, mb.loss_mask, cfg.entropy_advantage)
                pb = PolicyBatch(
                    logprobs=logp, old_logprobs=logp.detach() if fresh or old is None else old[idx, :T],
                    advantages=adv, mask=mb.loss_mask, rollout_logprobs=mb.rollout_logprobs,
                    ref_logprobs=ref_logp, entropy=ent, turn_ids=mb.turn_ids,
                )  # fmt: skip
                loss, st = policy_loss(pb, loss_cfg, denom)
                loss = addons.epo_term(loss, ent, mb, epo_rows)
                with dist.no_sync(trainer, sync=i == len(chunks) - 1):
                    (loss * dist.world).backward()
                trained_tokens += sum(row_len[r] for r in rows)
                stats.add(st, w)
            grad_norm = clip_gradients(trainable_parameters(model), cfg.grad_clip)  # (FSDP2: a plain tensor)
            optimizer.step()
            updates += 1
            metrics["losses/grad_norm"] = stats.read(grad_norm=grad_norm)["grad_norm"]  # the step's one sync
    metrics |= {f"losses/{k}": v for k, v in stats.means().items()}
    metrics["losses/updates"] = float(updates)
    addons.end_step(metrics, dist.sum)
    metrics["time/train_tokens_per_s"] = trained_tokens / max(time.perf_counter() - t_train, 1e-9)
    return metrics


def _dummy_step(
    cfg: GRPOConfig, trainer: Any, ref: Reference | None, dist: Dist, device: torch.device, *, sync: bool,
    ent_grad: bool,
) -> None:  # fmt: skip
    """A micro-batch of one dummy row (`batch.dummy_batch`) with a zero loss: the forwards (policy and, when
    there is one, the sharded reference: FSDP2 gathers in each) and the backward take part in the collectives
    of the other ranks' micro-batch, and add exactly 0 to every gradient."""
    mb = dummy_batch(device)
    with dist.no_sync(trainer, sync=sync), autocast(device, cfg.bf16):
        logp, ent, _ = forward(trainer, mb, cfg.temperature, entropy=True, entropy_grad=ent_grad)
        if ref is not None:
            with torch.no_grad(), ref.active() as ref_model:
                forward(ref_model, mb, cfg.temperature)
        loss = logp.sum() * 0.0
        if ent is not None and ent.requires_grad:
            loss = loss + ent.sum() * 0.0
    with dist.no_sync(trainer, sync=sync):
        loss.backward()


def _old_logprobs(
    model: Any, batch: Any, cfg: GRPOConfig, device: torch.device, fwd: Forward = forward,
    lengths: list[int] | None = None, masks: HostMasks | None = None,
) -> torch.Tensor:  # fmt: skip
    """Logprobs of the policy that sampled the batch, [B, T], in eval mode (no dropout), before any update."""

    B, T = batch.input_ids.shape
    out = torch.zeros(B, T, device=device)  # [B, T]
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast(device, cfg.bf16):
        tokens = cfg.micro_batch_tokens if lengths is not None else 0  # (a budget needs the lengths)
        for idx in lockstep(micro_batches(B, cfg.micro_batch_rows, lengths=lengths, tokens=tokens), model):
            if len(idx) == 0:  # a dummy forward (fsdp2): meets the other ranks' gathers
                forward(model, dummy_batch(device), cfg.temperature)
                continue
            t = max(lengths[i] for i in idx.tolist()) if lengths else None
            host = HostMasks(*(m[idx, :t] for m in masks)) if masks is not None else None
            idx = to_device(idx, device)
            mb = batch.select(idx, t)
            out[idx, : mb.input_ids.shape[1]] = fwd(model, mb, cfg.temperature, host=host)[0].float()
    model.train(was_training)
    return out
