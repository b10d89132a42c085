"""GRPO (critic-free) for multi-turn tool agents on rollout trees: one config, then the loop.

Each step: draw tasks -> grow one rollout tree per task (independent samples, or branches chosen by a
branching policy) -> flatten to root-to-leaf rows -> advantages by the chosen estimator (groups = trees)
-> filters -> `epochs` x `minibatches` optimizer steps of the clipped policy loss. See docs/trainer.md
and docs/trainer.md (every option, its paper, its default, and which combinations are inert).

Departures from the papers:
1. The group is a tree: branches and global samples of one task are normalised together (ARPO's
   "soft" attribution with `shared="repeat"`, "hard" with `shared="once"`; tree.py says exactly how).
2. Old logprobs are the trainer's (recomputed in eval mode), never the engine's; the engine/trainer
   mismatch is corrected by truncated importance sampling (token TIS, C = 2 by default).
3. DAPO's dynamic sampling drops groups whose advantages are all zero (on what the estimator produced
   from the outcome rewards, before shaping: DAPO filters on accuracy; turn-level estimators keep their
   signal from groups with equal outcomes). Without `refill` the step is
   smaller instead (`rollout/zero_variance_fraction` says by how much); with `refill` more groups are
   sampled until the batch is full or `max_gen_batches` rounds were drawn (DAPO).
4. Overlong shaping counts the whole path (prompt, turns and env messages) against `max_total_tokens`.
5. With `epochs == minibatches == 1` the old logprobs come from the same forward pass (ratio exactly 1),
   as TRL does; clipping, dual clip, AEPO clip, the two-sided clip, CISPO's cap and LLDS are then inert
   (a warning says so at start). Otherwise too the first minibatch of the first epoch takes its own
   logprobs as the old ones (the policy has not moved yet; the eval pass differs by rounding, which
   LLDS's gate would take for a likelihood drop); later minibatches read the eval pass.
6. Under torchrun the loop is data parallel with DDP, not FSDP2 (distributed.py says why).
7. Episodes cut by an infrastructure fault (`truncation == "env_error"`) get no row: neither trained on
   nor counted in their group's statistics.
8. `kl_in_reward` follows verl's use_kl_in_reward (the row's summed token KL, sampling policy vs
   reference, times -kl_coef), with a fixed coefficient, but as shaping: like DAPO's overlong shaping it
   is added to every estimator's advantage centred on the group and unscaled, not z-scored with the
   outcome (verl normalises the shaped reward, so an all-failed group's KL noise became +-1 advantages).
   It is computed after success replay, so a replayed row is shaped as its siblings.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolgym.agents.engine.select import choose_engine
from toolgym.errors import ConfigError
from toolgym.trainers import checkpoint
from toolgym.trainers.addons import AddonState
from toolgym.trainers.advantages import (
    NodeAdv,
    advantage_keep,
    entropy_scaled,
    estimate,
    leaf_to_nodes,
    masked_whiten,
    token_advantages,
)
from toolgym.trainers.batch import HostMasks, TrainBatch, collate, forward, micro_batches, to_device
from toolgym.trainers.config import GRPO_ESTIMATORS, RunConfig, changed_fields, warn_inert
from toolgym.trainers.curriculum import CurriculumHook
from toolgym.trainers.distributed import Dist
from toolgym.trainers.episodes import episode_metrics, evaluate, next_tasks
from toolgym.trainers.grpo_config import GRPOConfig  # the config (no torch); re-exported here
from toolgym.trainers.igpo import igpo_advantages
from toolgym.trainers.loss import (
    KL_SHAPING,
    PolicyBatch,
    StatLog,
    accuracy_keep,
    denominator,
    kl_penalty,
    overlong_shaping,
    policy_loss,
)
from toolgym.trainers.metrics_log import MetricsLog
from toolgym.trainers.modeling import (
    Reference,
    autocast,
    build_policy,
    make_optimizer,
    pick_device,
    trainable_parameters,
)
from toolgym.trainers.packing import (
    Forward,
    compile_decoder,
    update_forward,
    use_compile,
    use_packing,
    use_share,
)
from toolgym.trainers.rollout import TreeRollout
from toolgym.trainers.saved_rollouts import save_step
from toolgym.trainers.tree import RolloutTree, Row, flatten, leaf_rewards

__all__ = [
    "GRPO_ESTIMATORS",
    "KL_SHAPING",
    "GRPOConfig",
    "changed_fields",
    "credit",
    "kl_reward",
    "train",
    "warn_inert",
]


def vocab_size(model: Any) -> int | None:
    """Size of the model's output distribution (the |V| of entropy normalisation)."""
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and hasattr(emb, "weight"):
        return int(emb.weight.shape[0])
    conf = getattr(model, "config", None)
    return getattr(conf, "vocab_size", None)


