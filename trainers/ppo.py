"""PPO with a value head and GAE over model tokens, for multi-turn tool agents: one config, then the loop.

Each step: draw tasks -> sample `budget` independent rollouts per task -> flatten to rows -> one no-grad
pass for old logprobs and values -> GAE over model tokens (tool/env tokens skipped) and whitening ->
`epochs` passes of `minibatches` optimizer steps on the clipped policy loss + clipped value loss.

Departures from the papers:
1. The value head is a linear layer on the policy's last hidden state (shared trunk, as cleanrl's
   Atari agent; verl uses a separate critic model). It is zero-initialised and has its own learning rate.
2. GAE skips tool/env tokens (verl since PR #2337): value and running advantage pass through them.
3. The outcome reward sits on the last model token of each rollout. The KL to the initial policy is
   either a loss term (`kl_coef`, estimator `kl_estimator`) or a per-token reward -beta * KL_t
   (`kl_in_reward`, verl's `use_kl_in_reward` with a fixed coefficient; no adaptive controller).
7. GAE bootstraps from the value after the last token where the episode was truncated (turn limit,
   token budget, timeout) and uses 0 where it terminated; env_error episodes get no row at all.
8. `critic="turn"` is ST-PPO's turn-level critic (paper only, no official code): one value per turn
   (at its first model token), GAE over turns, the value loss on those tokens only. Pair it with
   `ratio_level="turn"` for ST-PPO's turn-level importance ratio; the clipping-bias correction (S-PPO)
   is not implemented (its formula is unverified; docs/trainer.md).
4. Old logprobs are the trainer's (recomputed); engine/trainer mismatch is corrected by TIS (see grpo.py).
5. Rollouts are independent samples (no branching): trees of depth one.
6. Single process only (torchrun data parallel is in the GRPO loop); `parallel: fsdp2` shards the policy
   trunk and the value head over a group of one (bf16 compute, CPU offload; trainers/fsdp.py).
9. The add-ons (addons.py) run here as in GRPO: success replay + task selection (a
   replayed row's values come from the current critic), EPO's entropy terms, and `critic="hiper"`:
   HiPER's HAE with one value head (hiper.hae_gae; docs/trainer.md "Add-ons").
10. `max_staleness` > 0: asynchronous rollouts as in GRPO (trainers/async_rollout.py: a worker grows the next
   batches from an actor copy, or on vLLM servers, while the learner updates); the no-grad pass's logprobs
   are then decoupled PPO's proximal ones and the behaviour logprobs weight each token (`is_mode`). The values
   and GAE come from the learner's current critic, whatever version sampled the tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from toolgym.agents.engine.select import choose_engine
from toolgym.errors import ConfigError
from toolgym.trainers import checkpoint, preemption
from toolgym.trainers.addons import AddonState
from toolgym.trainers.advantages import gae, masked_whiten, terminal_rewards, turn_gae
from toolgym.trainers.async_rollout import AsyncRollout, async_metrics, rollout_side, start_worker
from toolgym.trainers.batch import TrainBatch, collate, final_values, forward, micro_batches
from toolgym.trainers.config import warn_inert
from toolgym.trainers.distributed import Dist
from toolgym.trainers.episodes import episode_metrics, evaluate, next_tasks
from toolgym.trainers.gpu_memory import memory_plan
from toolgym.trainers.hiper import hae_gae, row_plans
from toolgym.trainers.loss import PolicyBatch, StatLog, denominator, kl_penalty, policy_loss, value_loss
from toolgym.trainers.metrics_log import MetricsLog
from toolgym.trainers.modeling import (
    Reference,
    autocast,
    build_policy,
    clip_gradients,
    pick_device,
    trainable_parameters,
    value_head,
)
from toolgym.trainers.ppo_config import PPOConfig  # the config (no torch); re-exported here
from toolgym.trainers.rollout import TreeRollout
from toolgym.trainers.tree import flatten, leaf_rewards

__all__ = ["PPOConfig", "train"]


def train(cfg: PPOConfig, model: Any = None, tokenizer: Any = None) -> dict[str, float]:
    """Runs (or resumes) PPO as configured; returns the last step's metrics."""
    cfg = checkpoint.resolve_resume(cfg)  # resume: auto -> whether output_dir holds a checkpoint
    with contextlib.ExitStack() as cleanup:  # a run that fails still closes its envs (sandboxes, containers)
        return _train(cfg, model, tokenizer, cleanup)


