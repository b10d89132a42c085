"""toolgym/FreeQA-v0 and Search-v0 with reward="judge": the judge grades the env's final answer."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import httpx
import pytest

import toolgym  # noqa: F401  (registers the ids)
from toolgym.errors import ConfigError
from toolgym.rewards.judge import judge


def scripted_judge(score: int | None, seen: list[dict[str, Any]] | None = None, **kw: Any) -> Any:
    """A judge whose server answers `correctness: score` (None: 503 forever)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(json.loads(request.content))
        if score is None:
            return httpx.Response(503)
        return httpx.Response(200, json={"choices": [{"message": {"content": f"correctness: {score}"}}]})

    return judge("http://judge.test", transport=httpx.MockTransport(handler), backoff_s=0, retries=1, **kw)


def test_f1_reward_and_success_threshold() -> None:
    env = gym.make("toolgym/FreeQA-v0")
    env.reset(seed=0)
    ref = env.unwrapped.task.answer
    _, r, term, _, info = env.step(f"<answer>{ref}</answer>")
    assert term and r == 1.0 and info["success"]
    env.reset(seed=0)
    _, r, _, _, info = env.step("<answer>no idea at all</answer>")
    assert r < 0.5 and not info["success"]


def test_judge_reward_grades_question_answer_and_reference() -> None:
    seen: list[dict[str, Any]] = []
    env = gym.make("toolgym/FreeQA-v0", reward="judge", judge=scripted_judge(7, seen))
    env.reset(seed=3)
    task = env.unwrapped.task
    _, r, term, _, info = env.step("<answer>Because it is lighter than air.</answer>")
    assert term and r == 0.7 and info["success"]  # 7 on 0-10, success_at 0.5
    user = seen[0]["messages"][1]["content"]
    assert task.prompt in user and str(task.answer) in user and "Because it is lighter than air." in user


def test_a_failed_judge_is_an_env_error_not_a_zero() -> None:
    env = gym.make("toolgym/FreeQA-v0", reward="judge", judge=scripted_judge(None))
    env.reset(seed=0)
    _, r, term, trunc, info = env.step("<answer>x</answer>")
    assert (r, term, trunc, info["truncation"]) == (0.0, False, True, "env_error")
    assert "judge" in info["infra_error"]


def test_judge_arguments_are_checked() -> None:
    with pytest.raises(ConfigError, match="reward must be"):
        gym.make("toolgym/FreeQA-v0", reward="llm")
    with pytest.raises(ConfigError, match="only used with reward='judge'"):
        gym.make("toolgym/FreeQA-v0", judge="http://x.test")


def test_search_judge_reward() -> None:
    pytest.importorskip("bm25s")
    env = gym.make("toolgym/Search-v0", num_passages=300, reward="judge", judge=scripted_judge(10), hops=1)
    env.reset(seed=1)
    inner = env.unwrapped
    gold = inner.task.answer[0]
    _, r, term, _, info = env.step(f"<answer>{gold} (I am sure)</answer>")
    assert term and r == 1.0 and not info["success"]  # the judge pays; success stays an exact match
    env.reset(seed=1)
    _, r, _, _, info = env.step(f"<answer>{gold}</answer>")
    assert r == 1.0 and info["success"]
