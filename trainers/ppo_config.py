"""`PPOConfig`: every option of PPO with a value head (`toolgym train ppo`; the loop is ppo.py).

Like config.py it imports no torch, so `toolgym train ppo --help` and config checks run without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from toolgym.errors import ConfigError
from toolgym.trainers.config import (
    EPS_HIGH_HELP,
    Critic,
    LossOptionsConfig,
    changed_fields,
    check_loss_rules,
    choices,
)
from toolgym.trainers.grpo_config import ROLLOUT_KEYS_HELP, check_rollout_keys, rollout_keys_inert
from toolgym.trainers.inert import run_inert

if TYPE_CHECKING:
    from toolgym.trainers.loss import LossConfig
    from toolgym.trainers.rollout import RolloutConfig


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
    rollout_keys: bool = field(default=False, metadata=ROLLOUT_KEYS_HELP)  # (as GRPO's)

    def validate(self) -> None:
        super().validate()
        # categorical fields (metadata choices) are checked by RunConfig.validate
        check_loss_rules(self)
        self.check_async()
        check_rollout_keys(self)
        if self.selfplay:
            raise ConfigError(
                "selfplay runs with GRPO only (`toolgym train grpo`): the PPO loop rolls out independent samples"
            )

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
        out += self.micro_batch_inert(changed)
        if self.save_rollouts:
            out.append("save_rollouts: inert with PPO (GRPO saves rollout trees; PPO's are single samples)")
        out += rollout_keys_inert(self)
        return out + self.async_inert(changed) + self.seed_inert(changed) + run_inert(self, changed)

    def loss_config(self) -> LossConfig:
        from toolgym.trainers.loss import LossConfig

        return LossConfig(
            eps_low=self.eps_low, eps_high=self.eps_high, dual_clip=self.dual_clip or None,
            is_mode=self.is_mode, is_max=self.is_max, is_min=self.is_min or None, ratio_level=self.ratio_level,
            kl_coef=0.0 if self.kl_in_reward else self.kl_coef, kl_estimator=self.kl_estimator,
            entropy_coef=self.entropy_coef, agg=self.agg, max_tokens=self.max_total_tokens,
        )  # fmt: skip

    def rollout_config(self) -> RolloutConfig:
        """`budget` independent samples per task (PPO does not branch)."""
        from toolgym.trainers.rollout import RolloutConfig

        return RolloutConfig(
            budget=self.budget, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            max_total_tokens=self.max_total_tokens, keys=self.rollout_keys,
        )  # fmt: skip
