"""Rollout trees, branching policies, advantage estimators, losses and the GRPO/PPO loops.

The math modules (`tree`, `advantages`, `loss`, `branching`) import only torch/numpy; the loops import
the agents and transformers when used.
"""
