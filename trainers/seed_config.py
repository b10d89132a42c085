"""Config fields and per-run state of the seed methods: success replay + task selection, EPO, HiPER.

`GRPOConfig` extends `SeedMethodsConfig` (a `RunConfig`), so every field here is a `toolgym train` flag
and a YAML key. The algorithms live in replay.py, epo.py and hiper.py; `SeedState` holds what they keep
between steps and is the only thing the GRPO loop talks to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolgym.errors import ConfigError
from toolgym.trainers.config import RunConfig


@dataclass
class SeedMethodsConfig(RunConfig):
    # --- success replay and task selection (ARPO for GUI agents)
    replay: bool = field(
        default=False,
        metadata={"help": "ARPO replay: an all-failed group gets one buffered success of its task"},
    )
    replay_per_task: int = field(default=1, metadata={"help": "replay: successes kept per task"})
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
    epo_alpha: float = field(default=0.01, metadata={"help": "EPO: coefficient of the trajectory entropy"})
    epo_beta: float = field(default=1.0, metadata={"help": "EPO: coefficient of the smoothing penalty"})
    epo_kappa: float = field(
        default=0.5, metadata={"help": "EPO: band half-width relative to the historical mean entropy"}
    )
    epo_window: int = field(default=10, metadata={"help": "EPO: steps in the historical entropy mean"})
    epo_weight_start: float = field(default=0.1, metadata={"help": "EPO: phase weight early in training"})
    epo_weight_end: float = field(default=1.0, metadata={"help": "EPO: phase weight at the last step"})
    epo_warmup: float = field(
        default=0.2, metadata={"help": "EPO: fraction of training at the start weight before the ramp"}
    )
    # --- HiPER (estimator=hiper)
    hiper_gamma: float = field(default=0.95, metadata={"help": "HiPER HAE discount (turns and segments)"})
    hiper_omega_high: float = field(default=1.0, metadata={"help": "HiPER: weight of the plan advantage"})
    hiper_omega_low: float = field(default=1.0, metadata={"help": "HiPER: weight of the execution advantage"})

    def validate(self) -> None:
        super().validate()
        for name in ("replay_per_task", "task_filter_refresh", "epo_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.task_pool < 0:
            raise ConfigError(f"task_pool must be >= 0 (0: off), got {self.task_pool}")
        if self.epo_kappa < 0 or not 0.0 <= self.epo_warmup <= 1.0:
            raise ConfigError("epo_kappa must be >= 0 and epo_warmup in [0, 1]")
        if not 0.0 < self.hiper_gamma <= 1.0:
            raise ConfigError(f"hiper_gamma must be in (0, 1], got {self.hiper_gamma}")

    def seed_inert(self, changed: set[str]) -> list[str]:
        """The seed-method options that do nothing under the other settings."""
        out = []
        epo_opts = sorted(n for n in changed if n.startswith("epo_"))
        if epo_opts and not self.epo:
            out.append(f"{', '.join(epo_opts)}: inert unless epo")
        hip = sorted(n for n in changed if n.startswith("hiper_"))
        if hip and getattr(self, "estimator", "") != "hiper":
            out.append(f"{', '.join(hip)}: inert unless estimator=hiper")
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


class SeedState:
    """What the seed methods keep across the steps of one run (in memory: a resume starts it empty)."""

    def __init__(self, cfg: SeedMethodsConfig, world: int = 1) -> None:
        from toolgym.trainers import epo, replay

        if world > 1 and (cfg.replay or cfg.task_pool):
            raise ConfigError("replay and task_pool run on one process only (not under torchrun yet)")
        self.cfg = cfg
        self.buffer, self.selector = replay.make(cfg)
        self.band = epo.EntropyBand(cfg.epo_kappa, cfg.epo_window) if cfg.epo else None
        self.weight = 0.0
        self._sums: dict[str, float] = {}

    def tasks(self, default: Any, n: int, step: int) -> Any:
        """The step's tasks: from the task pool when on, else `default()`."""
        return self.selector.draw(n, step) if self.selector is not None else default()

    def before_credit(self, forest: list[Any], step: int, metrics: dict[str, float]) -> list[Any]:
        """Probe (task selection), buffer the successes, replay into all-failed groups; logs replay/*."""
        if self.selector is not None:
            self.selector.observe(forest, step, self.buffer)
            metrics |= self.selector.metrics(step)
        if self.buffer is not None:
            self.buffer.add(forest)
            forest = self.buffer.inject(forest)
            metrics["replay/replaced_groups"] = float(
                sum(any(n.info.get("replayed") for n in t.nodes) for t in forest)
            )
            metrics["replay/buffer_size"] = float(len(self.buffer))
        if getattr(self.cfg, "estimator", "") == "hiper":
            from toolgym.trainers.hiper import subgoal_fraction
            from toolgym.trainers.tree import flatten

            metrics["hiper/subgoal_fraction"] = subgoal_fraction(forest, flatten(forest))
        return forest

    def start_step(self, step: int) -> None:
        from toolgym.trainers.epo import phase_weight

        c = self.cfg
        self.weight = phase_weight(step, c.steps, c.epo_weight_start, c.epo_weight_end, c.epo_warmup)
        self._sums = {}

    def epo_term(self, loss: Any, ent: Any, mb: Any, rows: int) -> Any:
        """`loss` plus the EPO terms of this micro-batch (`rows`: the minibatch's row count)."""
        if self.band is None or ent is None:
            return loss
        from toolgym.trainers.epo import epo_loss

        c = self.cfg
        extra, st = epo_loss(
            ent.float(), mb.loss_mask.float(), mb.turn_ids, rows, c.epo_alpha, c.epo_beta, self.weight,
            self.band.band(),
        )  # fmt: skip
        for k, v in st.items():
            self._sums[k] = self._sums.get(k, 0.0) + v
        return loss + extra

    def end_step(self, metrics: dict[str, float]) -> None:
        """Logs epo/* and records the step's entropy in the history (after its band was used)."""
        if self.band is None:
            return
        band = self.band.band()
        n = self._sums.get("rows", 0.0)
        h = self._sums.get("entropy_sum", 0.0) / n if n else 0.0
        metrics["epo/entropy"] = h
        metrics["epo/band_low"], metrics["epo/band_high"] = band if band is not None else (h, h)
        metrics["epo/phase_weight"] = self.weight
        metrics["epo/smooth_penalty"] = self._sums.get("penalty_sum", 0.0) / n if n else 0.0
        if n:
            self.band.update(h)
