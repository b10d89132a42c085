"""GRPO (critic-free) for multi-turn tool agents on rollout trees: one config, then the loop.

Each step: draw tasks -> grow one rollout tree per task (independent samples, or branches chosen by a
branching policy) -> flatten to root-to-leaf rows -> advantages by the chosen estimator (groups = trees)
-> filters -> clipped policy loss over micro-batches -> one optimizer step. See ALGORITHMS.md §9.

Departures from the papers:
1. The group is a tree: branches and global samples of one task are normalised together (ARPO's
   "soft" attribution with `shared="repeat"`, "hard" with `shared="once"`).
2. Old logprobs are the trainer's (recomputed), never the engine's; the engine/trainer mismatch is
   corrected by truncated importance sampling (token TIS, C = 2 by default) rather than assumed away.
3. DAPO's dynamic sampling drops zero-variance groups from the loss but does not sample more groups to
   refill the batch (the step is smaller instead; `train/zero_variance_fraction` says by how much).
4. Overlong shaping counts the whole path (prompt, turns and env messages) against `max_total_tokens`.
5. With `epochs == 1` the old logprobs come from the same forward pass (ratio exactly 1), as TRL does.
6. Under torchrun the loop is data parallel with DDP, not FSDP2 (distributed.py says why).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgym.errors import ConfigError
from toolgym.trainers.config import RunConfig

if TYPE_CHECKING:
    import torch

    from toolgym.trainers.loss import LossConfig
    from toolgym.trainers.rollout import RolloutConfig


@dataclass
class GRPOConfig(RunConfig):
    # --- credit
    estimator: str = field(
        default="grpo",
        metadata={"help": "advantage estimator: grpo | dr_grpo | rloo | gigpo | tree | treerl | igpo"},
    )
    shared: str = field(
        default="repeat",
        metadata={"help": "shared prefixes: repeat (in every row) | once (trained once, mean advantage)"},
    )
    igpo_kind: str = field(
        default="prob_diff", metadata={"help": "IGPO info gain: prob_diff | log_prob_diff"}
    )
    gigpo_omega: float = field(default=1.0, metadata={"help": "GiGPO weight of the step-level advantage"})
    gigpo_gamma: float = field(default=0.95, metadata={"help": "GiGPO discount of step rewards"})
    entropy_advantage: float = field(
        default=0.0, metadata={"help": "AEPO entropy-aware advantage A*(1+a*z(H)); 0.2 in the paper, 0 off"}
    )
    # --- branching
    branching: str = field(
        default="none",
        metadata={"help": "where trees fork: none | turn_entropy | token_entropy | branching_score"},
    )
    initial_samples: int = field(
        default=0, metadata={"help": "independent samples per task before branching (0: half the budget)"}
    )
    branch_kwargs: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={"help": "extra arguments of the branching policy, e.g. {entropy_weight: 0.2}"},
    )
    # --- loss
    eps_low: float = field(default=0.2, metadata={"help": "lower clip range"})
    eps_high: float = field(default=0.28, metadata={"help": "upper clip range (clip-higher)"})
    ratio_level: str = field(
        default="token", metadata={"help": "importance ratio per token | sequence | turn"}
    )
    dual_clip: float = field(
        default=3.0, metadata={"help": "dual-clip constant for negative advantages (0: off)"}
    )
    aepo_clip: bool = field(
        default=False, metadata={"help": "AEPO: keep gradients above the upper clip bound"}
    )
    is_mode: str = field(
        default="token_truncate",
        metadata={"help": "engine/trainer mismatch: none | token_truncate | token_mask | sequence_*"},
    )
    is_max: float = field(default=2.0, metadata={"help": "TIS cap"})
    kl_coef: float = field(
        default=0.0, metadata={"help": "k3 KL to the initial policy (0: no reference model)"}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus"})
    llds_coef: float = field(
        default=0.0, metadata={"help": "LLDS likelihood-preserving penalty (0.2 in the paper; 0 off)"}
    )
    agg: str = field(
        default="token_mean",
        metadata={"help": "loss aggregation: token_mean (global) | seq_mean | constant (Dr.GRPO)"},
    )
    # --- filters and shaping
    filter_zero_variance: bool = field(
        default=True, metadata={"help": "DAPO: groups whose rewards are all equal are left out of the loss"}
    )
    filter_void: bool = field(
        default=False,
        metadata={"help": "SimpleTIR: rollouts with an invalid (void) turn are left out of the loss"},
    )
    overlong_buffer: int = field(
        default=0, metadata={"help": "DAPO overlong shaping buffer in tokens (0: off)"}
    )
    overlong_penalty: float = field(default=1.0, metadata={"help": "reward penalty at max_total_tokens"})

    def loss_config(self) -> LossConfig:
        from toolgym.trainers.loss import LossConfig

        return LossConfig(
            eps_low=self.eps_low, eps_high=self.eps_high, ratio_level=self.ratio_level,  # type: ignore[arg-type]
            dual_clip=self.dual_clip or None, aepo_clip=self.aepo_clip, is_mode=self.is_mode,  # type: ignore[arg-type]
            is_max=self.is_max, kl_coef=self.kl_coef, entropy_coef=self.entropy_coef, llds_coef=self.llds_coef,
            agg=self.agg, max_tokens=self.max_total_tokens,  # type: ignore[arg-type]
        )  # fmt: skip

    def rollout_config(self) -> RolloutConfig:
        from toolgym.trainers.rollout import RolloutConfig

        return RolloutConfig(
            budget=self.budget, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            max_total_tokens=self.max_total_tokens, entropies=self.branching in ("turn_entropy", "branching_score"),
        )  # fmt: skip

    def branch_policy(self) -> Any:
        from toolgym.trainers.branching import make_policy

        kwargs = dict(self.branch_kwargs)
        if self.branching != "none":
            kwargs.setdefault("initial", self.initial_samples or max(1, self.budget // 2))
        return make_policy(self.branching, **kwargs)


def train(cfg: GRPOConfig, model: Any = None, tokenizer: Any = None) -> dict[str, float]:
    """Runs (or resumes) GRPO as configured; returns the last step's metrics."""
    import torch

    from toolgym.agents.engine.select import choose_engine
    from toolgym.trainers import checkpoint
    from toolgym.trainers.advantages import entropy_scaled, estimate, token_advantages
    from toolgym.trainers.batch import collate, forward, micro_batches
    from toolgym.trainers.distributed import Dist
    from toolgym.trainers.episodes import episode_metrics, evaluate, leaf_episodes, next_tasks
    from toolgym.trainers.igpo import igpo_advantages
    from toolgym.trainers.loss import (
        PolicyBatch,
        denominator,
        overlong_penalty,
        policy_loss,
        zero_variance_keep,
    )
    from toolgym.trainers.modeling import Reference, autocast, build_policy, pick_device, trainable_parameters
    from toolgym.trainers.rollout import TreeRollout
    from toolgym.trainers.runlog import RunLog
    from toolgym.trainers.tree import flatten, leaf_rewards

    cfg.validate()
    loss_cfg, rollout_cfg, branch = cfg.loss_config(), cfg.rollout_config(), cfg.branch_policy()
    dist = Dist.from_env(cfg.device)  # torchrun: one rank per GPU (or CPU process); else world 1
    if cfg.prompts_per_step % dist.world:
        raise ConfigError(
            f"prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the {dist.world} ranks"
        )
    device = pick_device(dist.device_name(cfg.device), cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    model = policy.model
    policy = choose_engine(  # our decode engine over the same live weights (issue 12), or HFPolicy
        policy, cfg.engine, rows=cfg.prompts_per_step // dist.world * cfg.budget,
        capacity=cfg.max_total_tokens + cfg.max_new_tokens + 8, quiet=not dist.main,
    )  # fmt: skip
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    out = Path(cfg.output_dir)
    progress = (
        checkpoint.load(out / "checkpoint", {"model": model}, optimizer)
        if cfg.resume
        else checkpoint.Progress()
    )
    trainer = dist.wrap(model, device)  # DDP under torchrun: averages gradients over ranks
    log = (
        RunLog(out, cfg.tensorboard, resume_step=progress.step if cfg.resume else None) if dist.main else None
    )
    if dist.main:
        (out / "config.json").write_text(json.dumps({"algorithm": "grpo", **cfg.to_dict()}, indent=2))
    ref = Reference(model) if cfg.kl_coef > 0 else None
    roller = TreeRollout(policy, branch, rollout_cfg, cfg.env_kwargs)
    bar = _progress_bar(cfg, progress.step) if dist.main else None
    per_rank = cfg.prompts_per_step // dist.world
    metrics: dict[str, float] = {}
    for step in range(progress.step + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        # 1. rollout: one tree per task, drawn at the data position
        tasks = next_tasks(cfg.env_ids, cfg.seed, progress.data_pos + dist.rank * per_rank, per_rank)
        model.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            forest, stats = roller.run(tasks, seed=cfg.seed * 100_003 + step + 7919 * dist.rank)
        progress.data_pos += cfg.prompts_per_step
        metrics = episode_metrics(forest, stats)

        # 2. rows, shaped rewards, advantages (groups = trees)
        rows = flatten(forest, cfg.shared)  # type: ignore[arg-type]
        if cfg.overlong_buffer > 0:
            for tree in forest:
                for leaf in tree.leaves():
                    n = tree.nodes[leaf].info.get("episode", {}).get("tokens", 0)
                    pen = overlong_penalty(n, cfg.max_total_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
                    tree.set_reward(leaf, (tree.nodes[leaf].reward or 0.0) + pen)
        rewards = leaf_rewards(forest, rows)
        metrics["charts/trained_reward"] = sum(rewards) / len(rewards)  # after shaping (what advantages see)
        if cfg.estimator == "igpo":  # turn rewards from the model's belief in the gold answer
            node_adv = igpo_advantages(
                model, policy.renderer, forest, rows, policy.pad_id, device, cfg.igpo_kind
            )
        else:
            node_adv = estimate(cfg.estimator, forest, rows, omega=cfg.gigpo_omega, gamma=cfg.gigpo_gamma)
        advantages = token_advantages(rows, node_adv, cfg.shared)  # type: ignore[arg-type]

        # 3. filters: zero-variance groups (DAPO), void rollouts (SimpleTIR)
        keep = [True] * len(rows)
        if cfg.filter_zero_variance:
            keep = zero_variance_keep(rewards, [r.tree for r in rows])
        if cfg.filter_void:
            void = [bool(e.get("void")) for e in leaf_episodes(forest)]
            keep = [k and not v for k, v in zip(keep, void, strict=True)]
        batch = collate(rows, advantages, rewards, keep, policy.pad_id).to(device)
        metrics["train/zero_variance_fraction"] = 1 - sum(
            zero_variance_keep(rewards, [r.tree for r in rows])
        ) / len(rows)
        metrics["train/kept_rows"] = float(sum(keep))

        # 4. optimize: micro-batches share one global denominator; epochs > 1 need old logprobs first
        model.train()
        chunks = micro_batches(len(rows), cfg.micro_batch_rows)
        denom = dist.sum(sum(denominator(batch.select(i).loss_mask, loss_cfg) for i in chunks))  # all ranks
        old = _old_logprobs(model, batch, chunks, cfg, device) if cfg.epochs > 1 else None
        sums: dict[str, float] = {}
        t_train, trained_tokens = time.perf_counter(), 0
        for _epoch in range(cfg.epochs):
            if denom == 0:
                break  # nothing to learn from this batch (every group had equal rewards)
            optimizer.zero_grad(set_to_none=True)
            for i, idx in enumerate(chunks):
                mb = batch.select(idx)
                if mb.loss_mask.sum() == 0 and dist.world == 1:
                    continue  # (under DDP every rank runs every micro-batch: the last one syncs gradients)
                sync = dist.no_sync(trainer, sync=i == len(chunks) - 1)
                with sync, autocast(device, cfg.bf16):
                    logp, ent, _ = forward(
                        trainer, mb, cfg.temperature, entropy=True, entropy_grad=cfg.entropy_coef > 0
                    )
                    ref_logp = None
                    if ref is not None:
                        with torch.no_grad(), ref.active() as ref_model:
                            ref_logp, _, _ = forward(ref_model, mb, cfg.temperature)
                adv = mb.advantages  # [b, t]
                if cfg.entropy_advantage and ent is not None:
                    adv = entropy_scaled(adv, ent, mb.loss_mask, cfg.entropy_advantage)
                pb = PolicyBatch(
                    logprobs=logp, old_logprobs=old[i] if old is not None else logp.detach(), advantages=adv,
                    mask=mb.loss_mask, rollout_logprobs=mb.rollout_logprobs, ref_logprobs=ref_logp, entropy=ent,
                    turn_ids=mb.turn_ids,
                )  # fmt: skip
                loss, st = policy_loss(pb, loss_cfg, denom)
                with dist.no_sync(trainer, sync=i == len(chunks) - 1):
                    (loss * dist.world).backward()
                w = float(mb.loss_mask.sum())
                trained_tokens += int(mb.attention_mask.sum())
                for k, v in st.items():
                    sums[k] = sums.get(k, 0.0) + v * w
                sums["_w"] = sums.get("_w", 0.0) + w
            grad_norm = torch.nn.utils.clip_grad_norm_(
                trainable_parameters(model), cfg.grad_clip or float("inf")
            )
            optimizer.step()
            metrics["losses/grad_norm"] = float(grad_norm)
        w = sums.pop("_w", 0.0)
        metrics |= {f"losses/{k}": v / w if w else 0.0 for k, v in sums.items()}
        metrics["train/tokens_per_s"] = trained_tokens / max(time.perf_counter() - t_train, 1e-9)
        metrics["time/step_s"] = time.perf_counter() - t_step
        metrics = dist.mean_metrics(metrics)  # (rank means; tokens_per_s is then per rank)
        progress.step = step
        if not dist.main:
            continue  # rank 0 evaluates, logs and saves

        # 5. evaluate, log, save
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            model.eval()
            with torch.no_grad(), autocast(device, cfg.bf16):
                metrics |= evaluate(policy, cfg.env_ids, cfg.env_kwargs, rollout_cfg, cfg.eval_episodes)
        assert log is not None
        log.log(step, metrics)
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            checkpoint.save(out / "checkpoint", {"model": model}, optimizer, progress)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics['charts/episode_reward']:.3f}", success=f"{metrics['charts/success']:.2f}"
            )
    roller.close()
    if bar is not None:
        bar.close()
    if log is not None:
        log.plot()
        log.close()
    dist.barrier()
    dist.close()
    return metrics


def _old_logprobs(
    model: Any, batch: Any, chunks: list[torch.Tensor], cfg: RunConfig, device: torch.device
) -> list[torch.Tensor]:
    """Logprobs of the policy that sampled the batch, per micro-batch (for epochs > 1)."""
    import torch

    from toolgym.trainers.batch import forward
    from toolgym.trainers.modeling import autocast

    out = []
    with torch.no_grad(), autocast(device, cfg.bf16):
        for idx in chunks:
            out.append(forward(model, batch.select(idx), cfg.temperature)[0].detach())
    return out


def _progress_bar(cfg: RunConfig, done: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=done, desc="train", unit="step", dynamic_ncols=True)
