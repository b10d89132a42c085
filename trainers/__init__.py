"""Rollout trees, branching policies, advantage estimators, losses and the GRPO/PPO loops.

`config` (`RunConfig`), `grpo_config` (`GRPOConfig`) and `ppo_config` (`PPOConfig`) import no torch, so
the CLI's help and config checks run without it; the math modules (`tree`, `advantages`, `loss`,
`branching`) import only torch/numpy; the loops `grpo` and `ppo` import torch and the agents at the top
(`sft` when it runs).
"""
