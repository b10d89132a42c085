"""The configs of every training run: `RunConfig` (envs, model, rollout, optimizer, logging, checkpoints)
and the algorithms' `GRPOConfig` (with the add-ons' `AddonsConfig` fields) and `PPOConfig`.

This module imports no torch, so `toolgym train grpo|ppo --help` and config checks run without it; the loops
(grpo.py, ppo.py) import torch at the top. Every field carries a one-line help (`metadata["help"]`), which
`toolgym train` turns into its flags; a YAML file gives the same keys. A categorical field is typed with a
`Literal` alias below with `metadata=choices(...)`: its accepted values go to argparse (`--help` lists them)
and a config with any other value fails at construction with a ConfigError that lists them. Every other
rule is checked at construction too (`validate`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, get_args

from toolgym.agents.engine.select import check_memory
from toolgym.errors import ConfigError

if TYPE_CHECKING:
    from toolgym.trainers.loss import LossConfig
    from toolgym.trainers.rollout import RolloutConfig

C = TypeVar("C", bound="RunConfig")

# the accepted values of the categorical options, here (no torch) so configs and the CLI can list them
Engine = Literal["auto", "fast", "hf"]
RatioLevel = Literal["token", "sequence", "turn"]
KlEstimator = Literal["k1", "k2", "k3", "k3+"]
Agg = Literal["token_mean", "seq_mean", "seq_mean_token_sum", "constant"]
IsMode = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
Branching = Literal["none", "turn_entropy", "token_entropy", "branching_score", "fixed_segments"]
Estimator = Literal[
    "grpo", "dr_grpo", "rloo", "gigpo", "hgpo", "tree", "spo_std", "treerl", "treepo", "igpo", "hiper"
]
Shared = Literal["repeat", "once"]
GrpoScale = Literal["group", "batch", "none"]
IgpoKind = Literal["prob_diff", "log_prob_diff"]
IgpoNorm = Literal["joint", "separate"]
GigpoMode = Literal["mean_norm", "mean_std_norm"]
TreepoWeight = Literal["average", "group_size"]
Objective = Literal["ppo", "cispo"]
Critic = Literal["token", "turn", "hiper"]
Packing = Literal["auto", "on", "off"]

ENGINES: tuple[str, ...] = get_args(Engine)
RATIO_LEVELS: tuple[str, ...] = get_args(RatioLevel)
KL_ESTIMATORS: tuple[str, ...] = get_args(KlEstimator)
AGGS: tuple[str, ...] = get_args(Agg)
IS_MODES: tuple[str, ...] = get_args(IsMode)
BRANCHINGS: tuple[str, ...] = get_args(Branching)
GRPO_ESTIMATORS: tuple[str, ...] = get_args(Estimator)


def choices(help: str, options: tuple[str, ...]) -> dict[str, Any]:
    """The metadata of a categorical config field: its help (with the options listed) and its ``choices``
    (argparse lists them; `check_choices` enforces them when the config is built)."""
    return {"help": f"{help}: {' | '.join(options)}", "choices": options}


def check_choices(cfg: Any) -> None:
    """A ConfigError for the first categorical field whose value is not one of its choices."""
    for f in dataclasses.fields(cfg):
        options = f.metadata.get("choices")
        if options is not None and getattr(cfg, f.name) not in options:
            raise ConfigError(f"{f.name} must be one of {', '.join(options)}; got {getattr(cfg, f.name)!r}")


@dataclass
class RunConfig:
    # --- envs and data
    env_ids: list[str] = field(
        default_factory=lambda: ["toolgym/Calculator-v0"],
        metadata={"help": "env ids to train on; several are mixed round-robin"},
    )
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"prompt_format": "text"},
        metadata={"help": "keyword arguments for gym.make (every env)"},
    )
    seed: int = field(
        default=0,
        metadata={"help": "seed of task draws, sampling and branching; training seeds stay below 10**9"},
    )
    # --- model
    model: str = field(
        default="smollm2-135m",
        metadata={"help": "model: smollm2-135m (embedded), a local folder or a hub id"},
    )
    device: str = field(default="auto", metadata={"help": "cuda | cpu | auto"})
    threads: int = field(
        default=0,
        metadata={"help": "CPU threads for torch (0: torch's default; 1 is fastest on a busy machine)"},
    )
    bf16: bool = field(
        default=True, metadata={"help": "on GPU: bf16 autocast over fp32 master weights (ignored on CPU)"}
    )
    lora_r: int = field(default=0, metadata={"help": "LoRA rank (0: train all weights)"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "modules that get LoRA adapters"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in the backward pass (saves memory)"}
    )
    # --- rollout
    steps: int = field(default=20, metadata={"help": "training steps (one rollout batch each)"})
    prompts_per_step: int = field(default=4, metadata={"help": "tasks (trees) per step"})
    budget: int = field(
        default=8, metadata={"help": "complete rollouts per task (the group size; branches included)"}
    )
    max_new_tokens: int = field(default=128, metadata={"help": "tokens per model turn"})
    max_total_tokens: int = field(
        default=2048, metadata={"help": "a rollout whose next prompt is longer ends there (truncated)"}
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature for training rollouts"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling for training rollouts"})
    engine: Engine = field(
        default="auto", metadata=choices("rollout engine (auto: fast on CUDA for Llama/Qwen2)", ENGINES)
    )
    engine_memory: float = field(
        default=1 / 3,
        metadata={
            "help": "most of the free GPU memory the fast engine's KV cache takes (lower when runs share a GPU)"
        },
    )
    # --- optimization
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the gradient norm (0: off)"})
    epochs: int = field(default=1, metadata={"help": "optimization passes over each rollout batch (mu)"})
    minibatches: int = field(
        default=1,
        metadata={"help": "optimizer steps per epoch (rows split evenly; > 1 makes clipping and LLDS act)"},
    )
    micro_batch_rows: int = field(
        default=8, metadata={"help": "rows per forward/backward (gradient accumulation over the batch)"}
    )
    # --- evaluation, logging, checkpoints
    output_dir: str = field(
        default="runs/train", metadata={"help": "run folder: metrics.jsonl, tensorboard, plots, checkpoint"}
    )
    eval_every: int = field(
        default=0, metadata={"help": "evaluate on held-out seeds every N steps (0: only at the end)"}
    )
    eval_episodes: int = field(
        default=8, metadata={"help": "held-out episodes per evaluation (one greedy rollout each)"}
    )
    save_every: int = field(
        default=0, metadata={"help": "write the checkpoint every N steps (0: only at the end)"}
    )
    save_rollouts: int = field(
        default=0,
        metadata={
            "help": "GRPO: save every N-th step's rollout trees to rollouts/ for `toolgym view` (0: never)"
        },
    )
    eval_env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={"help": "gym.make keywords for evaluations on top of env_kwargs, e.g. {split: test}"},
    )
    save_evals: bool = field(
        default=False,
        metadata={"help": "write each held-out evaluation's episodes to evals/ (`toolgym view` format)"},
    )
    resume: bool = field(default=False, metadata={"help": "continue from the checkpoint in output_dir"})
    tensorboard: bool = field(default=True, metadata={"help": "also write tensorboard events"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    # old key -> new key: from_dict (YAML, CLI) still accepts the old one, with a DeprecationWarning
    RENAMED: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every rule a config must keep; subclasses extend it (and call super)."""
        check_choices(self)
        if not self.env_ids:
            raise ConfigError("env_ids is empty: name at least one env, e.g. toolgym/Calculator-v0")
        for name in (
            "steps",
            "prompts_per_step",
            "budget",
            "max_new_tokens",
            "epochs",
            "minibatches",
            "micro_batch_rows",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        check_memory(self.engine_memory)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """A config from plain keys (YAML); unknown keys are an error that lists the known ones. A renamed
        key (`RENAMED`) is accepted under its old name with a DeprecationWarning."""
        data = dict(data)
        for old, new in cls.RENAMED.items():
            if old in data:
                warnings.warn(
                    f"config key {old!r} is deprecated: it is now {new!r}", DeprecationWarning, stacklevel=2
                )
                if new in data:
                    raise ConfigError(f"give {new!r} or its old name {old!r}, not both")
                data[new] = data.pop(old)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown} for {cls.__name__}; known: {sorted(names)}")
        cfg = cls(**data)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def changed_fields(cfg: Any) -> set[str]:
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


