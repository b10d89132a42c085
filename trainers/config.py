"""What every training run's config shares: `RunConfig` (envs, model, rollout, optimizer, logging,
checkpoints), the add-ons' `AddonsConfig`, the policy-loss options `LossOptionsConfig`, the categorical
options' choices and `load_yaml`. The algorithms' configs extend them: `GRPOConfig` (grpo_config.py) and
`PPOConfig` (ppo_config.py).

These modules import no torch, so `toolgym train grpo|ppo --help` and config checks run without it; the
loops (grpo.py, ppo.py) import torch at the top. Every field carries a one-line help (`metadata["help"]`),
which `toolgym train` turns into its flags; a YAML file gives the same keys. A categorical field is typed with a
`Literal` alias below with `metadata=choices(...)`: its accepted values go to argparse (`--help` lists them)
and a config with any other value fails at construction with a ConfigError that lists them. Every other
rule is checked at construction too (`validate`).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, get_args

from toolgym.agents.engine.select import check_memory
from toolgym.errors import ConfigError

if TYPE_CHECKING:
    from toolgym.ray_envs import RaySpec

C = TypeVar("C", bound="RunConfig")

# the accepted values of the categorical options, here (no torch) so configs and the CLI can list them
Engine = Literal["auto", "fast", "hf", "vllm"]
WeightSync = Literal["auto", "nccl", "disk", "none"]
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
Admission = Literal["batch", "tree"]  # asynchronous rollouts: what the staleness bound admits at once

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


def parse_time_limit(value: float | str | None) -> float | None:
    """Seconds from a time limit written as seconds (``5400``, ``"5400"``) or as SLURM writes one
    (``"1:30:00"``, ``"90:00"`` as MM:SS, ``"2-00:00:00"``, ``"2-12"`` as D-HH); ``None``/``""``/``"none"``/0: no limit.

    >>> parse_time_limit("1:30:00"), parse_time_limit("90:00"), parse_time_limit("1-00:00:00"), parse_time_limit(60)
    (5400.0, 5400.0, 86400.0, 60.0)
    """
    bad = ConfigError(f"time_limit_s must be seconds or [D-]HH:MM[:SS] (SLURM's form), got {value!r}")
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if isinstance(value, bool):
        raise bad
    seconds = _clock_seconds(value.strip()) if isinstance(value, str) else float(value)
    if seconds is None:
        raise bad
    if seconds != seconds or seconds < 0:
        raise ConfigError(f"time_limit_s must be >= 0 seconds, got {value!r}")
    return seconds or None


def _clock_seconds(text: str) -> float | None:
    """`parse_time_limit`'s text forms; None when `text` is none of them."""
    if re.fullmatch(r"-?\d+(\.\d*)?", text):
        return float(text)
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if m is None:
        return None
    days, a, b, c = (int(x) if x else None for x in m.groups())
    assert a is not None
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, sec = a, b or 0, c or 0
    elif c is not None:  # HH:MM:SS
        h, mi, sec = a, b or 0, c
    else:  # MM or MM:SS (SLURM reads two fields as minutes and seconds)
        h, mi, sec = 0, a, b or 0
    return float((((days or 0) * 24 + h) * 60 + mi) * 60 + sec)


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
    env_workers: str = field(
        default="threads",
        metadata={
            "help": "where envs run: threads (the trainer's process) | ray | ray://HOST:PORT | ray:ADDRESS "
            "(Ray actors across the cluster's nodes; docs/envs.md)"
        },
    )
    env_call_timeout_s: float = field(
        default=1800.0,
        metadata={
            "help": "env_workers=ray: seconds an env call (reset, step) may take before its worker counts as "
            "lost and the episode as an env_error (0: wait forever)"
        },
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
    parallel: Literal["ddp", "fsdp2"] = field(
        default="ddp",
        metadata=choices(
            "the update's layout under torchrun (fsdp2: weights, gradients and AdamW sharded over ranks, "
            "full weights gathered into the rollout's copy once per step; trainers/fsdp.py)",
            ("ddp", "fsdp2"),
        ),
    )
    fsdp_offload: bool = field(
        default=False,
        metadata={
            "help": "parallel=fsdp2: keep the sharded fp32 weights, gradients and AdamW state on the CPU"
        },
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
    rollout_servers: list[str] = field(
        default_factory=list,
        metadata={
            "help": "engine=vllm: OpenAI-compatible servers to roll out on (URL,...); none: vLLM in-process"
        },
    )
    weight_sync: WeightSync = field(
        default="auto",
        metadata=choices(
            "engine=vllm with rollout_servers: how new weights reach them (auto: nccl)", get_args(WeightSync)
        ),
    )
    weight_sync_folder: str = field(
        default="", metadata={"help": "weight_sync=disk: a folder the trainer writes and every server reads"}
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
    selfplay: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={
            "help": "self-play in a multi-agent seat env (empty: off), e.g. {learner_seats: 2, frozen_seats: 1, "
            "snapshot: initial, others: strong}: trainers/selfplay.py"
        },
    )
    save_evals: bool = field(
        default=False,
        metadata={"help": "write each held-out evaluation's episodes to evals/ (`toolgym view` format)"},
    )
    resume: bool | Literal["auto"] = field(
        default=False,
        metadata={
            "help": "continue from the checkpoint in output_dir (true: it must be there; auto: when it is, "
            "else start fresh, for SLURM requeue scripts)"
        },
    )
    time_limit_s: float | str | None = field(
        default=None,
        metadata={
            "help": "wall-time budget from the start of training: seconds, or [D-]HH:MM[:SS] as SLURM writes it; "
            "the run stops at the first step boundary where the next step would not end in time, saves "
            "its checkpoint and exits 75 (resume continues); none: no limit"
        },
    )
    tensorboard: bool = field(default=True, metadata={"help": "also write tensorboard events"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    # old key -> new key: from_dict (YAML, CLI) still accepts the old one, with a DeprecationWarning
    RENAMED: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        self.validate()

    def time_limit(self) -> float | None:
        """`time_limit_s` in seconds (None: no limit), whichever form the config was given in."""
        return parse_time_limit(self.time_limit_s)

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
        if self.rollout_servers and self.engine != "vllm":
            raise ConfigError("rollout_servers needs engine=vllm")
        if self.engine == "vllm" and self.lora_r:  # (caught here, not at the first weight push mid-run)
            raise ConfigError(
                "engine=vllm cannot load LoRA adapters into vLLM: use lora_r = 0 (every weight trains) or "
                "another engine"
            )
        from toolgym.ray_envs import parse_env_workers  # (imports no torch)

        parse_env_workers(self.env_workers)
        if isinstance(self.resume, str) and self.resume.lower() in ("true", "false", "auto"):
            # (`--resume true|false` and a quoted YAML value arrive as text)
            self.resume = {"true": True, "false": False}.get(self.resume.lower(), "auto")
        if not (isinstance(self.resume, bool) or self.resume == "auto"):
            raise ConfigError(f"resume must be true, false or auto, got {self.resume!r}")
        self.time_limit_s = parse_time_limit(self.time_limit_s)
        if self.env_call_timeout_s < 0:
            raise ConfigError(
                f"env_call_timeout_s must be >= 0 (0: wait forever), got {self.env_call_timeout_s}"
            )

    def env_backend(self) -> str | RaySpec:
        """Where the envs run, for `TreeRollout`/`evaluate`: ``threads``, or the `RaySpec` of `env_workers` with
        `env_call_timeout_s` (toolgym/ray_envs.py)."""
        from toolgym.ray_envs import parse_env_workers

        spec = parse_env_workers(self.env_workers)
        if spec is None:
            return self.env_workers
        return dataclasses.replace(spec, call_timeout_s=self.env_call_timeout_s or None)

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
class DataConfig(RunConfig):
    """A trainer over a fixed data set (SFT, DPO): ``steps`` 0 lets ``epochs`` passes over the data decide."""

    steps: int = field(default=0, metadata={"help": "optimizer steps (0: `epochs` passes over the data)"})
    epochs: int = field(default=1, metadata={"help": "passes over the data (when steps is 0)"})

    def validate(self) -> None:
        steps, self.steps = self.steps, max(1, self.steps)  # 0 is allowed here (RunConfig wants >= 1)
        try:
            super().validate()
        finally:
            self.steps = steps
        if self.steps < 0:
            raise ConfigError(f"steps must be >= 0, got {self.steps}")


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
    is_min: float = field(
        default=0.0,
        metadata={
            "help": "lower bound of the importance weight (truncate: clamp; mask: zero below, with is_max the "
            "two-sided IcePop mask; 0: none)"
        },
    )
    # --- asynchronous rollouts (trainers/async_rollout.py)
    max_staleness: int = field(
        default=0,
        metadata={
            "help": "asynchronous rollouts: a worker grows the next batches while the learner updates, each "
            "token at most this many policy versions old when trained (0: the synchronous loop)"
        },
    )
    async_admission: Admission = field(
        default="batch",
        metadata=choices(
            "asynchronous rollouts: start a step's trees together, one run per batch (batch), or each tree as soon "
            "as the bound admits its batch, trees of several batches sharing the engine (tree: the slowest tree "
            "no longer holds the next batch back)",
            get_args(Admission),
        ),
    )
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
    # here, not beside RunConfig's micro_batch_rows: only the GRPO and PPO updates read it (SFT and DPO would
    # show a flag that does nothing). With a budget the row cap is dropped rather than kept as a second cap:
    # one rule the user can predict, and a row count tuned for short rows is what the budget replaces.
    micro_batch_tokens: int = field(
        default=0,
        metadata={
            "help": "token budget of one forward/backward, verl's ppo_max_token_len_per_gpu (0: off, "
            "micro_batch_rows rows each): rows, longest first, join a micro-batch while rows x its longest "
            "row stays within it (a longer row goes alone); micro_batch_rows is then ignored"
        },
    )

    def micro_batch_inert(self, changed: set[str]) -> list[str]:
        """The inert-option warning of the token budget (GRPO's and PPO's `inert_options`; `changed`: the
        fields set away from their defaults)."""
        if self.micro_batch_tokens and "micro_batch_rows" in changed:
            return [
                "micro_batch_rows: inert with micro_batch_tokens > 0 (the token budget cuts the micro-batches)"
            ]
        return []

    def validate(self) -> None:
        super().validate()
        if self.micro_batch_tokens < 0:
            raise ConfigError(
                f"micro_batch_tokens must be >= 0 (0: micro_batch_rows rows each), got {self.micro_batch_tokens}"
            )

    def check_async(self) -> None:
        """The rules of asynchronous rollouts GRPO and PPO share (ConfigErrors; GRPO adds its own)."""
        if self.is_max <= 0 or self.is_min < 0 or (self.is_min and self.is_min >= self.is_max):
            raise ConfigError(f"need 0 <= is_min < is_max (is_min 0: none), got {self.is_min}, {self.is_max}")
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0 (0: synchronous), got {self.max_staleness}")
        if not self.max_staleness:
            return
        if self.engine == "vllm" and not self.rollout_servers:
            raise ConfigError(
                "max_staleness > 0 with engine vllm needs rollout_servers: a colocated vLLM is one engine in the "
                "trainer's process and GPU, asleep during each update (serve it on other GPUs with `vllm serve` "
                "or `toolgym serve --weight-updates`, or use engine fast)"
            )
        # these draw a step's tasks from results of earlier steps, which the worker drawing ahead has not seen
        ahead = [n for n, on in (("refill", getattr(self, "refill", False)), ("task_pool", self.task_pool),
                 ("curriculum", getattr(self, "curriculum", None))) if on]  # fmt: skip
        if ahead:
            raise ConfigError(
                f"max_staleness > 0 does not support {', '.join(ahead)} yet: they pick a step's tasks from the "
                "results of the steps before it, which the rollout worker, drawing ahead of the learner, has "
                "not seen; set max_staleness 0 or turn them off"
            )

    def async_inert(self, changed: set[str]) -> list[str]:
        """The asynchronous options that do nothing (or clash) under the other settings."""
        out = []
        if not self.max_staleness and "async_admission" in changed:
            out.append("async_admission: inert with max_staleness 0 (the synchronous loop)")
        if self.max_staleness and self.is_mode == "none":
            out.append(
                "max_staleness > 0 with is_mode=none: stale tokens are trained with no off-policy correction"
            )
        return out


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
