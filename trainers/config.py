"""What every training run shares: the run config (envs, model, rollout, optimizer, logging, checkpoints).

`GRPOConfig` and `PPOConfig` extend `RunConfig` with their own fields. Every field carries a one-line
help (`metadata["help"]`), which `toolgym train` turns into its flags; a YAML file gives the same keys.
A categorical field is declared with `choice()`: its accepted values go to argparse (`--help` lists them)
and a config with any other value fails at construction with a ConfigError that lists them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from toolgym.errors import ConfigError

C = TypeVar("C", bound="RunConfig")

# the accepted values of the categorical options, here (no torch) so configs and the CLI can list them
RATIO_LEVELS = ("token", "sequence", "turn")
KL_ESTIMATORS = ("k1", "k2", "k3", "k3+")
AGGS = ("token_mean", "seq_mean", "constant")
IS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
BRANCHINGS = ("none", "turn_entropy", "token_entropy", "branching_score", "fixed_segments")


def choice(default: str, options: tuple[str, ...], help: str) -> Any:
    """A categorical config field: one of ``options`` (checked when the config is built)."""
    if default not in options:
        raise ValueError(f"default {default!r} not in {options}")
    return field(default=default, metadata={"help": f"{help}: {' | '.join(options)}", "choices": options})


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
    engine: str = choice(
        "auto", ("auto", "fast", "hf"), "rollout engine (auto: fast on CUDA for Llama/Qwen2)"
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
    resume: bool = field(default=False, metadata={"help": "continue from the checkpoint in output_dir"})
    tensorboard: bool = field(default=True, metadata={"help": "also write tensorboard events"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

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

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """A config from plain keys (YAML); unknown keys are an error that lists the known ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown} for {cls.__name__}; known: {sorted(names)}")
        cfg = cls(**data)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file (a ConfigError says what is wrong with it)."""
    import yaml

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
