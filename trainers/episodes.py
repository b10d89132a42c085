"""Which tasks a step trains on, what its episodes did, and evaluation on held-out seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolgym.ray_envs import RaySpec
from toolgym.trainers.rollout import RolloutConfig, RolloutStats, RolloutTask, TreeRollout
from toolgym.trainers.tree import RolloutTree

EVAL_SEED0 = 10**9  # held-out seeds start here; training seeds stay below


def next_tasks(env_ids: list[str], seed: int, data_pos: int, n: int) -> list[RolloutTask]:
    """Tasks data_pos .. data_pos+n-1: env ids round-robin, seeds derived from (seed, position).

    >>> next_tasks(["a", "b"], 0, 3, 2)
    [RolloutTask(env_id='b', seed=3), RolloutTask(env_id='a', seed=4)]
    """
    return [
        RolloutTask(env_ids[i % len(env_ids)], (seed * 1_000_003 + i) % EVAL_SEED0)
        for i in range(data_pos, data_pos + n)
    ]


def eval_tasks(env_ids: list[str], n: int) -> list[RolloutTask]:
    return [RolloutTask(env_ids[i % len(env_ids)], EVAL_SEED0 + i) for i in range(n)]


def leaf_episodes(forest: list[RolloutTree]) -> list[dict[str, Any]]:
    """The end-of-episode record of every leaf (success, reward, turns, tool calls, tokens, void)."""
    return [tree.nodes[leaf].info.get("episode", {}) for tree in forest for leaf in tree.leaves()]


def episode_metrics(
    forest: list[RolloutTree], stats: RolloutStats, prefix: str = "charts"
) -> dict[str, float]:
    """charts/episode_reward, charts/success, charts/turns, charts/tool_calls, … and rollout/… numbers."""
    eps = leaf_episodes(forest)
    n = max(len(eps), 1)

    def mean(key: str) -> float:
        return sum(float(e.get(key, 0.0)) for e in eps) / n

    out = {
        f"{prefix}/episode_reward": mean("episode_reward"),
        f"{prefix}/success": mean("success"),
        f"{prefix}/turns": mean("turns"),
        f"{prefix}/tool_calls": mean("tool_calls"),
        f"{prefix}/tokens_per_episode": mean("tokens"),
        f"{prefix}/void_fraction": mean("void"),
        f"{prefix}/truncated_fraction": sum(e.get("truncation") is not None for e in eps) / n,
        # episodes with an observation cut at the env's max_observation_chars (a long-context setting, or an
        # env echoing the model's text back: envs/base.py)
        f"{prefix}/observation_cut_fraction": sum(bool(e.get("observations_cut")) for e in eps) / n,
    }
    if prefix == "charts":
        out |= {
            "rollout/episodes": float(len(eps)),
            "rollout/generated_tokens": float(stats.generated_tokens),
            "rollout/tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
            "rollout/generate_s": stats.generate_s,
            "rollout/env_s": stats.env_s,
            "rollout/branches_per_tree": sum(t.branch_count() for t in forest) / max(len(forest), 1),
            # infrastructure faults (each path an env_error: no training row): an env's or a rollout server's
            "rollout/env_errors": float(stats.env_errors),
            "rollout/server_errors": float(stats.server_errors),
            "rollout/lost_env_workers": float(stats.lost_env_workers),
        }
    return out


def evaluate(
    policy: Any,
    env_ids: list[str],
    env_kwargs: dict[str, Any],
    cfg: RolloutConfig,
    episodes: int,
    save: tuple[Path, int] | None = None,
    env_backend: str | RaySpec = "threads",
) -> dict[str, float]:
    """One greedy rollout per held-out seed; eval/episode_reward, eval/success, …

    ``save=(run_dir, step)`` also writes the episodes to ``run_dir/evals/step_N.jsonl`` (``toolgym view``'s
    format), so that a held-out plateau can be read episode by episode. ``env_backend``: where the envs run
    (``threads`` or a Ray address: toolgym/ray_envs.py)."""
    roller = TreeRollout(
        policy, None, RolloutConfig(**{**cfg.__dict__, "budget": 1, "temperature": 0.0}), env_kwargs,
        env_backend=env_backend,
    )  # fmt: skip
    try:
        forest, stats = roller.run(eval_tasks(env_ids, episodes), seed=EVAL_SEED0)
    finally:
        roller.close()
        # the caches the evaluation left (same weights) would be continued by the next training rollout, whose
        # numbers would then depend on whether an evaluation ran before it: a resumed run, which skips the
        # evaluation of the step it resumes from, would not continue the run exactly
        getattr(policy, "clear_kv", lambda: None)()
    if save is not None:
        from toolgym.trainers.saved_rollouts import save_step

        save_step(save[0], save[1], forest, [], None, None, policy.renderer.decode, folder_name="evals")
    return episode_metrics(forest, stats, prefix="eval")
