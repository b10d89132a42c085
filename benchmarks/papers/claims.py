"""The founding papers' claims as comparisons on our envs: one `Claim` a paper's headline, each arm a set of
trainer-config overrides on one shared base, every arm run with the same seeds from one shared warm start.

A claim names the paper's own number, our setting and every departure from the official code's
hyperparameters (docs/trainer.md lists those), so the report can print them beside our result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)  # trainer-config fields over the claim's base


@dataclass(frozen=True)
class Claim:
    name: str
    title: str
    paper: str  # the paper's headline number, in words
    env_id: str
    env_kwargs: dict[str, Any]
    eval_env_kwargs: dict[str, Any]
    sft: dict[str, Any]  # `toolgym sft` fields of the shared warm start
    rl: dict[str, Any]  # `toolgym train` fields every arm shares
    arms: tuple[Arm, ...]
    baseline: str  # the arm every gain is measured against
    departures: tuple[str, ...] = ()


# Household at a level of >= 8 expert turns on average: two rooms, two-object and clean/heat/cool tasks
# (expert 7.9 turns, median 8, 90th percentile 10 on 40 seeds; the model's own episodes run longer).
HOUSEHOLD = {
    "rooms": 2,
    "receptacles": 12,
    "distractors": 3,
    "task_types": ["two", "clean", "heat", "cool"],
    "list_commands": True,
    "max_turns": 16,
    "split": "train",
}
CHAIN = {
    "prompt_format": "text",
    "action_format": "tags",
    "lenient_answers": False,
    "num_ops": [2, 3],
    "split": "train",
}

RL_BASE: dict[str, Any] = {
    "algorithm": "grpo", "prompts_per_step": 8, "budget": 8, "temperature": 1.0, "lr": 1.0e-5,
    "minibatches": 2, "micro_batch_rows": 8, "eval_every": 5, "eval_episodes": 64, "save_every": 5,
}  # fmt: skip

CLAIMS: dict[str, Claim] = {
    c.name: c
    for c in (
        Claim(
            name="gigpo_household",
            title="Turn-level credit on a long-horizon household task (GiGPO)",
            paper="GiGPO (Feng et al. 2025, arXiv 2505.10978): > 12 points of ALFWorld success over GRPO with "
            "Qwen2.5-1.5B/7B-Instruct (and > 9 on WebShop)",
            env_id="toolgym/Household-v0",
            env_kwargs=HOUSEHOLD,
            eval_env_kwargs={"split": "seen"},
            # 2048 expert episodes x 2 epochs: held-out 0.27 on 4 x H200 (512 x 1 gave 0.03; 1024 x 4 at lr 1e-4
            # and 4096 x 1 gave 0.25): benchmarks/results/papers_warmstart.md
            sft={
                "episodes": 2048,
                "epochs": 2,
                "batch_size": 16,
                "lr": 5.0e-5,
                "max_new_tokens": 32,
                "max_total_tokens": 3072,
            },
            rl={**RL_BASE, "max_new_tokens": 32, "max_total_tokens": 3072, "steps": 200},
            arms=(
                Arm("grpo"),
                Arm("gigpo", {"estimator": "gigpo"}),  # omega 1, gamma 0.95, mean_norm: the official defaults
                Arm("ppo", {"algorithm": "ppo", "critic": "turn", "gamma": 0.95, "lam": 0.95}),
            ),
            baseline="grpo",
            departures=(
                "SmolLM2-135M-Instruct after an SFT warm start (2048 expert episodes, 2 epochs; held-out 0.27) (GiGPO: Qwen2.5-1.5B/7B from the "
                "instruct model, no SFT)",
                "8 tasks x 8 rollouts a step, lr 1e-5 (GiGPO: 16 x 8, lr 1e-6), no KL term (GiGPO: KL 0.01)",
                "our Household-v0 (ALFWorld's six task types in text, generated layouts) at two rooms and four "
                "task types, 16 turns (ALFWorld: 50 turns)",
                "GiGPO's anchor states are exact world-state keys (info['state_key']), as its exact-match mode",
                "held-out = the `seen` split (held-out goals in training layouts), 64 greedy episodes",
            ),
        ),
        Claim(
            name="branching_chain",
            title="Branching at uncertain points (ARPO, APPO)",
            paper="ARPO (Dong et al. 2025): higher accuracy with about half the tool calls of trajectory-level "
            "RL; APPO: more solved tasks per generated token",
            env_id="toolgym/CalculatorChain-v0",
            env_kwargs=CHAIN,
            eval_env_kwargs={"split": "test"},
            sft={
                "episodes": 128,
                "epochs": 1,
                "batch_size": 16,
                "lr": 5.0e-5,
                "max_new_tokens": 48,
                "max_total_tokens": 1024,
                "env_kwargs": {**CHAIN, "num_ops": 2},
            },
            rl={
                **RL_BASE,
                "prompts_per_step": 16,
                "budget": 16,
                "lr": 2.0e-5,
                "max_new_tokens": 48,
                "max_total_tokens": 1024,
                "steps": 400,
            },
            arms=(
                Arm("grpo"),
                Arm("arpo", {"branching": "turn_entropy", "estimator": "tree"}),
                Arm("appo", {"branching": "branching_score", "estimator": "tree"}),
            ),
            baseline="grpo",
            departures=(
                "SmolLM2-135M-Instruct after a 128-episode SFT on two-operation chains (the papers: 7-8B models)",
                "tree advantages for both branching arms (ARPO's own code uses GRPO over its tree's leaves)",
                "APPO's likelihood gain is 1 in our rollout (no older policy to compare), so its forks go to "
                "the top-entropy tokens (branching.py, departure 6)",
            ),
        ),
    )
}