def _train(cfg: PPOConfig, model: Any, tokenizer: Any, cleanup: contextlib.ExitStack) -> dict[str, float]:
    cfg.validate()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("PPO runs in one process; for torchrun data parallel use `toolgym train grpo`")
    loss_cfg = cfg.loss_config()
    # SIGTERM/SIGINT: the checkpoint of the last completed step, then exit 143/130 (trainers/preemption.py)
    stop = cleanup.enter_context(preemption.for_run(cfg, lambda s: checkpoint.due(cfg, s)))
    warn_inert(cfg)
    rollout_cfg = cfg.rollout_config()
    device = pick_device(cfg.device, cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    dist = Dist()  # one process; parallel=fsdp2 shards over a group of one (offload, bf16 compute)
    policy, model = dist.hybrid(policy, cfg, device)
    # the weight copies (an asynchronous run's actor too, unless vLLM servers hold its weights), KV caches and
    # optimizer state, checked now
    plan = memory_plan(cfg, model, device, actor=bool(cfg.max_staleness and not cfg.rollout_servers))
    policy = choose_engine(  # `engine` as in GRPO: our decode engine over the same live weights, HF or vLLM
        policy, cfg.engine, rows=cfg.prompts_per_step * cfg.budget, capacity=cfg.max_total_tokens + cfg.max_new_tokens + 8,
        memory=cfg.engine_memory, servers=cfg.rollout_servers, weight_sync=cfg.weight_sync,
        sync_folder=cfg.weight_sync_folder, seed=cfg.seed, budget=plan.kv("learner"),
    )  # fmt: skip
    head = value_head(model).to(device)
    if dist.fsdp is not None:
        head = dist.fsdp.shard_extra(head)  # the value model = the sharded trunk + this head
    optimizer = torch.optim.AdamW(
        [
            {"params": trainable_parameters(model), "lr": cfg.lr},
            {"params": list(head.parameters()), "lr": cfg.value_lr},
        ],
        weight_decay=cfg.weight_decay,
    )
    out = Path(cfg.output_dir)
    # the KL reference is the initial policy: copied before a checkpoint is loaded, and saved with it
    ref = Reference(model) if cfg.kl_coef > 0 else None
    modules = {"model": model, "value_head": head}
    if ref is not None and ref.frozen is not None:
        modules["reference"] = ref.frozen
    progress = checkpoint.Progress()
    if cfg.resume:  # (load reads one folder: checkpoint, or checkpoint.old after a save cut between renames)
        progress = checkpoint.load(out / "checkpoint", modules, optimizer, optional=("reference",))
        dist.after_update()  # fsdp2: the rollout's copy gets the loaded weights
    log = MetricsLog(out, cfg.tensorboard, resume_step=progress.step if cfg.resume else None)
    (out / "config.json").write_text(json.dumps({"algorithm": "ppo", **cfg.to_dict()}, indent=2))
    # asynchronous (max_staleness > 0): the worker samples an actor copy, or vLLM servers (async_rollout.py)
    gate, rollout_policy = rollout_side(cfg, policy, device, progress.step, plan.kv("actor"), cleanup)
    roller = TreeRollout(
        rollout_policy, None, rollout_cfg, cfg.env_kwargs, gate=gate, env_backend=cfg.env_backend()
    )
    cleanup.callback(roller.close)  # (closing twice is harmless: the end of the run closes it too)
    addons = AddonState(cfg)  # replay buffer, task pool, EPO entropy band (addons.py)
    if cfg.resume:  # the add-ons continue where the checkpoint left them
        addons.load_state_dict(progress.extra)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=progress.step, desc="ppo", unit="step", dynamic_ncols=True)
    metrics: dict[str, float] = {}
    eval_kwargs = {**cfg.env_kwargs, **cfg.eval_env_kwargs}  # as GRPO and SFT evaluate

    def held_out(step: int) -> dict[str, float]:
        model.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            saved = (out, step) if cfg.save_evals else None
            return evaluate(
                policy, cfg.env_ids, eval_kwargs, rollout_cfg, cfg.eval_episodes, saved, cfg.env_backend()
            )

    if cfg.eval_every and progress.step == 0 and not cfg.resume:  # the initial policy, as GRPO's
        log.log(0, held_out(0))
    pipe: AsyncRollout | None = None
    if gate is not None:  # batch s: the tasks at the data position step s starts at, the synchronous seed
        pipe = start_worker(cfg, roller, gate, progress, cfg.prompts_per_step, device, cleanup)
    for step in range(progress.step + 1, cfg.steps + 1):
        stop.check(dist, progress.step, out / "checkpoint", lambda: checkpoint.save(
            out / "checkpoint", modules, optimizer, progress, addons.state_dict()))  # fmt: skip
        t_step = time.perf_counter()
        # 1. rollout: `budget` independent samples per task (asynchronous: grown by the worker, at most
        # max_staleness versions old; the old logprobs below are then the proximal ones of decoupled PPO)
        if pipe is not None:
            got = pipe.take(step)
            forest, progress.data_pos = got.forest, progress.data_pos + cfg.prompts_per_step
            metrics = episode_metrics(forest, got.stats) | async_metrics(got, step)
            metrics["time/rollout_wait_s"] = time.perf_counter() - t_step
        else:
            tasks = addons.tasks(
                lambda: next_tasks(cfg.env_ids, cfg.seed, progress.data_pos, cfg.prompts_per_step),
                cfg.prompts_per_step, step,
            )  # fmt: skip
            model.eval()
            with torch.no_grad(), autocast(device, cfg.bf16):
                forest, stats = roller.run(tasks, seed=cfg.seed * 100_003 + step)
            progress.data_pos += len(tasks)
            metrics = episode_metrics(forest, stats)
        forest = addons.before_credit(forest, step, metrics)  # task probe, success replay
        rows = flatten(forest)  # (env_error episodes get no row)
        rewards = leaf_rewards(forest, rows)
        zeros = [[0.0] * len(r.token_ids) for r in rows]
        cut = [bool(forest[r.tree].nodes[r.leaf].info.get("episode", {}).get("truncated")) for r in rows]
        batch = collate(rows, zeros, rewards, [True] * len(rows), policy.pad_id, cut).to(device)

        # 2. old logprobs and values (no grad), then GAE over model tokens (or turns) and whitening;
        # truncated rows bootstrap from the value after their last token, terminated ones from 0
        old_logp, old_values, last_values, ref_logp = _no_grad_pass(model, head, ref, batch, cfg, device)
        token_rewards = terminal_rewards(batch.loss_mask, batch.rewards)  # [B, T]
        if cfg.kl_in_reward and ref_logp is not None:
            kl = kl_penalty(old_logp, ref_logp, cfg.kl_estimator) * batch.loss_mask  # [B, T]
            token_rewards = token_rewards - cfg.kl_coef * kl
            metrics["losses/kl_in_reward"] = float(kl.sum() / batch.loss_mask.sum().clamp(min=1))
        bootstrap = last_values * batch.truncated  # [B]
        value_mask = batch.loss_mask  # [B, T]
        if cfg.critic == "turn":
            adv, returns, value_mask = turn_gae(
                token_rewards, old_values, batch.loss_mask, batch.turn_ids, cfg.gamma, cfg.lam, bootstrap
            )  # [B, T] x 3
        elif cfg.critic == "hiper":  # HiPER's HAE: turn GAE inside <subgoal> segments + segment GAE
            adv, returns, value_mask = hae_gae(
                token_rewards, old_values, batch.loss_mask, batch.turn_ids, row_plans(forest, rows), cfg.gamma,
                cfg.lam, cfg.hiper_lam_seg, bootstrap, cfg.hiper_omega_high, cfg.hiper_omega_low,
            )  # fmt: skip
        else:
            adv, returns = gae(token_rewards, old_values, batch.loss_mask, cfg.gamma, cfg.lam, bootstrap)
        if cfg.whiten_advantages:
            adv = masked_whiten(adv, batch.loss_mask)  # [B, T]
        batch = batch._replace(advantages=adv)
        metrics["rollout/truncated_rows"] = float(batch.truncated.sum())
        metrics["losses/value_mean"] = float(
            (old_values * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)
        )
        metrics["losses/explained_variance"] = explained_variance(
            old_values, returns, value_mask * batch.loss_mask
        )

        # 3. epochs x minibatches of clipped policy + value loss; masks and row counts are read once here
        # and the loss stats once per optimizer step (StatLog): the micro-batch loop never waits on the GPU
        mask_cpu, value_mask_cpu = batch.loss_mask.cpu(), value_mask.cpu()  # [B, T] x 2
        row_mask: list[float] = mask_cpu.sum(1).tolist()  # [B]
        row_len: list[int] = batch.attention_mask.sum(1).tolist()  # [B]
        getattr(policy, "sleep", lambda: None)()  # a colocated vLLM frees its GPU memory for the update
        model.train()
        loss_stats = StatLog()
        g = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
        t_train, trained_tokens = time.perf_counter(), 0
        addons.start_step(step)
        for _epoch in range(cfg.epochs):
            order = torch.randperm(len(rows), generator=g)
            per_mb = -(-len(rows) // cfg.minibatches)
            for mb_rows in micro_batches(len(rows), per_mb, order):
                chunks = micro_batches(
                    len(mb_rows), cfg.micro_batch_rows, mb_rows, row_len, cfg.micro_batch_tokens
                )
                denom = sum(denominator(mask_cpu[i], loss_cfg) for i in chunks)
                if denom == 0:
                    continue
                vdenom = sum(
                    denominator(value_mask_cpu[i], loss_cfg) for i in chunks
                )  # (turn critic: first tokens)
                optimizer.zero_grad(set_to_none=True)
                for idx in chunks:
                    idx_rows = idx.tolist()
                    mb = batch.select(idx, max(row_len[r] for r in idx_rows))
                    T = mb.input_ids.shape[1]
                    with autocast(device, cfg.bf16):
                        logp, ent, values = forward(
                            model,
                            mb,
                            cfg.temperature,
                            entropy=True,
                            value_head=head,
                            entropy_grad=cfg.entropy_coef > 0 or cfg.epo,  # EPO needs the entropy's gradient
                        )
                    pb = PolicyBatch(
                        logprobs=logp, old_logprobs=old_logp[idx, :T], advantages=mb.advantages, mask=mb.loss_mask,
                        rollout_logprobs=mb.rollout_logprobs, entropy=ent, turn_ids=mb.turn_ids,
                        ref_logprobs=ref_logp[idx, :T] if ref_logp is not None else None,
                    )  # fmt: skip
                    pl, st = policy_loss(pb, loss_cfg, denom)
                    pl = addons.epo_term(pl, ent, mb, sum(row_mask[r] > 0 for r in mb_rows.tolist()))
                    assert values is not None
                    vl, vst = value_loss(
                        values[:, :T],
                        old_values[idx, :T],
                        returns[idx, :T],
                        value_mask[idx, :T] * mb.loss_mask,
                        loss_cfg,
                        cfg.vf_clip or None,
                        vdenom,
                    )
                    (pl + cfg.vf_coef * vl).backward()
                    trained_tokens += sum(row_len[r] for r in idx_rows)
                    loss_stats.add(st | vst, sum(row_mask[r] for r in idx_rows))
                grad_norm = clip_gradients(trainable_parameters(model, head), cfg.grad_clip)
                optimizer.step()
                metrics["losses/grad_norm"] = loss_stats.read(grad_norm=grad_norm)[
                    "grad_norm"
                ]  # the one sync
        dist.after_update()  # fsdp2: the rollout's copy gets the new weights
        if pipe is not None:
            metrics |= pipe.publish(step)  # the worker's next generate call or engine step samples from it
        metrics |= {f"losses/{k}": v for k, v in loss_stats.means().items()} if loss_stats.weight else {}
        addons.end_step(metrics, dist.sum)
        metrics["time/train_tokens_per_s"] = trained_tokens / max(time.perf_counter() - t_train, 1e-9)
        metrics["time/step_s"] = time.perf_counter() - t_step
        progress.step = step

        # 4. evaluate, log, save
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            metrics |= held_out(step)
        log.log(step, metrics)
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            checkpoint.save(out / "checkpoint", modules, optimizer, progress, addons.state_dict())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics['charts/episode_reward']:.3f}", success=f"{metrics['charts/success']:.2f}"
            )
    if pipe is not None:
        pipe.close()
    roller.close()
    if bar is not None:
        bar.close()
    log.plot()
    log.close()
    dist.close()
    return metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked positions, as cleanrl logs it: 1 when the
    critic predicts the returns, 0 when it does no better than their mean, < 0 when worse; nan when the
    returns do not vary. values, returns, mask [B, T].

    >>> import torch
    >>> m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    >>> explained_variance(torch.tensor([[0.0, 1.0, 2.0, 9.0]]), torch.tensor([[0.0, 1.0, 2.0, 5.0]]), m)
    1.0
    >>> explained_variance(torch.ones(1, 4), torch.tensor([[0.0, 1.0, 2.0, 5.0]]), m)
    0.0
    >>> explained_variance(torch.tensor([[2.0, 1.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 2.0, 5.0]]), m)
    -3.0
    """
    n = mask.sum()
    if n < 2:
        return float("nan")
    y, r = returns[mask > 0].double(), (returns - values)[mask > 0].double()
    var_y = float(y.var(unbiased=False))
    return float("nan") if var_y == 0 else 1.0 - float(r.var(unbiased=False)) / var_y


def _no_grad_pass(
    model: Any,
    head: torch.nn.Module,
    ref: Reference | None,
    batch: TrainBatch,
    cfg: PPOConfig,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Old logprobs [B, T], old values [B, T], the value after each row's last token [B] and reference
    logprobs [B, T] of the whole batch (micro-batched)."""

    B, T = batch.input_ids.shape
    old_logp = torch.zeros(B, T, device=device)  # [B, T]
    old_values = torch.zeros(B, T, device=device)  # [B, T]
    last = torch.zeros(B, device=device)  # [B]
    ref_logp = torch.zeros(B, T, device=device) if ref is not None else None  # [B, T]
    with torch.no_grad(), autocast(device, cfg.bf16):
        # (a token budget needs the row lengths, and groups rows by them: each row's scores are its own)
        lengths = batch.attention_mask.sum(1).tolist() if cfg.micro_batch_tokens else None
        for idx in micro_batches(B, cfg.micro_batch_rows, lengths=lengths, tokens=cfg.micro_batch_tokens):
            mb = batch.select(idx)
            t = mb.input_ids.shape[1]
            logp, _, values = forward(model, mb, cfg.temperature, value_head=head)
            old_logp[idx, :t] = logp.float()
            assert values is not None
            old_values[idx, :t] = values[:, :t].float() * mb.attention_mask
            last[idx] = final_values(values.float(), mb.attention_mask)
            if ref is not None and ref_logp is not None:
                with ref.active() as ref_model:
                    ref_logp[idx, :t] = forward(ref_model, mb, cfg.temperature)[0].float()
    return old_logp, old_values, last, ref_logp