@dataclass
class Credit:
    """Rows (loss masks as trained), rewards, advantages and filter flags of one forest."""

    rows: list[Row]
    rewards: list[float]  # outcome + shaping of each row (what `charts/trained_reward` averages)
    node_adv: NodeAdv  # the estimator's, on the outcome rewards (shaping not included)
    advantages: list[list[float]]  # [B][T] token advantages of the rows as trained (shaping included)
    keep: list[bool]
    dropped: dict[str, int]  # rows each filter removed (counted in order)
    # [B][T] 1 on every model token of a kept row, or None when that is the loss mask: with shared="once" a
    # row's loss mask lacks the shared nodes another row trains, while EPO's trajectory entropy reads all
    # its turns
    turn_masks: list[list[int]] | None = None


def shaping(cfg: GRPOConfig, tree: RolloutTree, leaf: int) -> float:
    """The reward change of a leaf that is not its outcome: DAPO's overlong shaping and the KL in reward."""
    out = float(tree.nodes[leaf].info.get(KL_SHAPING, 0.0))
    if cfg.overlong_buffer > 0:
        n = tree.nodes[leaf].info.get("episode", {}).get("tokens", 0)
        out += overlong_shaping(n, cfg.max_total_tokens, cfg.overlong_buffer, cfg.overlong_factor)
    return out


def centred(values: list[float], groups: list[int]) -> list[float]:
    """Each value minus its group's mean (no scaling).

    >>> centred([-1.0, 0.0, 0.0, 0.0, 2.0], [0, 0, 0, 0, 1])
    [-0.75, 0.25, 0.25, 0.25, 0.0]
    """
    sums: dict[int, list[float]] = {}
    for v, g in zip(values, groups, strict=True):
        sums.setdefault(g, []).append(v)
    return [v - sum(sums[g]) / len(sums[g]) for v, g in zip(values, groups, strict=True)]


