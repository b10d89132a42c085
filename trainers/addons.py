"""Per-run state of the add-ons: success replay + task selection, EPO, HiPER.

Their config fields are `AddonsConfig` in config.py (re-exported here): `GRPOConfig` extends it, so
every field is a `toolgym train grpo` flag and a YAML key. The algorithms live in replay.py, epo.py and
hiper.py; `AddonState` holds what they keep between steps and is the only thing the GRPO loop talks to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolgym.errors import ConfigError
from toolgym.trainers.config import AddonsConfig

__all__ = ["AddonState", "AddonsConfig"]


class AddonState:
    """What the add-ons keep across the steps of one run; saved with the checkpoint (`state_dict`), so a
    resumed run replays, draws tasks and bands entropies exactly as an uninterrupted one."""

    def __init__(self, cfg: AddonsConfig, world: int = 1) -> None:
        from toolgym.trainers import epo, replay

        if world > 1 and (cfg.replay or cfg.task_pool):
            raise ConfigError("replay and task_pool run on one process only (not under torchrun yet)")
        self.cfg = cfg
        self.buffer, self.selector = replay.make(cfg)
        self.band = (
            epo.EntropyBand(cfg.epo_kappa_low, cfg.epo_kappa_high, cfg.epo_window) if cfg.epo else None
        )
        self.weight = 0.0
        self._sums: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        """EPO's history, the replay buffer (paths and its random generator), the task pool's cursor, rates
        and drop steps: plain picklable values."""
        out: dict[str, Any] = {}
        if self.band is not None:
            out["epo_history"] = list(self.band.history)
        if self.buffer is not None:
            out["replay"] = {"paths": self.buffer.paths, "rng": self.buffer.rng.getstate()}
        if self.selector is not None:
            s = self.selector
            out["task_pool"] = {"cursor": s.cursor, "rate": dict(s.rate), "dropped_at": dict(s.dropped_at)}
        return out

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restores `state_dict`; a part the run uses but the checkpoint lacks (saved without that method,
        or by an older version) is a ConfigError, since the resume would silently differ."""
        state = state or {}
        parts = {"epo_history": self.band, "replay": self.buffer, "task_pool": self.selector}
        missing = [k for k, on in parts.items() if on is not None and k not in state]
        if missing:
            raise ConfigError(
                f"the checkpoint holds no {', '.join(missing)} state (saved without it): this resume would not "
                "continue the run; start it again, or turn the option off"
            )
        if self.band is not None:
            self.band.history.clear()
            self.band.history.extend(state["epo_history"])
        if self.buffer is not None:
            self.buffer.paths = state["replay"]["paths"]
            self.buffer.rng.setstate(state["replay"]["rng"])
        if self.selector is not None:
            tp = state["task_pool"]
            self.selector.cursor, self.selector.rate = tp["cursor"], dict(tp["rate"])
            self.selector.dropped_at = dict(tp["dropped_at"])

    def tasks(self, default: Any, n: int, step: int) -> Any:
        """The step's tasks: from the task pool when on, else `default()`."""
        return self.selector.draw(n, step) if self.selector is not None else default()

    def before_credit(self, forest: list[Any], step: int, metrics: dict[str, float]) -> list[Any]:
        """Probe (task selection), buffer the successes, replay into all-failed groups; logs rollout/replay_*."""
        if self.selector is not None:
            self.selector.observe(forest, step, self.buffer)
            metrics |= self.selector.metrics(step)
        if self.buffer is not None:  # replay earlier successes first, then buffer this step's (ARPO's order)
            forest = self.buffer.inject(forest)
            self.buffer.add(forest)
            metrics["rollout/replay_replaced_groups"] = float(
                sum(any(n.info.get("replayed") for n in t.nodes) for t in forest)
            )
            metrics["rollout/replay_buffer_size"] = float(len(self.buffer))
        if self.cfg.hiper_on():
            from toolgym.trainers.hiper import subgoal_fraction
            from toolgym.trainers.tree import flatten

            metrics["charts/subgoal_fraction"] = subgoal_fraction(forest, flatten(forest))
        return forest

    def start_step(self, step: int) -> None:
        from toolgym.trainers.epo import phase_weight

        c = self.cfg
        self.weight = phase_weight(step, c.steps, c.epo_weight_start, c.epo_weight_end, c.epo_warmup)
        self._sums = {}

    def epo_term(self, loss: Any, ent: Any, mb: Any, rows: int) -> Any:
        """`loss` plus the EPO terms of this micro-batch (`rows`: the minibatch's rows with a model token to
        train, over all ranks). A row's trajectory entropy reads all its turns (`TrainBatch.turn_mask`)."""
        if self.band is None or ent is None:
            return loss
        from toolgym.trainers.epo import epo_loss

        c = self.cfg
        extra, st = epo_loss(
            ent.float(), mb.turn_mask().float(), mb.turn_ids, rows, c.epo_alpha, c.epo_beta, self.weight,
            self.band.band(),
        )  # fmt: skip
        for k, v in st.items():
            self._sums[k] = self._sums.get(k, 0.0) + v
        return loss + extra

    def end_step(self, metrics: dict[str, float], total: Callable[[float], float] = float) -> None:
        """Logs losses/epo_* and records the step's entropy in the history (after its band was used).
        ``total``: a sum over ranks (``Dist.sum``), so every rank keeps the one history and band (a rank's own
        entropy, or a rank with no rows skipping the update, would give each rank another objective)."""
        if self.band is None:
            return
        band = self.band.band()
        sums = {k: total(self._sums.get(k, 0.0)) for k in ("rows", "entropy_sum", "penalty_sum")}
        n = sums["rows"]
        h = sums["entropy_sum"] / n if n else 0.0
        metrics["losses/epo_entropy"] = h
        metrics["losses/epo_band_low"], metrics["losses/epo_band_high"] = band if band is not None else (h, h)
        metrics["losses/epo_phase_weight"] = self.weight
        metrics["losses/epo_smooth_penalty"] = sums["penalty_sum"] / n if n else 0.0
        if n:
            self.band.update(h)
