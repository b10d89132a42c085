"""`GRPOConfig`: every option of GRPO on rollout trees (`toolgym train grpo`; the loop is grpo.py).

Like config.py it imports no torch, so `toolgym train grpo --help` and config checks run without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, get_args

from toolgym.errors import ConfigError
from toolgym.trainers.config import (
    BRANCHINGS,
    GRPO_ESTIMATORS,
    Branching,
    Estimator,
    GigpoMode,
    GrpoScale,
    IgpoKind,
    IgpoNorm,
    LossOptionsConfig,
    Objective,
    Packing,
    Shared,
    TreepoWeight,
    changed_fields,
    check_loss_rules,
    choices,
)
from toolgym.trainers.inert import run_inert

if TYPE_CHECKING:
    from toolgym.trainers.loss import LossConfig
    from toolgym.trainers.rollout import RolloutConfig


ROLLOUT_KEYS_HELP = {
    "help": "key every rollout turn's sampling noise by its path (seed, task, sample, branch) instead of the "
    "engine's one generator: a step's trees no longer depend on env timing, admission order or batch "
    "composition (engine fast or vllm; ~10-20% slower decode on a small model)"
}


def check_rollout_keys(cfg: Any) -> None:
    """`rollout_keys` needs an engine whose turns take a key: ours (fast; `auto` is checked when the run
    starts, trainers/rollout.py) or vLLM (a per-request seed); GRPO and PPO share this rule."""
    if cfg.rollout_keys and cfg.engine == "hf":
        raise ConfigError(
            "rollout_keys needs engine fast (our engine: keyed sampling) or vllm (a seed per request); engine hf "
            "generates in rounds from one generator, without per-sequence keys"
        )
    if cfg.rollout_keys and getattr(cfg, "selfplay", None):
        raise ConfigError("rollout_keys with selfplay is not supported yet: self-play's turns are not keyed")


def rollout_keys_inert(cfg: Any) -> list[str]:
    if cfg.rollout_keys and cfg.temperature == 0:
        return ["rollout_keys: inert with temperature 0 (greedy turns draw no noise)"]
    return []


@dataclass
class GRPOConfig(LossOptionsConfig):
    """GRPO (critic-free) on rollout trees: `toolgym train grpo`; the loop is grpo.py."""

    # --- credit
    estimator: Estimator = field(default="grpo", metadata=choices("advantage estimator", GRPO_ESTIMATORS))
    shared: Shared = field(
        default="repeat",
        metadata=choices(
            "a prefix shared by d rows: repeat (trained in each row with that row's advantage), "
            "once (trained in one kept row with the mean advantage: 1/d of repeat's gradient)",
            get_args(Shared),
        ),
    )
    grpo_scale: GrpoScale = field(
        default="group",
        metadata=choices("GRPO std: group (z-score), batch (PPO-Lite), none (Dr.GRPO)", get_args(GrpoScale)),
    )
    igpo_kind: IgpoKind = field(default="prob_diff", metadata=choices("IGPO info gain", get_args(IgpoKind)))
    igpo_norm: IgpoNorm = field(
        default="joint",
        metadata=choices(
            "IGPO normalisation: joint (all turn rewards), separate (IG vs outcome)", get_args(IgpoNorm)
        ),
    )
    igpo_gamma: float = field(default=1.0, metadata={"help": "IGPO discount over turns"})
    gigpo_omega: float = field(default=1.0, metadata={"help": "GiGPO weight of the step-level advantage"})
    gigpo_gamma: float = field(default=0.95, metadata={"help": "GiGPO/HGPO discount of step rewards"})
    gigpo_mode: GigpoMode = field(
        default="mean_norm", metadata=choices("GiGPO/HGPO normalisation", get_args(GigpoMode))
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
    treepo_weight: TreepoWeight = field(
        default="average", metadata=choices("TreePO sub-group blend", get_args(TreepoWeight))
    )
    treepo_whiten: bool = field(
        default=True, metadata={"help": "TreePO: whiten token advantages over the batch"}
    )
    entropy_advantage: float = field(
        default=0.0, metadata={"help": "AEPO entropy-aware advantage A*(1+a*z(H)); 0.2 in the paper, 0 off"}
    )
    # --- branching
    branching: Branching = field(default="none", metadata=choices("where trees fork", BRANCHINGS))
    initial_samples: int = field(
        default=0, metadata={"help": "independent samples per task before branching (0: half the budget)"}
    )
    branch_kwargs: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={"help": "extra arguments of the branching policy, e.g. {entropy_weight: 0.2}"},
    )
    # --- loss
    objective: Objective = field(
        default="ppo",
        metadata=choices("policy objective: ppo (clipped surrogate), cispo", get_args(Objective)),
    )
    delta: float = field(
        default=0.0,
        metadata={"help": "two-sided clip (INTELLECT-2): cap the unclipped ratio at delta (0: off)"},
    )
    cispo_max: float = field(default=5.0, metadata={"help": "CISPO: cap of the stop-gradient IS weight"})
    aepo_clip: bool = field(
        default=False, metadata={"help": "AEPO: keep gradients above the upper clip bound"}
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata={"help": "train only the top fraction of tokens by entropy (0.2 in the paper; 1 all)"},
    )
    llds_coef: float = field(
        default=0.0, metadata={"help": "LLDS likelihood-preserving penalty (0.2 in the paper; 0 off)"}
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
    overlong_factor: float = field(
        default=1.0,
        metadata={
            "help": "DAPO overlong shaping: the reward penalty at max_total_tokens (was overlong_penalty)"
        },
    )
    # --- asynchronous rollouts (max_staleness, async_admission: LossOptionsConfig)
    rollout_ranks: int = field(
        default=0,
        metadata={
            "help": "asynchronous rollouts under torchrun: the last this many ranks only generate (their own "
            "model copy, weights broadcast after every step), the others only train (trainers/async_split.py; "
            "0: the worker thread in the learner's process)"
        },
    )
    # --- reproducible rollouts (trainers/rollout.py, keyed sampling)
    rollout_keys: bool = field(default=False, metadata=ROLLOUT_KEYS_HELP)
    # --- update path (trainers/packing.py)
    packing: Packing = field(
        default="auto",
        metadata=choices(
            "update on packed rows (no padding) with chunked logprobs; auto: on CUDA (never under DDP)",
            get_args(Packing),
        ),
    )
    share_prefix: Packing = field(
        default="auto",
        metadata=choices(
            "packed update: run a prefix shared by rows (a group's prompt) once (trainers/prefix_share.py); "
            "auto: on CPU",
            get_args(Packing),
        ),
    )
    logprob_chunk: int = field(
        default=4096,
        metadata={"help": "packed update: tokens per LM-head chunk (float32 logits of that many)"},
    )
    compile: Packing = field(
        default="auto",
        metadata=choices(
            "torch.compile the update's decoder layers (CUDA only); auto: with the packed update on CUDA",
            get_args(Packing),
        ),
    )

    # --- curriculum (trainers/curriculum.py)
    curriculum: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "a difficulty schedule over env knobs driven by recent success, e.g. {knobs: {digits: "
            "[2, 3, 4]}, promote_at: 0.8, demote_at: 0.2} (trainers/curriculum.py; {}: off)"
        },
    )

    RENAMED: ClassVar[dict[str, str]] = {"overlong_penalty": "overlong_factor"}

    def validate(self) -> None:
        if isinstance(self.compile, bool):  # `compile: true|false` (and YAML's on/off) before auto existed
            self.compile = "on" if self.compile else "off"
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
        if self.logprob_chunk < 1:
            raise ConfigError(f"logprob_chunk must be >= 1, got {self.logprob_chunk}")
        self._check_async()
        check_rollout_keys(self)
        if self.curriculum:
            from toolgym.trainers.curriculum import parse

            # a ConfigError that names the bad key, or the env_kwargs the levels would override
            parse(self.curriculum).check_run(list(self.env_ids), dict(self.env_kwargs))
        if self.selfplay:
            from toolgym.trainers.selfplay import SelfPlayConfig

            SelfPlayConfig.from_dict(self.selfplay)  # unknown or bad options fail here, not at the first step
        check_loss_rules(self)
        self.branch_policy()  # unknown branching names or options are a ConfigError

    def inert_options(self) -> list[str]:
        """Options that do nothing (or clash) under the other settings; `train` warns with each."""
        out: list[str] = []
        changed = changed_fields(self)
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
        out += self.micro_batch_inert(changed)
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
        if self.share_prefix == "on" and self.packing == "off":
            out.append(
                "share_prefix=on: inert with packing=off (prefixes are shared only on the packed update)"
            )
        if self.selfplay and (self.branching != "none" or "initial_samples" in changed):
            out.append(
                f"branching={self.branching}: inert with selfplay (every seat's group is `budget` copies of one "
                "deal; self-play does not branch)"
            )
        elif self.branching == "none" and "initial_samples" in changed:
            out.append("initial_samples: inert without branching")
        out += rollout_keys_inert(self)
        return out + self.async_inert(changed) + self.seed_inert(changed) + run_inert(self, changed)

    def _check_async(self) -> None:
        self.check_async()
        if self.rollout_ranks < 0 or (self.rollout_ranks and not self.max_staleness):
            raise ConfigError(
                f"rollout_ranks ({self.rollout_ranks}) must be 0, or > 0 with max_staleness > 0"
            )
        if not self.max_staleness:
            return
        if self.selfplay:
            raise ConfigError(
                "selfplay with max_staleness > 0 is not supported yet: self-play rolls out in step"
            )
        if self.engine == "vllm" and self.rollout_ranks:
            raise ConfigError(
                "rollout_ranks runs our engine on rollout GPUs of the torchrun job; with vLLM the servers are "
                "the rollout GPUs: give rollout_servers and max_staleness, with rollout_ranks 0"
            )

    def _acc_filter_on(self) -> bool:
        return self.acc_filter_low > 0.0 or self.acc_filter_high < 1.0

    def loss_config(self) -> LossConfig:
        from toolgym.trainers.loss import LossConfig

        return LossConfig(
            eps_low=self.eps_low, eps_high=self.eps_high, ratio_level=self.ratio_level,
            dual_clip=self.dual_clip or None, aepo_clip=self.aepo_clip, is_mode=self.is_mode,
            is_max=self.is_max, is_min=self.is_min or None, kl_coef=0.0 if self.kl_in_reward else self.kl_coef,
            kl_estimator=self.kl_estimator,
            objective=self.objective, cispo_max=self.cispo_max, delta=self.delta or None,
            top_entropy_quantile=self.top_entropy_quantile, entropy_coef=self.entropy_coef,
            llds_coef=self.llds_coef, agg=self.agg, max_tokens=self.max_total_tokens,
        )  # fmt: skip

    def rollout_config(self) -> RolloutConfig:
        from toolgym.trainers.rollout import RolloutConfig

        return RolloutConfig(
            budget=self.budget, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            max_total_tokens=self.max_total_tokens, entropies=self.branching in ("turn_entropy", "branching_score"),
            keys=self.rollout_keys,
        )  # fmt: skip

    def branch_policy(self, vocab_size: int | None = None) -> Any:
        """The branching policy; `vocab_size` makes ARPO/AEPO entropies normalised by ln|V| (as ARPO's code)."""
        from toolgym.trainers.branching import make_branch_policy

        kwargs = dict(self.branch_kwargs)
        if self.branching != "none":
            kwargs.setdefault("initial", self.initial_samples or max(1, self.budget // 2))
        if self.branching == "turn_entropy" and vocab_size:
            kwargs.setdefault("vocab_size", vocab_size)
        return make_branch_policy(self.branching, **kwargs)
