"""GRPO (critic-free) for multi-turn tool agents on rollout trees: one config, then the loop.

Each step: draw tasks -> grow one rollout tree per task (independent samples, or branches chosen by a
branching policy) -> flatten to root-to-leaf rows -> advantages by the chosen estimator (groups = trees)
-> filters -> `epochs` x `minibatches` optimizer steps of the clipped policy loss. The config is
grpo_config.py, steps 2-3 (`credit`) grpo_credit.py, step 4 (`optimize`) grpo_update.py; docs/trainer.md
has every option, its paper, its default, and which combinations are inert.

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
9. With `max_staleness` > 0 the rollout runs ahead of the learner on a worker thread, from an actor copy of
   the weights published after each step (trainers/async_rollout.py: versions, admission, partial rollouts;
   on vLLM servers the servers hold them, trainers/async_servers.py); 0 is this loop as it always was. With
   `rollout_ranks` > 0 (torchrun) the last ranks grow the batches and receive the weights over a process
   group (trainers/async_split.py).
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from toolgym.agents.engine.select import choose_engine
from toolgym.errors import ConfigError
from toolgym.trainers import checkpoint, preemption
from toolgym.trainers.addons import AddonState
from toolgym.trainers.advantages import NodeAdv
from toolgym.trainers.async_rollout import (
    ActorWeights,
    AsyncRollout,
    async_metrics,
    rollout_side,
    start_worker,
)
from toolgym.trainers.async_split import Layout, LearnerPipe, serve
from toolgym.trainers.batch import collate
from toolgym.trainers.config import GRPO_ESTIMATORS, RunConfig, changed_fields, warn_inert
from toolgym.trainers.curriculum import CurriculumHook
from toolgym.trainers.distributed import Dist
from toolgym.trainers.episodes import episode_metrics, evaluate, next_tasks
from toolgym.trainers.gpu_memory import memory_plan
from toolgym.trainers.grpo_config import GRPOConfig  # the config (no torch); re-exported here
from toolgym.trainers.grpo_credit import credit, kl_into_rewards, kl_reward
from toolgym.trainers.grpo_update import optimize
from toolgym.trainers.igpo import igpo_advantages
from toolgym.trainers.loss import KL_SHAPING
from toolgym.trainers.metrics_log import MetricsLog
from toolgym.trainers.modeling import Reference, autocast, build_policy, make_optimizer, pick_device
from toolgym.trainers.packing import compile_decoder, update_forward, use_compile, use_packing, use_share
from toolgym.trainers.preemption import Preemption, announced
from toolgym.trainers.rollout import TreeRollout
from toolgym.trainers.saved_rollouts import save_step
from toolgym.trainers.selfplay import SelfPlayConfig, SelfPlayRollout, learner_engine_memory
from toolgym.trainers.tree import RolloutTree, Row

__all__ = [
    "GRPO_ESTIMATORS",
    "KL_SHAPING",
    "GRPOConfig",
    "changed_fields",
    "credit",
    "kl_reward",
    "optimize",
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


def seats_per_copy(cfg: GRPOConfig) -> int:
    """The policy's sequences in flight per rollout copy: its learner seats in self-play (each seat of a game
    is a sequence of its own; sized for one, the engine evicted and re-prefilled idle seats), else 1."""
    # (the selfplay options' own default, 2, when the config leaves learner_seats out: was 1)
    return SelfPlayConfig.from_dict(cfg.selfplay).learner_seats if cfg.selfplay else 1


def train(cfg: GRPOConfig, model: Any = None, tokenizer: Any = None) -> dict[str, float]:
    """Runs (or resumes) GRPO as configured; returns the last step's metrics."""
    cfg = checkpoint.resolve_resume(cfg)  # resume: auto -> whether output_dir holds a checkpoint
    with contextlib.ExitStack() as cleanup:  # a run that fails still stops its rollout worker and closes envs
        return _train(cfg, model, tokenizer, cleanup)