def check_loss_rules(cfg: Any) -> None:
    """The rules of `loss.LossConfig` (which needs torch), checked here so a bad value fails at construction."""
    if cfg.eps_low < 0 or cfg.eps_high < 0:
        raise ConfigError(f"eps_low and eps_high must be >= 0, got {cfg.eps_low}, {cfg.eps_high}")
    if cfg.dual_clip and cfg.dual_clip <= 1.0:
        raise ConfigError(f"dual_clip must be > 1 (3.0 is usual) or 0 (off), got {cfg.dual_clip}")
    delta = getattr(cfg, "delta", 0.0)
    if delta and delta <= 1 + cfg.eps_high:
        raise ConfigError(f"delta must be > 1 + eps_high ({1 + cfg.eps_high}) or 0 (off), got {delta}")
    quantile = getattr(cfg, "top_entropy_quantile", 1.0)
    if not 0 < quantile <= 1:
        raise ConfigError(f"top_entropy_quantile must be in (0, 1], got {quantile}")


@dataclass
class AddonsConfig(RunConfig):
    """Fields of the add-ons: success replay + task selection, EPO, HiPER (addons.py)."""

    # --- success replay and task selection (ARPO for GUI agents)
    replay: bool = field(
        default=False,
        metadata={"help": "ARPO replay: an all-failed group gets one buffered success of its task"},
    )
    replay_per_task: int = field(default=8, metadata={"help": "replay: successes kept per task (ARPO: 8)"})
    task_pool: int = field(
        default=0,
        metadata={"help": "a finite pool of N tasks drawn cyclically, filtered by success rate (0: off)"},
    )
    task_filter_refresh: int = field(
        default=10, metadata={"help": "task selection: steps a dropped (always/never solved) task stays out"}
    )
    # --- EPO (arXiv 2509.22576)
    epo: bool = field(
        default=False,
        metadata={"help": "EPO: trajectory entropy bonus + entropy smoothing band + phase weight"},
    )
    epo_alpha: float = field(
        default=0.001, metadata={"help": "EPO: coefficient of the trajectory entropy (official code: 0.001)"}
    )
    epo_beta: float = field(
        default=1.0, metadata={"help": "EPO: smoothing penalty weight inside alpha: -alpha (H - beta w P)"}
    )
    epo_kappa_low: float = field(
        default=0.5, metadata={"help": "EPO: band low = kappa_low x the historical mean entropy"}
    )
    epo_kappa_high: float = field(
        default=1.5, metadata={"help": "EPO: band high = kappa_high x the historical mean entropy"}
    )
    epo_window: int = field(
        default=0, metadata={"help": "EPO: steps in the historical entropy mean (0: all, as the paper)"}
    )
    epo_weight_start: float = field(default=0.1, metadata={"help": "EPO: phase weight early in training"})
    epo_weight_end: float = field(default=1.0, metadata={"help": "EPO: phase weight at the last step"})
    epo_warmup: float = field(
        default=0.2, metadata={"help": "EPO: fraction of training at the start weight before the ramp"}
    )
    # --- HiPER (GRPO estimator=hiper, PPO critic=hiper)
    hiper_gamma: float = field(
        default=1.0, metadata={"help": "HiPER HAE discount over turns (GRPO; PPO uses gamma)"}
    )
    hiper_lam_seg: float = field(
        default=0.95, metadata={"help": "HiPER: GAE lambda over segments (PPO critic=hiper)"}
    )
    hiper_omega_high: float = field(default=1.0, metadata={"help": "HiPER: weight of the plan advantage"})
    hiper_omega_low: float = field(default=1.0, metadata={"help": "HiPER: weight of the execution advantage"})

    def validate(self) -> None:
        super().validate()
        for name in ("replay_per_task", "task_filter_refresh"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.epo_window < 0:
            raise ConfigError(f"epo_window must be >= 0 (0: every earlier step), got {self.epo_window}")
        if self.task_pool < 0:
            raise ConfigError(f"task_pool must be >= 0 (0: off), got {self.task_pool}")
        if not 0.0 <= self.epo_kappa_low <= 1.0 <= self.epo_kappa_high or not 0.0 <= self.epo_warmup <= 1.0:
            raise ConfigError("need 0 <= epo_kappa_low <= 1 <= epo_kappa_high and epo_warmup in [0, 1]")
        if not 0.0 < self.hiper_gamma <= 1.0 or not 0.0 <= self.hiper_lam_seg <= 1.0:
            raise ConfigError(f"hiper_gamma must be in (0, 1] and hiper_lam_seg in [0, 1], got {self.hiper_gamma}, "
                              f"{self.hiper_lam_seg}")  # fmt: skip

    def hiper_on(self) -> bool:
        """HiPER's HAE is on: GRPO `estimator=hiper`, PPO `critic=hiper`."""
        return getattr(self, "estimator", "") == "hiper" or getattr(self, "critic", "") == "hiper"

    def seed_inert(self, changed: set[str]) -> list[str]:
        """The add-on options that do nothing under the other settings."""
        out = []
        epo_opts = sorted(n for n in changed if n.startswith("epo_"))
        if epo_opts and not self.epo:
            out.append(f"{', '.join(epo_opts)}: inert unless epo")
        hip = sorted(n for n in changed if n.startswith("hiper_"))
        if hip and not self.hiper_on():
            out.append(f"{', '.join(hip)}: inert unless hiper is on (GRPO estimator=hiper, PPO critic=hiper)")
        elif "hiper_gamma" in changed and hasattr(self, "critic"):
            out.append("hiper_gamma: inert with PPO (critic=hiper discounts with gamma)")
        elif "hiper_lam_seg" in changed and not hasattr(self, "critic"):
            out.append("hiper_lam_seg: inert with GRPO (no critic: Monte-Carlo returns)")
        if "replay_per_task" in changed and not self.replay:
            out.append("replay_per_task: inert unless replay")
        if "task_filter_refresh" in changed and not self.task_pool:
            out.append("task_filter_refresh: inert unless task_pool > 0")
        if self.replay and not self.task_pool:
            out.append(
                "replay without task_pool: tasks are drawn once each (fresh seeds), so a buffered success "
                "is never replayed; set task_pool"
            )
        if self.replay and getattr(self, "refill", False):
            out.append("replay with refill: the zero-variance filter drops all-failed groups before replay")
        return out


EPS_HIGH_HELP = {"help": "upper clip range (0.28: DAPO's clip-higher)"}


@dataclass
class LossOptionsConfig(AddonsConfig):
    """The policy-loss options GRPO and PPO share (one field and one help each; `loss.LossConfig` reads them).
    GRPO adds its loss variants (objective, delta, CISPO, AEPO, LLDS, top-entropy); PPO overrides eps_high."""

    eps_low: float = field(default=0.2, metadata={"help": "lower clip range: ratio >= 1 - eps_low"})
    eps_high: float = field(default=0.28, metadata=EPS_HIGH_HELP)
    ratio_level: RatioLevel = field(
        default="token",
        metadata=choices("importance ratio per (sequence, turn: GSPO-style mean)", RATIO_LEVELS),
    )
    dual_clip: float = field(
        default=3.0, metadata={"help": "dual-clip constant for negative advantages (0: off)"}
    )
    is_mode: IsMode = field(
        default="token_truncate", metadata=choices("engine/trainer mismatch correction", IS_MODES)
    )
    is_max: float = field(default=2.0, metadata={"help": "TIS cap (upper bound of the importance weight)"})
    kl_coef: float = field(
        default=0.0,
        metadata={
            "help": "weight of the KL to the initial policy, a loss term or kl_in_reward (0: no reference)"
        },
    )
    kl_estimator: KlEstimator = field(default="k3", metadata=choices("KL estimator", KL_ESTIMATORS))
    kl_in_reward: bool = field(
        default=False,
        metadata={
            "help": "KL as a reward penalty instead of a loss term (verl): GRPO R -= kl_coef * the row's summed "
            "token KL; PPO a per-token reward -kl_coef * KL_t"
        },
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus (subtracted from the loss)"})
    agg: Agg = field(
        default="token_mean",
        metadata=choices(
            "loss aggregation (token_mean: global tokens; seq_mean: row means; seq_mean_token_sum: row sums; "
            "constant: Dr.GRPO)",
            AGGS,
        ),
    )


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
        if self.curriculum:
            from toolgym.trainers.curriculum import parse

            parse(self.curriculum)  # a ConfigError that names the bad key
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
        if self.branching == "none" and "initial_samples" in changed:
            out.append("initial_samples: inert without branching")
        return out + self.seed_inert(changed)

    def _acc_filter_on(self) -> bool:
        return self.acc_filter_low > 0.0 or self.acc_filter_high < 1.0

    def loss_config(self) -> LossConfig:
        from toolgym.trainers.loss import LossConfig

        return LossConfig(
            eps_low=self.eps_low, eps_high=self.eps_high, ratio_level=self.ratio_level,
            dual_clip=self.dual_clip or None, aepo_clip=self.aepo_clip, is_mode=self.is_mode,
            is_max=self.is_max, kl_coef=0.0 if self.kl_in_reward else self.kl_coef,
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


@dataclass
class PPOConfig(LossOptionsConfig):  # replay, task selection, EPO and HiPER (critic=hiper) too
    """PPO with a value head and GAE: `toolgym train ppo`; the loop is ppo.py. Its defaults differ from GRPO's
    (epochs 2, eps_high 0.2: symmetric clipping)."""

    epochs: int = field(default=2, metadata={"help": "optimization passes over each rollout batch"})
    critic: Critic = field(
        default="token",
        metadata=choices(
            "a value per model token (GAE over tokens), per turn (ST-PPO), or per turn with HiPER's HAE "
            "over <subgoal> segments",
            get_args(Critic),
        ),
    )
    gamma: float = field(default=1.0, metadata={"help": "GAE discount over model tokens"})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda"})
    whiten_advantages: bool = field(default=True, metadata={"help": "normalise advantages over the batch"})
    value_lr: float = field(default=1e-4, metadata={"help": "learning rate of the value head"})
    vf_coef: float = field(default=0.5, metadata={"help": "weight of the value loss"})
    vf_clip: float = field(default=0.5, metadata={"help": "value clipping around the old values (0: off)"})
    eps_high: float = field(default=0.2, metadata=EPS_HIGH_HELP)  # symmetric clipping (GRPO: 0.28)

    def validate(self) -> None:
        super().validate()
        # categorical fields (metadata choices) are checked by RunConfig.validate
        check_loss_rules(self)

    def inert_options(self) -> list[str]:
        """Options that do nothing under the other settings; `train` warns with each."""
        out: list[str] = []
        changed = changed_fields(self)
        if self.epochs * self.minibatches == 1:
            on = [n for n in ("eps_low", "eps_high", "dual_clip", "ratio_level") if n in changed]
            if on:
                out.append(
                    f"{', '.join(on)}: inert with one optimizer step per rollout batch (ratio exactly 1)"
                )
        if not self.kl_coef and ({"kl_estimator", "kl_in_reward"} & changed):
            out.append("kl_estimator/kl_in_reward: inert with kl_coef = 0")
        if self.temperature == 0:
            out.append("temperature 0: every rollout of a task is the same greedy one")
        return out + self.seed_inert(changed)

    def loss_config(self) -> LossConfig:
        from toolgym.trainers.loss import LossConfig

        return LossConfig(
            eps_low=self.eps_low, eps_high=self.eps_high, dual_clip=self.dual_clip or None,
            is_mode=self.is_mode, is_max=self.is_max, ratio_level=self.ratio_level,
            kl_coef=0.0 if self.kl_in_reward else self.kl_coef, kl_estimator=self.kl_estimator,
            entropy_coef=self.entropy_coef, agg=self.agg, max_tokens=self.max_total_tokens,
        )  # fmt: skip


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file (a ConfigError says what is wrong with it)."""
    from toolgym.optional import require

    yaml = require("yaml", why="reading a YAML config")

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return data