def credit(cfg: GRPOConfig, forest: list[RolloutTree], scorer: Any = None) -> Credit:
    """Steps 2-3 of the loop: rows, advantages, filters, shaping. `scorer(forest, rows)` gives IGPO's node
    advantages (it needs the model).

    The estimator sees the outcome rewards only, and the filters act on what it produced (DAPO's dynamic
    sampling filters on accuracy, not on the shaped score). Shaping (overlong, KL in reward) is added after,
    centred on the group mean and never scaled: an overlong row loses its penalty in reward units whatever
    the spread of its group's outcomes (docs/trainer.md, "Shaping and the group normalisation")."""

    rows = flatten(forest, "repeat", drop_truncated=cfg.remove_clip)
    outcomes = leaf_rewards(forest, rows)
    shaped = [shaping(cfg, forest[r.tree], r.leaf) for r in rows]
    rewards = [o + s for o, s in zip(outcomes, shaped, strict=True)]
    if cfg.estimator == "igpo":
        node_adv = scorer(forest, rows)
    elif cfg.estimator == "hiper":
        from toolgym.trainers.hiper import hae

        node_adv = hae(forest, rows, cfg.hiper_gamma, cfg.hiper_omega_high, cfg.hiper_omega_low)
    else:
        node_adv = estimate(
            cfg.estimator, forest, rows, omega=cfg.gigpo_omega, gamma=cfg.gigpo_gamma,
            gigpo_mode=cfg.gigpo_mode, scale=cfg.grpo_scale, similarity=cfg.gigpo_similarity or None,
            hgpo_history=cfg.hgpo_history, hgpo_alpha=cfg.hgpo_alpha, hgpo_base_group=cfg.hgpo_base_group,
            treepo_weight=cfg.treepo_weight,
        )  # fmt: skip
    advantages = token_advantages(rows, node_adv)
    groups = [r.tree for r in rows]
    episodes = [forest[r.tree].nodes[r.leaf].info.get("episode", {}) for r in rows]
    keep = [True] * len(rows)
    dropped: dict[str, int] = {}

    def apply(name: str, flags: list[bool]) -> None:
        dropped[name] = sum(k and not f for k, f in zip(keep, flags, strict=True))
        keep[:] = [k and f for k, f in zip(keep, flags, strict=True)]

    if cfg.filter_zero_variance:
        apply("zero_variance", advantage_keep(advantages, groups))
    if cfg._acc_filter_on():
        success = [bool(e.get("success")) for e in episodes]
        apply("accuracy", accuracy_keep(success, groups, cfg.acc_filter_low, cfg.acc_filter_high))
    if cfg.filter_void:
        apply("void", [not e.get("void") for e in episodes])
    if cfg.mask_truncated_completions:
        apply("truncated", [not e.get("truncated") for e in episodes])
    # the loss masks as trained: filtered rows train nothing; with shared="once" each shared node is
    # trained once, by the first kept row that holds it, with the mean advantage of the kept rows
    turn_masks = None
    if cfg.shared == "once":
        turn_masks = [
            r.loss_mask for r in flatten(forest, "repeat", keep=keep, drop_truncated=cfg.remove_clip)
        ]
    rows = flatten(forest, cfg.shared, keep=keep, drop_truncated=cfg.remove_clip)
    advantages = token_advantages(rows, node_adv, cfg.shared, keep)
    if cfg.estimator == "treepo" and cfg.treepo_whiten:  # TreePO whitens the trained tokens over the batch
        advantages = _whiten(advantages, [r.loss_mask for r in rows])
    if any(shaped):
        extra = token_advantages(rows, leaf_to_nodes(forest, rows, centred(shaped, groups)), cfg.shared, keep)
        advantages = [
            [a + b for a, b in zip(x, y, strict=True)] for x, y in zip(advantages, extra, strict=True)
        ]
    return Credit(rows, rewards, node_adv, advantages, keep, dropped, turn_masks)


def _whiten(advantages: list[list[float]], masks: list[list[int]]) -> list[list[float]]:
    """`masked_whiten` over the masked tokens of every row (ragged rows). [B][T] -> [B][T]. In float64: with
    equal advantages (std 0) float32's rounding of the mean, ~1e-8, divided by eps 1e-8 gave values near 1."""
    T = max((len(a) for a in advantages), default=0)
    x = torch.zeros((len(advantages), T), dtype=torch.float64)  # [B, T]
    m = torch.zeros((len(advantages), T), dtype=torch.float64)  # [B, T]
    for i, (a, k) in enumerate(zip(advantages, masks, strict=True)):
        x[i, : len(a)] = torch.tensor(a, dtype=torch.float64)
        m[i, : len(k)] = torch.tensor(k, dtype=torch.float64)
    w = masked_whiten(x, m)  # [B, T]
    return [w[i, : len(a)].tolist() for i, a in enumerate(advantages)]