def _train(cfg: GRPOConfig, model: Any, tokenizer: Any, cleanup: contextlib.ExitStack) -> dict[str, float]:
    cfg.validate()
    rollout_cfg = cfg.rollout_config()
    dist = Dist.from_env(cfg.device)  # torchrun: one rank per GPU (or CPU process); else world 1
    layout = None
    if cfg.rollout_ranks:  # split layout: rollout ranks serve batches and return; learners train on theirs
        layout = Layout.join(dist, cfg)
        if layout.rollout:
            resumed = bool(cfg.resume)
            doing = "serving on until the learners have saved"
            with Preemption(resumed, lambda s: True, doing=doing, follow=True):
                try:
                    return serve(cfg, layout, model, tokenizer)
                except Exception as exc:
                    # the learners stopped (a signal, the time limit) and their connections closed: their code
                    stopped = announced()
                    if stopped is None:
                        raise
                    raise stopped from exc
        dist = layout.learner_dist()
    if cfg.prompts_per_step % dist.world:
        raise ConfigError(
            f"prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the {dist.world} ranks"
        )
    # SIGTERM/SIGINT: the checkpoint of the last completed step, then exit 143/130 (trainers/preemption.py)
    stop = cleanup.enter_context(preemption.for_run(cfg, lambda s: checkpoint.due(cfg, s)))
    if dist.main:
        warn_inert(cfg)
    device = pick_device(dist.device_name(cfg.device), cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    # fsdp2: the model is sharded, the rollout gets a full copy
    policy, model = dist.hybrid(policy, cfg, device)
    # every weight copy the run makes, the KV caches and the optimizer state in one estimate, checked now
    # (on vLLM servers the asynchronous worker needs no actor copy: the servers hold the weights)
    actor = bool(cfg.max_staleness and layout is None and not cfg.rollout_servers)
    plan = memory_plan(cfg, model, device, actor=actor, quiet=not dist.main)
    policy = choose_engine(  # our decode engine (agents/engine) over the same live weights, or HFPolicy
        policy, cfg.engine, rows=cfg.prompts_per_step // dist.world * cfg.budget * seats_per_copy(cfg),
        capacity=cfg.max_total_tokens + cfg.max_new_tokens + 8, quiet=not dist.main,
        memory=learner_engine_memory(cfg.selfplay, cfg.engine, cfg.engine_memory),  # (frozen seats: a share)
        servers=cfg.rollout_servers, weight_sync=cfg.weight_sync, sync_folder=cfg.weight_sync_folder, seed=cfg.seed,
        budget=plan.kv("learner"),
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
    if cfg.resume:  # (load reads one folder: checkpoint, or checkpoint.old after a save cut between renames)
        progress = checkpoint.load(out / "checkpoint", modules, optimizer, optional=("reference",))
        if progress.missing:
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
    gate: ActorWeights | None = None
    rollout_policy = policy
    if cfg.max_staleness and layout is None:  # asynchronous, one process: an actor copy, or vLLM servers
        if dist.world > 1:
            raise ConfigError("max_staleness > 0 under torchrun is not supported yet: run on one process")
        gate, rollout_policy = rollout_side(cfg, policy, device, progress.step, plan.kv("actor"), cleanup)
    if cfg.selfplay and (cfg.max_staleness or layout is not None):
        raise ConfigError("selfplay with max_staleness > 0 is not supported yet: self-play rolls out in step")
    roller: TreeRollout | SelfPlayRollout = (
        SelfPlayRollout(  # seats
            rollout_policy,
            rollout_cfg,
            cfg.env_kwargs,
            cfg.selfplay,
            initial=cfg.model,
            engine_memory=cfg.engine_memory,
            kv_budget=plan.kv("frozen"),
        )
        if cfg.selfplay
        else TreeRollout(
            rollout_policy, branch, rollout_cfg, cfg.env_kwargs, gate=gate, env_backend=cfg.env_backend()
        )
    )
    cleanup.callback(roller.close)  # (closing twice is harmless: the end of the run closes it too)
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
            return evaluate(
                policy, cfg.env_ids, eval_kwargs, rollout_cfg, cfg.eval_episodes, saved, cfg.env_backend()
            )

    # curves start at the initial policy (a run resumed from step 0 has that evaluation in its log already:
    # the step-0 checkpoint is written after it)
    if log is not None and cfg.eval_every and progress.step == 0 and not cfg.resume:
        log.log(0, held_out(0))

    def scorer(forest: list[RolloutTree], rows: list[Row]) -> NodeAdv:
        model.eval()
        return igpo_advantages(
            model, policy.renderer, forest, rows, policy.pad_id, device, cfg.igpo_kind,
            norm=cfg.igpo_norm, gamma=cfg.igpo_gamma,
        )  # fmt: skip

    pipe: AsyncRollout | LearnerPipe | None = None
    if layout is not None:  # the rollout ranks grow the batches (trainers/async_split.py)
        pipe = LearnerPipe(
            layout, model, first=progress.step + 1, last=cfg.steps, max_staleness=cfg.max_staleness,
            pos0=progress.data_pos, dtype=torch.bfloat16 if cfg.bf16 and device.type == "cuda" else None,
        )  # fmt: skip
    if gate is not None:  # batch s: tasks at the data position step s starts at, the synchronous seed
        assert isinstance(roller, TreeRollout)  # (self-play is refused with max_staleness above)
        pipe = start_worker(cfg, roller, gate, progress, per_rank, device, cleanup)

    for step in range(progress.step + 1, cfg.steps + 1):
        stop.check(dist, progress.step, out / "checkpoint", lambda: checkpoint.save(
            out / "checkpoint", modules, optimizer, progress, addons.state_dict()))  # fmt: skip
        t_step = time.perf_counter()
        # 1. rollout: one tree per task, drawn at the data position; refill draws again until the batch
        # holds per_rank groups that survive the filters (every rank draws as long as one needs more)
        forest: list[RolloutTree] = []
        rounds = 0
        metrics = {}
        if pipe is not None:  # asynchronous: the worker grew this step's batch (at most max_staleness old)
            got = pipe.take(step)
            forest, progress.data_pos = got.forest, progress.data_pos + cfg.prompts_per_step
            metrics = episode_metrics(forest, got.stats) | async_metrics(got, step)
            metrics["time/rollout_wait_s"] = time.perf_counter() - t_step
        while pipe is None:
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
            metrics["losses/kl_in_reward"] = kl_into_rewards(cfg, forest, model, ref, policy.pad_id, device)
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

        # 4. optimize (see `optimize`); a colocated vLLM sleeps meanwhile (its GPU memory is the update's)
        getattr(policy, "sleep", lambda: None)()
        metrics |= optimize(
            cfg, step, batch, model, trainer, optimizer, ref=ref, dist=dist, addons=addons, fwd=fwd
        )
        dist.after_update()  # fsdp2: the new weights gathered into the rollout's copy (every rank)
        if pipe is not None:
            metrics |= pipe.publish(step)  # the worker's next generate call or engine step samples from it
        metrics["time/step_s"] = time.perf_counter() - t_step
        metrics = dist.mean_metrics(metrics)  # (rank means; tokens_per_s is then per rank)
        progress.step = step
        checkpoint.save_shards(
            dist, cfg, step, out / "checkpoint", modules, optimizer, progress
        )  # fsdp2: DCP
        if not dist.main:
            continue  # rank 0 evaluates, logs and saves

        # 5. evaluate, log, save
        curriculum.end_step(metrics)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            t_eval = time.perf_counter()
            metrics |= held_out(step)
            metrics["time/eval_s"] = time.perf_counter() - t_eval
        assert log is not None
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
    if log is not None:
        log.plot()
        log.close()
    dist.barrier()
    dist.close()
    return metrics


def _progress_bar(cfg: RunConfig, done: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=done, desc="train", unit="step", dynamic_ncols=True)
