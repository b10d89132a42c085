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
3. DAPO's dynamic sampling drops groups whose advantages are all zero (on what the estimator produced,
   not on equal rewards, so turn-level estimators keep their signal). Without `refill` the step is
   smaller instead (`train/zero_variance_fraction` says by how much); with `refill` more groups are
   sampled until the batch is full or `max_gen_batches` rounds were drawn (DAPO).
4. Overlong shaping counts the whole path (prompt, turns and env messages) against `max_total_tokens`.
5. With `epochs == minibatches == 1` the old logprobs come from the same forward pass (ratio exactly 1),
   as TRL does; clipping, dual clip, AEPO clip, the two-sided clip, CISPO's cap and LLDS are then inert
   (a warning says so at start).
6. Under torchrun the loop is data parallel with DDP, not FSDP2 (distributed.py says why).
7. Episodes cut by an infrastructure fault (`truncation == "env_error"`) get no row: neither trained on
   nor counted in their group's statistics.
8. `kl_in_reward` follows verl's use_kl_in_reward for outcome estimators (the row's summed token KL,
   sampling policy vs reference, shapes its reward before the advantages), with a fixed coefficient.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgym.errors import ConfigError
from toolgym.trainers.config import AGGS, BRANCHINGS, IS_MODES, KL_ESTIMATORS, RATIO_LEVELS, RunConfig
from toolgym.trainers.seed_config import SeedMethodsConfig

if TYPE_CHECKING:
    import torch

    from toolgym.trainers.advantages import NodeAdv
    from toolgym.trainers.loss import LossConfig
    from toolgym.trainers.rollout import RolloutConfig
    from toolgym.trainers.tree import RolloutTree, Row

GRPO_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gigpo", "hgpo", "tree", "spo_std", "treerl", "treepo", "igpo",
                   "hiper")  # fmt: skip