def train(cfg: GRPOConfig, model: Any = None, tokenizer: Any = None) -> dict[str, float]:
    """Runs (or resumes) GRPO as configured; returns the last step's metrics."""

    cfg.validate()
    rollout_cfg = cfg.rollout_config()
    dist = Dist.from_env(cfg.device)  # torchrun: one rank per GPU (or CPU process); else world 1
    if cfg.prompts_per_step % dist.world:
        raise ConfigError(
            f"prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the {dist.world} ranks"
        )
    if dist.main:
        warn_inert(cfg)
    device = pick_device(dist.device_name(cfg.device), cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    model = policy.model
    policy = choose_engine(  # our decode engine (agents/engine) over the same live weights, or HFPolicy
        policy, cfg.engine, rows=cfg.prompts_per_step // dist.world * cfg.budget,
        capacity=cfg.max_total_tokens + cfg.max_new_tokens + 8, quiet=not dist.main, memory=cfg.engine_memory,
    )  # fmt: skip
    branch = cfg.branch_policy(vocab_size(model))
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)  # fused AdamW on CUDA
    out = Path(cfg.output_dir)
    # the KL reference is the initial policy: copied before a checkpoint is loaded, and saved with it
    ref = Reference(model) if cfg.kl_coef > 0 else None
    modules: dict[str, Any] = {"model": model}
    if ref is not None and ref.frozen is not None:
        modules["reference"] = ref.frozen
    progress = checkpoint.Progress()
    if cfg.resume:
        folder = out / "checkpoint"
        present = {k: m for k, m in modules.items() if k == "model" or (folder / f"{k}.pt").is_file()}
        progress = checkpoint.load(folder, present, optimizer)
        if len(present) < len(modules):
            warnings.warn(
                "the checkpoint holds no KL reference (it was saved with kl_coef = 0): the reference is the "
                f"model {cfg.model!r} as loaded now",
                UserWarning,
                stacklevel=2,
            )
    trainer = dist.wrap(model, device)  # DDP under torchrun: averages gradients over ranks
    # the update's forward: packed rows + chunked logprobs (trainers/packing.py), or the padded one
    packed = use_packing(cfg.packing, trainer, device, quiet=not dist.main)
    compiled = use_compile(cfg.compile, packed, device)
    fwd = update_forward(packed, cfg.logprob_chunk, use_share(cfg.share_prefix, packed, device), compiled)
    if compiled:  # the policy's layers and the frozen reference's (its pass is a fifth of the update's FLOPs)
        compile_decoder(model, ref.frozen if ref is not None else None)
    log = (
        MetricsLog(out, cfg.tensorboard, resume_step=progress.step if cfg.resume else None)
        if dist.main
        else None
    )
    if dist.main:
        (out / "config.json").write_text(json.dumps({"algorithm": "grpo", **cfg.to_dict()}, indent=2))
    roller = TreeRollout(policy, branch, rollout_cfg, cfg.env_kwargs)
    addons = AddonState(cfg, dist.world)  # replay buffer, task pool, EPO entropy band
    if cfg.resume:  # the add-ons continue where the checkpoint left them
        addons.load_state_dict(progress.extra)
    curriculum = CurriculumHook(cfg, addons.selector, dist.world)  # levels of env knobs (a no-op when off)
    bar = _progress_bar(cfg, progress.step) if dist.main else None
    per_rank = cfg.prompts_per_step // dist.world
    metrics: dict[str, float] = {}
    eval_kwargs = {**cfg.env_kwargs, **cfg.eval_env_kwargs}

    def held_out(step: int) -> dict[str, float]:
        model.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            saved = (out, step) if cfg.save_evals else None
            return evaluate(policy, cfg.env_ids, eval_kwargs, rollout_cfg, cfg.eval_episodes, saved)

    if log is not None and cfg.eval_every and progress.step == 0:  # curves start at the initial policy
        log.log(0, held_out(0))

    def scorer(forest: list[RolloutTree], rows: list[Row]) -> NodeAdv:
        model.eval()
        return igpo_advantages(
            model, policy.renderer, forest, rows, policy.pad_id, device, cfg.igpo_kind,
            norm=cfg.igpo_norm, gamma=cfg.igpo_gamma,
        )  # fmt: skip

    for step in range(progress.step + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        # 1. rollout: one tree per task, drawn at the data position; refill draws again until the batch
        # holds per_rank groups that survive the filters (every rank draws as long as one needs more)
        forest: list[RolloutTree] = []
        rounds = 0
        metrics = {}
        while True:
            tasks = addons.tasks(
                lambda: next_tasks(cfg.env_ids, cfg.seed, progress.data_pos + dist.rank * per_rank, per_rank),
                per_rank, step,
            )  # fmt: skip
            tasks = curriculum.assign(tasks)
            model.eval()
            with torch.no_grad(), autocast(device, cfg.bf16):
                new, stats = roller.run(
                    tasks, seed=cfg.seed * 100_003 + step + 7919 * dist.rank + 104_729 * rounds
                )
            curriculum.observe(new)
            progress.data_pos += cfg.prompts_per_step
            rounds += 1
            if rounds == 1:
                metrics = episode_metrics(new, stats) | metrics
            if not cfg.refill:
                forest = new
                break
            c = credit(cfg, new, scorer)
            live = {r.tree for r, k in zip(c.rows, c.keep, strict=True) if k}
            forest += [t for i, t in enumerate(new) if i in live]
            need = float(len(forest) < per_rank and rounds < cfg.max_gen_batches)
            if dist.sum(need) == 0:
                break
        if cfg.refill:
            forest = forest[:per_rank]
            metrics["rollout/gen_batches"] = float(rounds)
            if not forest:
                forest = new  # nothing survived: train on the last round (its filters drop it again)

        forest = addons.before_credit(forest, step, metrics)  # task probe, success replay
        if cfg.kl_in_reward and ref is not None:  # after replay: a replayed leaf is shaped as its siblings
            metrics["losses/kl_in_reward"] = _kl_into_rewards(cfg, forest, model, ref, policy.pad_id, device)
        # 2-3. rows, shaped rewards, advantages (groups = trees), filters
        c = credit(cfg, forest, scorer)
        rows, keep, advantages = c.rows, c.keep, c.advantages
        if cfg.save_rollouts and dist.main and step % cfg.save_rollouts == 0:  # for `toolgym view`
            save_step(out, step, forest, rows, c.node_adv, keep, policy.renderer.decode)
        truncated = [
            bool(forest[r.tree].nodes[r.leaf].info.get("episode", {}).get("truncated")) for r in rows
        ]
        batch = collate(rows, advantages, c.rewards, keep, policy.pad_id, truncated, c.turn_masks).to(device)
        metrics["charts/trained_reward"] = sum(c.rewards) / max(len(c.rewards), 1)  # after shaping
        metrics["rollout/zero_variance_fraction"] = c.dropped.get("zero_variance", 0) / max(len(rows), 1)
        for name, n in c.dropped.items():
            metrics[f"rollout/dropped_{name}"] = float(n)
        metrics["rollout/kept_rows"] = float(sum(keep))

        # 4. optimize (see `optimize`)
        metrics |= optimize(
            cfg, step, batch, model, trainer, optimizer, ref=ref, dist=dist, addons=addons, fwd=fwd
        )
        metrics["time/step_s"] = time.perf_counter() - t_step
        metrics = dist.mean_metrics(metrics)  # (rank means; tokens_per_s is then per rank)
        progress.step = step
        if not dist.main:
            continue  # rank 0 evaluates, logs and saves

        # 5. evaluate, log, save
        curriculum.end_step(metrics)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            metrics |= held_out(step)
        assert log is not None
        log.log(step, metrics)
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            checkpoint.save(out / "checkpoint", modules, optimizer, progress, addons.state_dict())
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
        for mb_index, mb_rows in enumerate(micro_batches(n_rows, per_mb, order)):
            # before the first optimizer step the policy is the sampling one: its own logprobs are the old
            # ones, exactly (the eval pass differs by rounding, ~1e-7, which would fire LLDS's gate)
            fresh = old is None or (epoch == 0 and mb_index == 0)
            chunks = micro_batches(len(mb_rows), cfg.micro_batch_rows, mb_rows, row_len)
            denom = dist.sum(sum(denominator(mask_cpu[i], loss_cfg) for i in chunks))  # all ranks
            # EPO's mean is over the minibatch's rows that train, on all ranks
            epo_rows = sum(epo_live[r] for r in mb_rows.tolist()) if cfg.epo else 0
            epo_rows = int(dist.sum(float(epo_rows))) if cfg.epo else 0
            if denom == 0 and epo_rows == 0:
                continue  # nothing to learn from these rows (every group was filtered out)
            optimizer.zero_grad(set_to_none=True)
            for i, idx in enumerate(chunks):
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
            grad_norm = torch.nn.utils.clip_grad_norm_(
                trainable_parameters(model), cfg.grad_clip or float("inf")
            )
            optimizer.step()
            updates += 1
            metrics["losses/grad_norm"] = stats.read(grad_norm=grad_norm)["grad_norm"]  # the step's one sync
    metrics |= {f"losses/{k}": v for k, v in stats.means().items()}
    metrics["losses/updates"] = float(updates)
    addons.end_step(metrics)
    metrics["time/train_tokens_per_s"] = trained_tokens / max(time.perf_counter() - t_train, 1e-9)
    return metrics


def kl_reward(kl: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """verl's KL-in-reward for an outcome estimator: the row's reward changes by -coef * sum_t KL_t over its
    model tokens (`credit` adds it, centred on the group, to the advantages). kl, mask [B, T] -> [B].

    >>> import torch
    >>> round(kl_reward(torch.tensor([[0.1, 0.2, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]), 0.5).item(), 6)
    -0.15
    """
    return -coef * (kl * mask).sum(1)


def _kl_into_rewards(
    cfg: GRPOConfig, forest: list[RolloutTree], model: Any, ref: Any, pad_id: int, device: torch.device
) -> float:
    """Records every leaf's `kl_reward` (sampling policy vs reference) as its `KL_SHAPING`, which `credit`
    adds to its advantage; returns the mean KL per token."""

    rows = flatten(forest)
    if not rows:
        return 0.0
    batch = collate(
        rows, [[0.0] * len(r.token_ids) for r in rows], [0.0] * len(rows), [True] * len(rows), pad_id
    )
    batch = batch.to(device)
    total, tokens = 0.0, 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast(device, cfg.bf16):
        for idx in micro_batches(len(rows), cfg.micro_batch_rows):
            mb = batch.select(idx)
            logp = forward(model, mb, cfg.temperature)[0].float()
            with ref.active() as ref_model:
                ref_logp = forward(ref_model, mb, cfg.temperature)[0].float()
            kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)  # [b, t]
            shaped = kl_reward(kl, mb.loss_mask, cfg.kl_coef)  # [b]
            for j, i in enumerate(idx.tolist()):
                forest[rows[i].tree].nodes[rows[i].leaf].info[KL_SHAPING] = float(shaped[j])
            total += float((kl * mb.loss_mask).sum())
            tokens += float(mb.loss_mask.sum())
    model.train(was_training)
    return total / max(tokens, 1.0)


def _old_logprobs(
    model: Any, batch: Any, cfg: RunConfig, device: torch.device, fwd: Forward = forward,
    lengths: list[int] | None = None, masks: HostMasks | None = None,
) -> torch.Tensor:  # fmt: skip
    """Logprobs of the policy that sampled the batch, [B, T], in eval mode (no dropout), before any update."""

    B, T = batch.input_ids.shape
    out = torch.zeros(B, T, device=device)  # [B, T]
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast(device, cfg.bf16):
        for idx in micro_batches(B, cfg.micro_batch_rows, lengths=lengths):
            t = max(lengths[i] for i in idx.tolist()) if lengths else None
            host = HostMasks(*(m[idx, :t] for m in masks)) if masks is not None else None
            idx = to_device(idx, device)
            mb = batch.select(idx, t)
            out[idx, : mb.input_ids.shape[1]] = fwd(model, mb, cfg.temperature, host=host)[0].float()
    model.train(was_training)
    return out


def _progress_bar(cfg: RunConfig, done: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=done, desc="train", unit="step", dynamic_ncols=True)
