"""The episode runner's own cost.

1. Episodes/s of ``EpisodeRunner`` with the scripted expert over 64 concurrent Calculator-v0 episodes, beside
   a plain sequential loop (reset, expert, step) over the same seeds, in the same run.
2. The runner's overhead per LLM call: a token-level policy whose ``generate`` returns canned ids at no cost
   drives the runner with SmolLM2's real chat template (``ChatRenderer``: prompt rendering, env suffixes,
   decoding, parsing, bookkeeping). Overhead = (runner wall time - env reset/step time - time inside
   ``generate``) / model turns. Goal: < 1 ms.

    python benchmarks/runner.py [--episodes 512] [--repeats 3] [--out benchmarks/results/runner.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym

import toolgym  # noqa: F401
from toolgym.agents import (
    ChatRenderer,
    EpisodeRunner,
    Generation,
    SamplingParams,
    ScriptedPolicy,
    episode_specs,
)
from toolgym.agents.hf import HFPolicy
from toolgym.envs.base import tool_env

ENV = "toolgym/Calculator-v0"


def sequential(episodes: int) -> float:
    """Episodes/s of the plain loop: one env, reset, expert action, step, until done."""
    env = gym.make(ENV)
    inner = tool_env(env)
    start = time.perf_counter()
    for seed in range(episodes):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(inner.expert_action())
            done = term or trunc
    return episodes / (time.perf_counter() - start)


def runner(episodes: int, concurrency: int) -> float:
    with EpisodeRunner(ScriptedPolicy(), concurrency=concurrency) as r:
        start = time.perf_counter()
        trajs = r.run(episode_specs([ENV], episodes))
        seconds = time.perf_counter() - start
    assert all(t.success for t in trajs)
    return episodes / seconds


class TimedEnv(gym.Wrapper):  # type: ignore[type-arg]
    """Adds the time spent in reset/step (and in the expert) to a shared counter."""

    spent: ClassVar[list[float]] = [0.0]

    def reset(self, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.env.reset(**kwargs)
        finally:
            self.spent[0] += time.perf_counter() - t

    def step(self, action: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.env.step(action)
        finally:
            self.spent[0] += time.perf_counter() - t


class CannedTokenPolicy(HFPolicy):
    """``HFPolicy`` without a model: ``generate`` returns the expert's reply as ids (timed separately)."""

    def __init__(self, tokenizer: Any) -> None:
        self.name = "canned"
        self.tokenizer = tokenizer
        self._renderer = ChatRenderer(tokenizer)
        self.sampling = SamplingParams()
        self.batch_size = 1 << 30
        stop = min(self._renderer.stop_ids)
        self.envs: list[Any] = []
        call = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*58"}}</tool_call>'
        self.call_ids = [*self._renderer.encode(call), stop]
        self.answer_ids = [*self._renderer.encode("<answer>2146</answer>"), stop]
        self.generate_s = 0.0

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        t = time.perf_counter()
        out = []
        for p in prompts:  # first turn: a call; later turns: the answer (prompts end after a tool result)
            ids = self.answer_ids if "</tool_response>" in self._renderer.decode(p[-16:]) else self.call_ids
            out.append(Generation(list(ids), [-0.1] * len(ids), "stop"))
        self.generate_s += time.perf_counter() - t
        return out


def overhead(episodes: int, concurrency: int) -> tuple[float, float, int]:
    """(runner overhead per model turn in ms, of which rendering the first prompt, model turns)."""
    from transformers import AutoTokenizer

    from toolgym.agents.embedded import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    policy = CannedTokenPolicy(tokenizer)
    probe = gym.make(ENV, prompt_format="text")
    TimedEnv.spent[0] = 0.0
    make = lambda spec: TimedEnv(gym.make(spec.env_id, **dict(spec.kwargs)))  # noqa: E731
    with EpisodeRunner(policy, concurrency=concurrency, make_env=make) as r:
        start = time.perf_counter()
        trajs = r.run(episode_specs([ENV], episodes, prompt_format="text"))
        wall = time.perf_counter() - start
        turns = int(r.stats["model_turns"])
    assert all(t.turns == 2 for t in trajs), [t.turn_texts for t in trajs[:2]]
    t = time.perf_counter()
    for seed in range(200):
        obs, info = probe.reset(seed=seed)
        policy.renderer.prompt_ids(obs, info["tools"])
    first_prompt_ms = (time.perf_counter() - t) / 200 * 1e3
    return (wall - TimedEnv.spent[0] - policy.generate_s) / turns * 1e3, first_prompt_ms, turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best of N for each row")
    parser.add_argument("--out", default=None, help="also write the results as markdown here")
    args = parser.parse_args()
    seq = max(sequential(args.episodes) for _ in range(args.repeats))
    run = max(runner(args.episodes, args.concurrency) for _ in range(args.repeats))
    run1 = max(runner(args.episodes, 1) for _ in range(args.repeats))
    results = [overhead(args.episodes, args.concurrency) for _ in range(args.repeats)]
    over, first_ms, turns = min(results)
    lines = [
        "| what | episodes/s | ratio to sequential |",
        "|---|---:|---:|",
        f"| sequential loop: reset, expert, step (baseline) | {seq:,.0f} | 1.000 |",
        f"| EpisodeRunner, scripted, {args.concurrency} concurrent | {run:,.0f} | {run / seq:.3f} |",
        f"| EpisodeRunner, scripted, 1 at a time | {run1:,.0f} | {run1 / seq:.3f} |",
        "",
        "| runner overhead per LLM call (SmolLM2 template, canned generations) | ms |",
        "|---|---:|",
        f"| all of it: rendering, env suffixes, decode, parse, bookkeeping ({turns} model turns) | {over:.3f} |",
        f"| of which the first prompt (full chat-template render + tokenize), once per episode | {first_ms:.3f} |",
        f"\nGoal < 1 ms runner overhead per LLM call: {'met' if over < 1 else 'NOT met'} ({over:.3f} ms).",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        header = (
            f"# runner\n\nCommand: `python benchmarks/runner.py --episodes {args.episodes} "
            f"--concurrency {args.concurrency} --repeats {args.repeats}`\n"
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared); "
            f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d')}\n\n"
        )
        with open(args.out, "w") as f:
            f.write(header + table + "\n")


if __name__ == "__main__":
    main()
