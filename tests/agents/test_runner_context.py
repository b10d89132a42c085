"""The runner's rounds (an ``hf`` policy): an episode whose prompt and reply would pass the model's positions
(``max_position_embeddings``) ends as a ``token_budget`` truncation (the model's own length, never an
infrastructure failure), while the other episodes of its batch run on (was: it went into the batch and either
failed the whole call, absolute position embeddings, or extrapolated past the context)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from toolgym.agents import HFPolicy
from toolgym.agents.policy import SamplingParams
from toolgym.agents.runner import EpisodeRunner, EpisodeSpec, episode_specs

ENV = "toolgym/Calculator-v0"
KW = {"prompt_format": "text", "max_turns": 2}


def _first_prompt_len(policy: Any, spec: EpisodeSpec) -> int:
    import gymnasium as gym

    env = gym.make(spec.env_id, **dict(spec.kwargs))
    try:
        obs, info = env.reset(seed=spec.seed)
        return len(policy.renderer.prompt_ids(obs, list(info.get("tools") or [])))
    finally:
        env.close()


def test_a_prompt_past_the_models_positions_is_that_episodes_token_budget(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    policy = HFPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    specs = episode_specs([ENV], 12, **KW)
    lengths = [_first_prompt_len(policy, s) for s in specs]
    short, long = min(lengths), max(lengths)
    assert short < long  # (the seeds' questions differ in length)
    policy.model.config.max_position_embeddings = long + 4 - 1  # every longest first prompt is past it
    calls: list[int] = []
    generate = policy.generate

    def counted(prompts: Any, sp: Any = None) -> Any:
        calls.append(len(prompts))
        return generate(prompts, sp)

    policy.generate = counted  # type: ignore[method-assign]
    with EpisodeRunner(policy, concurrency=12, sampling=sampling) as runner:
        trajs = runner.run(specs)
    assert len(trajs) == 12 and all(t.error is None for t in trajs)  # never an infrastructure failure
    for t, n in zip(trajs, lengths, strict=True):
        if n == long:
            assert t.truncated and t.truncation == "token_budget" and t.turns == 0 and not t.success
        else:
            assert t.turns >= 1
    assert calls and calls[0] == sum(1 for n in lengths if n < long)  # the rest ran in one batch
