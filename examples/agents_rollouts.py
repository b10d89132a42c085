"""Roll out episodes with a policy and look at what the trainer gets: token ids, loss mask, logprobs.

python examples/agents_rollouts.py                 # the scripted expert (instant)
python examples/agents_rollouts.py --agent hf:smollm2-135m --episodes 2   # the embedded model (CPU: minutes)
"""

from __future__ import annotations

import argparse

from toolgym.agents import SamplingParams, TokenPolicy, make_policy, run_episodes, save_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent", default="scripted")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--out", default="runs/example-rollouts.jsonl")
    args = parser.parse_args()
    policy = make_policy(args.agent)
    token_level = isinstance(policy, TokenPolicy)
    env_kwargs = {"prompt_format": "text"} if token_level and not policy.renderer.renders_tools else {}
    trajs = run_episodes(
        policy,
        "toolgym/Calculator-v0",
        args.episodes,
        sampling=SamplingParams(temperature=0.7, max_new_tokens=64, seed=0),
        env_kwargs=env_kwargs,
    )
    for t in trajs:
        print(
            f"seed {t.seed}: success={t.success} reward={t.reward:+.2f} turns={t.turns} tool calls={t.tool_calls}"
        )
        for k, text in enumerate(t.turn_texts):
            print(f"  turn {k + 1}: {text[:100]!r}")
        if token_level:
            start, end = t.turn_spans[0]
            print(
                f"  {len(t.token_ids)} tokens, {sum(t.loss_mask)} sampled; turn 1 = ids[{start}:{end}], "
                f"logprobs {[round(x, 2) for x in t.logprobs[start : start + 5]]}…"
            )
    print(f"wrote {save_trajectories(args.out, trajs)}")


if __name__ == "__main__":
    main()