@dataclass
class GRPOConfig(SeedMethodsConfig):  # replay, task selection, EPO, HiPER fields: seed_config.py
    # --- credit
    estimator: str = field(
        default="grpo",
        metadata={"help": "advantage estimator: " + " | ".join(GRPO_ESTIMATORS), "choices": GRPO_ESTIMATORS},
    )
    shared: str = field(
        default="repeat",
        metadata={
            "help": "a prefix shared by d rows: repeat (trained in each row with that row's advantage) | "
            "once (trained in one kept row with the mean advantage: 1/d of repeat's gradient)",
            "choices": ("repeat", "once"),
        },
    )
    grpo_scale: str = field(
        default="group",
        metadata={
            "help": "GRPO std: group (z-score) | batch (PPO-Lite) | none (Dr.GRPO)",
            "choices": ("group", "batch", "none"),
        },
    )
    igpo_kind: str = field(
        default="prob_diff",
        metadata={
            "help": "IGPO info gain: prob_diff | log_prob_diff",
            "choices": ("prob_diff", "log_prob_diff"),
        },
    )
    igpo_norm: str = field(
        default="joint",
        metadata={
            "help": "IGPO normalisation: joint (all turn rewards) | separate (IG vs outcome)",
            "choices": ("joint", "separate"),
        },
    )
    igpo_gamma: float = field(default=1.0, metadata={"help": "IGPO discount over turns"})
    gigpo_omega: float = field(default=1.0, metadata={"help": "GiGPO weight of the step-level advantage"})
    gigpo_gamma: float = field(default=0.95, metadata={"help": "GiGPO/HGPO discount of step rewards"})
    gigpo_mode: str = field(
        default="mean_norm",
        metadata={
            "help": "GiGPO/HGPO normalisation: mean_norm | mean_std_norm",
            "choices": ("mean_norm", "mean_std_norm"),
        },
    )
    gigpo_similarity: float = field(
        default=0.0,
        metadata={
            "help": "GiGPO similarity mode: difflib ratio threshold of anchor texts (0.95 usual; 0 off)"
        },
    )
    hgpo_history: int = field(default=2, metadata={"help": "HGPO: longest state history k - 1 of a group"})
    hgpo_alpha: float = field(default=1.0, metadata={"help": "HGPO level weight (k+1)^alpha"})
    hgpo_base_group: bool = field(default=False, metadata={"help": "HGPO: add the episode-level advantage"})
    treepo_weight: str = field(
        default="average",
        metadata={
            "help": "TreePO sub-group blend: average | group_size",
            "choices": ("average", "group_size"),
        },
    )
    treepo_whiten: bool = field(
        default=True, metadata={"help": "TreePO: whiten token advantages over the batch"}
    )
    entropy_advantage: float = field(
        default=0.0, metadata={"help": "AEPO entropy-aware advantage A*(1+a*z(H)); 0.2 in the paper, 0 off"}
    )
    # --- branching
    branching: str = field(
        default="none",
        metadata={
            "help": "where trees fork: none | turn_entropy | token_entropy | branching_score | fixed_segments",
            "choices": BRANCHINGS,
        },
    )
    initial_samples: int = field(
        default=0, metadata={"help": "independent samples per task before branching (0: half the budget)"}
    )
    branch_kwargs: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={"help": "extra arguments of the branching policy, e.g. {entropy_weight: 0.2}"},
    )
    # --- loss
    objective: str = field(
        default="ppo",
        metadata={"help": "policy objective: ppo (clipped surrogate) | cispo", "choices": ("ppo", "cispo")},
    )
    eps_low: float = field(default=0.2, metadata={"help": "lower clip range"})
    eps_high: float = field(default=0.28, metadata={"help": "upper clip range (clip-higher)"})
    ratio_level: str = field(
        default="token",
        metadata={"help": "importance ratio per token | sequence | turn", "choices": RATIO_LEVELS},
    )
    dual_clip: float = field(
        default=3.0, metadata={"help": "dual-clip constant for negative advantages (0: off)"}
    )
    delta: float = field(
        default=0.0,
        metadata={"help": "two-sided clip (INTELLECT-2): cap the unclipped ratio at delta (0: off)"},
    )
    cispo_max: float = field(default=5.0, metadata={"help": "CISPO: cap of the stop-gradient IS weight"})
    aepo_clip: bool = field(
        default=False, metadata={"help": "AEPO: keep gradients above the upper clip bound"}
    )
    is_mode: str = field(
        default="token_truncate",
        metadata={
            "help": "engine/trainer mismatch: none | token_truncate | token_mask | sequence_*",
            "choices": IS_MODES,
        },
    )
    is_max: float = field(default=2.0, metadata={"help": "TIS cap"})
    kl_coef: float = field(
        default=0.0, metadata={"help": "KL to the initial policy in the loss (0: no reference model)"}
    )
    kl_estimator: str = field(
        default="k3", metadata={"help": "KL estimator: k1 | k2 | k3 | k3+", "choices": KL_ESTIMATORS}
    )
    kl_in_reward: bool = field(
        default=False,
        metadata={
            "help": "KL as a reward penalty: R -= kl_coef * sum of the row's token KLs (verl) instead of a loss term"
        },
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus"})
    top_entropy_quantile: float = field(
        default=1.0,
        metadata={"help": "train only the top fraction of tokens by entropy (0.2 in the paper; 1 all)"},
    )
    llds_coef: float = field(
        default=0.0, metadata={"help": "LLDS likelihood-preserving penalty (0.2 in the paper; 0 off)"}
    )
    agg: str = field(
        default="token_mean",
        metadata={
            "help": "loss aggregation: token_mean (global) | seq_mean | constant (Dr.GRPO)",
            "choices": AGGS,
        },
    )
    # --- filters and shaping
    filter_zero_variance: bool = field(
        default=True, metadata={"help": "DAPO: groups whose advantages are all zero are left out of the loss"}
    )
    refill: bool = field(
        default=False,
        metadata={"help": "DAPO dynamic sampling: draw more groups until prompts_per_step groups are kept"},
    )
    max_gen_batches: int = field(
        default=10, metadata={"help": "refill: most rollout rounds per step (DAPO's max_num_gen_batches)"}
    )
    acc_filter_low: float = field(
        default=0.0, metadata={"help": "SimpleTIR acc_filter: drop groups with success rate below (0: off)"}
    )
    acc_filter_high: float = field(
        default=1.0, metadata={"help": "SimpleTIR acc_filter: drop groups with success rate above (1: off)"}
    )
    filter_void: bool = field(
        default=False,
        metadata={"help": "SimpleTIR: rollouts with an invalid (void) turn are left out of the loss"},
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={"help": "DAPO/TRL: truncated episodes are left out of the loss (kept in group statistics)"},
    )
    remove_clip: bool = field(
        default=False,
        metadata={
            "help": "SimpleTIR: truncated episodes are removed before the advantages (not in statistics)"
        },
    )
    overlong_buffer: int = field(
        default=0, metadata={"help": "DAPO overlong shaping buffer in tokens (0: off)"}
    )
    overlong_penalty: float = field(default=1.0, metadata={"help": "reward penalty at max_total_tokens"})
    eval_env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={"help": "gym.make keywords for evaluations on top of env_kwargs, e.g. {split: test}"},
    )

    def validate(self) -> None:
        super().validate()
        # categorical fields (metadata choices) are checked by RunConfig.validate
        if not 0.0 <= self.gigpo_similarity <= 1.0:
            raise ConfigError(f"gigpo_similarity must be in [0, 1], got {self.gigpo_similarity}")
        if not 0.0 <= self.acc_filter_low <= self.acc_filter_high <= 1.0:
            raise ConfigError("acc_filter_low <= acc_filter_high must both lie in [0, 1]")
        if self.max_gen_batches < 1 or self.hgpo_history < 0:
            raise ConfigError("max_gen_batches must be >= 1 and hgpo_history >= 0")
        if self.overlong_buffer >= self.max_total_tokens:
            raise ConfigError(f"overlong_buffer ({self.overlong_buffer}) must be < max_total_tokens")
        try:
            self.loss_config()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.branch_policy()  # unknown branching names or options are a ConfigError

    def inert_options(self) -> list[str]:
        """Options that do nothing (or clash) under the other settings; `train` warns with each."""
        out: list[str] = []
        changed = _changed(self)
        single = self.epochs * self.minibatches == 1
        if single:
            on: list[str] = [n for n in ("eps_low", "eps_high", "dual_clip", "cispo_max") if n in changed]
            on += [n for n in ("aepo_clip", "llds_coef", "delta") if getattr(self, n)]
            on += ["ratio_level"] if self.ratio_level != "token" else []
            on += ["objective=cispo"] if self.objective == "cispo" else []
            if on:
                out.append(
                    f"{', '.join(on)}: inert with one optimizer step per rollout batch (epochs = minibatches = 1: "
                    "the ratio is exactly 1, nothing is clipped and LLDS sees no drop); set minibatches or epochs > 1"
                )
        if self.objective == "cispo":
            cis: list[str] = [n for n in ("eps_low", "eps_high", "dual_clip") if n in changed]
            cis += [n for n in ("aepo_clip", "delta") if getattr(self, n)]
            if cis:
                out.append(f"{', '.join(cis)}: inert with objective=cispo (CISPO clips only the IS weight)")
        elif "cispo_max" in changed:
            out.append("cispo_max: inert unless objective=cispo")
        if self.delta and self.dual_clip and self.delta >= self.dual_clip:
            out.append(f"delta {self.delta} >= dual_clip {self.dual_clip}: the dual clip already caps lower")
        if not self.kl_coef and {"kl_estimator", "kl_in_reward"} & changed:
            out.append("kl_estimator/kl_in_reward: inert with kl_coef = 0")
        if self.shared == "once" and self.branching == "none":
            out.append("shared=once: inert without branching (independent samples share only the prompt)")
        if self.estimator in ("tree", "spo_std", "treerl", "treepo") and self.branching == "none":
            out.append(
                f"estimator={self.estimator} on unbranched trees is a plain group baseline "
                "(tree/treepo: Dr.GRPO; treerl: scaled RLOO); use a branching policy"
            )
        per_estimator = {
            "grpo": ("grpo_scale",), "igpo": ("igpo_kind", "igpo_norm", "igpo_gamma"),
            "gigpo": ("gigpo_omega", "gigpo_similarity"), "hgpo": ("hgpo_history", "hgpo_alpha", "hgpo_base_group"),
            "treepo": ("treepo_weight", "treepo_whiten"),
        }  # fmt: skip
        for est, names in per_estimator.items():
            for n in names:
                if n in changed and self.estimator != est:
                    out.append(f"{n}: inert unless estimator={est}")
        if self.estimator not in ("gigpo", "hgpo") and {"gigpo_gamma", "gigpo_mode"} & changed:
            out.append("gigpo_gamma/gigpo_mode: inert unless estimator is gigpo or hgpo")
        if self.refill and not (self.filter_zero_variance or self._acc_filter_on()):
            out.append("refill: inert without filter_zero_variance or acc_filter (no group is ever dropped)")
        if "max_gen_batches" in changed and not self.refill:
            out.append("max_gen_batches: inert unless refill")
        if self.mask_truncated_completions and self.remove_clip:
            out.append(
                "mask_truncated_completions: inert with remove_clip (truncated rows are already removed)"
            )
        if self.temperature == 0:
            out.append("temperature 0: every rollout of a group is the same greedy one (no advantage signal)")
        if self.branching == "branching_score":
            out.append(
                "branching=branching_score: APPO's likelihood gain Omega is 1 (the rollout has no older policy "
                "to compare with), so forks go to the top-entropy tokens (branching.py departure 6)"
            )
        if self.branching == "none" and "initial_samples" in changed:
            out.append("initial_samples: inert without branching")
        return out + self.seed_inert(changed)

    def _acc_filter_on(self) -> bool:
        return self.acc_filter_low > 0.0 or self.acc_filter_high < 1.0

    def loss_config(self) -> LossConfig:
        from toolgym.trainers.loss import LossConfig

        return LossConfig(
            eps_low=self.eps_low, eps_high=self.eps_high, ratio_level=self.ratio_level,  # type: ignore[arg-type]
            dual_clip=self.dual_clip or None, aepo_clip=self.aepo_clip, is_mode=self.is_mode,  # type: ignore[arg-type]
            is_max=self.is_max, kl_coef=0.0 if self.kl_in_reward else self.kl_coef,
            kl_estimator=self.kl_estimator,  # type: ignore[arg-type]
            objective=self.objective, cispo_max=self.cispo_max, delta=self.delta or None,  # type: ignore[arg-type]
            top_entropy_quantile=self.top_entropy_quantile, entropy_coef=self.entropy_coef,
            llds_coef=self.llds_coef, agg=self.agg, max_tokens=self.max_total_tokens,  # type: ignore[arg-type]
        )  # fmt: skip

    def rollout_config(self) -> RolloutConfig:
        from toolgym.trainers.rollout import RolloutConfig

        return RolloutConfig(
            budget=self.budget, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            max_total_tokens=self.max_total_tokens, entropies=self.branching in ("turn_entropy", "branching_score"),
        )  # fmt: skip

    def branch_policy(self, vocab_size: int | None = None) -> Any:
        """The branching policy; `vocab_size` makes ARPO/AEPO entropies normalised by ln|V| (as ARPO's code)."""
        from toolgym.trainers.branching import make_policy

        kwargs = dict(self.branch_kwargs)
        if self.branching != "none":
            kwargs.setdefault("initial", self.initial_samples or max(1, self.budget // 2))
        if self.branching == "turn_entropy" and vocab_size:
            kwargs.setdefault("vocab_size", vocab_size)
        return make_policy(self.branching, **kwargs)


def _changed(cfg: Any) -> set[str]:
    """Names of the fields whose value differs from the class default."""
    out = set()
    for f in dataclasses.fields(cfg):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if getattr(cfg, f.name) != default:
            out.add(f.name)
    return out


def warn_inert(cfg: Any) -> list[str]:
    """Emits one UserWarning per inert option of `cfg` (see `inert_options`); returns the messages."""
    msgs: list[str] = cfg.inert_options()
    for m in msgs:
        warnings.warn(m, UserWarning, stacklevel=3)
    return msgs


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
    rewards: list[float]
    node_adv: NodeAdv
    advantages: list[list[float]]  # [B][T] token advantages of the rows as trained
    keep: list[bool]
    dropped: dict[str, int]  # rows each filter removed (counted in order)


def credit(cfg: GRPOConfig, forest: list[RolloutTree], scorer: Any = None) -> Credit:
    """Steps 2-3 of the loop: shaped rewards, rows, advantages, filters. `scorer(forest, rows)` gives IGPO's
    node advantages (it needs the model)."""
    from toolgym.trainers.advantages import advantage_keep, estimate, token_advantages
    from toolgym.trainers.loss import accuracy_keep, overlong_penalty
    from toolgym.trainers.tree import flatten, leaf_rewards

    if cfg.overlong_buffer > 0:
        for tree in forest:
            for leaf in tree.leaves():
                if "shaped" in tree.nodes[leaf].info:
                    continue  # a tree shaped in an earlier refill round
                n = tree.nodes[leaf].info.get("episode", {}).get("tokens", 0)
                pen = overlong_penalty(n, cfg.max_total_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
                tree.set_reward(leaf, (tree.nodes[leaf].reward or 0.0) + pen)
                tree.nodes[leaf].info["shaped"] = pen
    rows = flatten(forest, "repeat", drop_truncated=cfg.remove_clip)
    rewards = leaf_rewards(forest, rows)
    if cfg.estimator == "igpo":
        node_adv = scorer(forest, rows)
    elif cfg.estimator == "hiper":
        from toolgym.trainers.hiper import hae

        node_adv = hae(forest, rows, cfg.hiper_gamma, cfg.hiper_omega_high, cfg.hiper_omega_low)
    else:
        node_adv = estimate(
            cfg.estimator, forest, rows, omega=cfg.gigpo_omega, gamma=cfg.gigpo_gamma,
            gigpo_mode=cfg.gigpo_mode, scale=cfg.grpo_scale, similarity=cfg.gigpo_similarity or None,  # type: ignore[arg-type]
            hgpo_history=cfg.hgpo_history, hgpo_alpha=cfg.hgpo_alpha, hgpo_base_group=cfg.hgpo_base_group,
            treepo_weight=cfg.treepo_weight,  # type: ignore[arg-type]
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
    rows = flatten(forest, cfg.shared, keep=keep, drop_truncated=cfg.remove_clip)  # type: ignore[arg-type]
    advantages = token_advantages(rows, node_adv, cfg.shared, keep)  # type: ignore[arg-type]
    return Credit(rows, rewards, node_adv, advantages, keep, dropped)


def train(cfg: GRPOConfig, model: Any = None, tokenizer: Any = None) -> dict[str, float]:
    """Runs (or resumes) GRPO as configured; returns the last step's metrics."""
    import torch

    from toolgym.agents.engine.select import choose_engine
    from toolgym.trainers import checkpoint
    from toolgym.trainers.advantages import entropy_scaled, masked_whiten
    from toolgym.trainers.batch import collate, forward, micro_batches
    from toolgym.trainers.distributed import Dist
    from toolgym.trainers.episodes import episode_metrics, evaluate, next_tasks
    from toolgym.trainers.igpo import igpo_advantages
    from toolgym.trainers.loss import PolicyBatch, denominator, policy_loss
    from toolgym.trainers.modeling import Reference, autocast, build_policy, pick_device, trainable_parameters
    from toolgym.trainers.rollout import TreeRollout
    from toolgym.trainers.runlog import RunLog
    from toolgym.trainers.seed_config import SeedState

    cfg.validate()
    loss_cfg, rollout_cfg = cfg.loss_config(), cfg.rollout_config()
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
    policy = choose_engine(  # our decode engine over the same live weights (issue 12), or HFPolicy
        policy, cfg.engine, rows=cfg.prompts_per_step // dist.world * cfg.budget,
        capacity=cfg.max_total_tokens + cfg.max_new_tokens + 8, quiet=not dist.main,
    )  # fmt: skip
    branch = cfg.branch_policy(vocab_size(model))
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
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
    log = (
        RunLog(out, cfg.tensorboard, resume_step=progress.step if cfg.resume else None) if dist.main else None
    )
    if dist.main:
        (out / "config.json").write_text(json.dumps({"algorithm": "grpo", **cfg.to_dict()}, indent=2))
    roller = TreeRollout(policy, branch, rollout_cfg, cfg.env_kwargs)
    seeds = SeedState(cfg, dist.world)  # replay buffer, task pool, EPO entropy band
    bar = _progress_bar(cfg, progress.step) if dist.main else None
    per_rank = cfg.prompts_per_step // dist.world
    metrics: dict[str, float] = {}
    eval_kwargs = {**cfg.env_kwargs, **cfg.eval_env_kwargs}
    if log is not None and cfg.eval_every and progress.step == 0:  # curves start at the initial policy
        model.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            log.log(0, evaluate(policy, cfg.env_ids, eval_kwargs, rollout_cfg, cfg.eval_episodes))

    def scorer(forest: list[RolloutTree], rows: list[Row]) -> NodeAdv:
        model.eval()
        return igpo_advantages(
            model, policy.renderer, forest, rows, policy.pad_id, device, cfg.igpo_kind,  # type: ignore[arg-type]
            norm=cfg.igpo_norm, gamma=cfg.igpo_gamma,  # type: ignore[arg-type]
        )  # fmt: skip

    for step in range(progress.step + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        # 1. rollout: one tree per task, drawn at the data position; refill draws again until the batch
        # holds per_rank groups that survive the filters (every rank draws as long as one needs more)
        forest: list[RolloutTree] = []
        rounds = 0
        metrics = {}
        while True:
            tasks = seeds.tasks(
                lambda: next_tasks(cfg.env_ids, cfg.seed, progress.data_pos + dist.rank * per_rank, per_rank),
                per_rank, step,
            )  # fmt: skip
            model.eval()
            with torch.no_grad(), autocast(device, cfg.bf16):
                new, stats = roller.run(
                    tasks, seed=cfg.seed * 100_003 + step + 7919 * dist.rank + 104_729 * rounds
                )
            progress.data_pos += cfg.prompts_per_step
            rounds += 1
            if cfg.kl_in_reward and ref is not None:
                metrics["train/kl_in_reward"] = _kl_into_rewards(cfg, new, model, ref, policy.pad_id, device)
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
            metrics["train/gen_batches"] = float(rounds)
            if not forest:
                forest = new  # nothing survived: train on the last round (its filters drop it again)

        forest = seeds.before_credit(forest, step, metrics)  # task probe, success replay
        # 2-3. rows, shaped rewards, advantages (groups = trees), filters
        c = credit(cfg, forest, scorer)
        rows, keep, advantages = c.rows, c.keep, c.advantages
        truncated = [
            bool(forest[r.tree].nodes[r.leaf].info.get("episode", {}).get("truncated")) for r in rows
        ]
        batch = collate(rows, advantages, c.rewards, keep, policy.pad_id, truncated).to(device)
        if cfg.estimator == "treepo" and cfg.treepo_whiten:
            batch = batch._replace(advantages=masked_whiten(batch.advantages, batch.loss_mask))
        metrics["charts/trained_reward"] = sum(c.rewards) / max(len(c.rewards), 1)  # after shaping
        metrics["train/zero_variance_fraction"] = c.dropped.get("zero_variance", 0) / max(len(rows), 1)
        for name, n in c.dropped.items():
            metrics[f"train/dropped_{name}"] = float(n)
        metrics["train/kept_rows"] = float(sum(keep))

        # 4. optimize: epochs x minibatches optimizer steps; micro-batches of a minibatch share one global
        # denominator. Several steps need the sampling policy's logprobs first (eval mode, no dropout).
        multi = cfg.epochs * cfg.minibatches > 1
        old = _old_logprobs(model, batch, cfg, device) if multi else None
        model.train()
        sums: dict[str, float] = {}
        seeds.start_step(step)
        ent_grad = cfg.entropy_coef > 0 or cfg.epo  # EPO's entropy terms need the entropy's gradient
        t_train, trained_tokens, updates = time.perf_counter(), 0, 0
        g = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
        for _epoch in range(cfg.epochs):
            order = torch.randperm(len(rows), generator=g) if cfg.minibatches > 1 else torch.arange(len(rows))
            per_mb = -(-len(rows) // cfg.minibatches)
            for mb_rows in micro_batches(len(rows), per_mb, order):
                chunks = micro_batches(len(mb_rows), cfg.micro_batch_rows, mb_rows)
                denom = dist.sum(sum(denominator(batch.loss_mask[i], loss_cfg) for i in chunks))  # all ranks
                if denom == 0:
                    continue  # nothing to learn from these rows (every group was filtered out)
                optimizer.zero_grad(set_to_none=True)
                for i, idx in enumerate(chunks):
                    mb = batch.select(idx)
                    if mb.loss_mask.sum() == 0 and dist.world == 1:
                        continue  # (under DDP every rank runs every micro-batch: the last one syncs gradients)
                    T = mb.input_ids.shape[1]
                    sync = dist.no_sync(trainer, sync=i == len(chunks) - 1)
                    with sync, autocast(device, cfg.bf16):
                        logp, ent, _ = forward(
                            trainer, mb, cfg.temperature, entropy=True, entropy_grad=ent_grad
                        )
                        ref_logp = None
                        if ref is not None:
                            with torch.no_grad(), ref.active() as ref_model:
                                ref_logp, _, _ = forward(ref_model, mb, cfg.temperature)
                    adv = mb.advantages  # [b, t]
                    if cfg.entropy_advantage and ent is not None:
                        adv = entropy_scaled(adv, ent, mb.loss_mask, cfg.entropy_advantage)
                    pb = PolicyBatch(
                        logprobs=logp, old_logprobs=old[idx, :T] if old is not None else logp.detach(),
                        advantages=adv, mask=mb.loss_mask, rollout_logprobs=mb.rollout_logprobs,
                        ref_logprobs=ref_logp, entropy=ent, turn_ids=mb.turn_ids,
                    )  # fmt: skip
                    loss, st = policy_loss(pb, loss_cfg, denom)
                    loss = seeds.epo_term(loss, ent, mb, len(mb_rows))
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
                updates += 1
                metrics["losses/grad_norm"] = float(grad_norm)
        w = sums.pop("_w", 0.0)
        metrics |= {f"losses/{k}": v / w if w else 0.0 for k, v in sums.items()}
        metrics["train/updates"] = float(updates)
        seeds.end_step(metrics)
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
                metrics |= evaluate(policy, cfg.env_ids, eval_kwargs, rollout_cfg, cfg.eval_episodes)
        assert log is not None
        log.log(step, metrics)
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            checkpoint.save(out / "checkpoint", modules, optimizer, progress)
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


def kl_reward(kl: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """verl's KL-in-reward for an outcome estimator: the row's reward changes by -coef * sum_t KL_t over its
    trained tokens (GRPO then normalises the shaped rewards). kl, mask [B, T] -> [B].

    >>> import torch
    >>> round(kl_reward(torch.tensor([[0.1, 0.2, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]), 0.5).item(), 6)
    -0.15
    """
    return -coef * (kl * mask).sum(1)


def _kl_into_rewards(
    cfg: GRPOConfig, forest: list[RolloutTree], model: Any, ref: Any, pad_id: int, device: torch.device
) -> float:
    """Shapes every leaf reward with `kl_reward` (sampling policy vs reference); returns the mean KL per token."""
    import torch

    from toolgym.trainers.batch import collate, forward, micro_batches
    from toolgym.trainers.loss import kl_penalty
    from toolgym.trainers.modeling import autocast
    from toolgym.trainers.tree import flatten

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
                leaf = forest[rows[i].tree].nodes[rows[i].leaf]
                leaf.reward = (leaf.reward or 0.0) + float(shaped[j])
            total += float((kl * mb.loss_mask).sum())
            tokens += float(mb.loss_mask.sum())
    model.train(was_training)
    return total / max(tokens, 1.0)


def _old_logprobs(model: Any, batch: Any, cfg: RunConfig, device: torch.device) -> torch.Tensor:
    """Logprobs of the policy that sampled the batch, [B, T], in eval mode (no dropout), before any update."""
    import torch

    from toolgym.trainers.batch import forward, micro_batches
    from toolgym.trainers.modeling import autocast

    B, T = batch.input_ids.shape
    out = torch.zeros(B, T, device=device)  # [B, T]
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast(device, cfg.bf16):
        for idx in micro_batches(B, cfg.micro_batch_rows):
            mb = batch.select(idx)
            out[idx, : mb.input_ids.shape[1]] = forward(model, mb, cfg.temperature)[0].float()
    model.train(was_training)
    return out


def _progress_bar(cfg: RunConfig, done: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=done, desc="train", unit="step", dynamic_ncols=True)
