"""Rubric, the verl adapter called exactly as verl's reward manager calls it, and the OpenRLHF-shaped server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import numpy as np
import pytest

from tests.processes import start, stop
from toolgym.errors import ConfigError
from toolgym.rewards import Rubric, exact_match, math_match, single_answer, tag_balance, to_verl


async def async_len_bonus(completions, **kwargs):
    await asyncio.sleep(0)
    return [0.5 if len(c) < 40 else 0.0 for c in completions]


def test_rubric_weights_metrics_and_required():
    rubric = Rubric({"em": exact_match, "one": single_answer, "tags": tag_balance}, weights=[1.0, 0.5, 0.0])
    comps = ["<answer>Paris</answer>", "<answer>Rome</answer>", "<answer>Paris", "<answer>Paris</answer>"]
    result = rubric.score(comps, answer=["Paris", "Paris", "Paris", []])
    assert result.total == [1.5, 0.5, 0.0, None]
    assert result.parts["tags"] == [1.0, 1.0, 0.0, 1.0]  # weight 0: logged, not added
    metrics: dict[str, float] = {}
    extra: dict[str, list] = {}
    rubric(comps, answer=["Paris"] * 4, log_metric=metrics.__setitem__, log_extra=extra.__setitem__)
    assert metrics["rubric/em"] == 0.5 and extra["rubric/tags"] == [1.0, 1.0, 0.0, 1.0]
    assert rubric.score_one("<answer>Paris</answer>", answer="Paris") == (
        1.5,
        {"em": 1.0, "one": 1.0, "tags": 1.0},
    )


def test_rubric_async_parts_and_errors():
    rubric = Rubric([exact_match, async_len_bonus], weights=[1.0, 1.0])
    assert rubric(["<answer>a b</answer>"], answer=["a b"]) == [1.5]
    assert asyncio.run(rubric.ascore(["<answer>a b</answer>"], answer=["a b"])).total == [1.5]

    async def inside_a_loop():
        return rubric(["<answer>a b</answer>"], answer=["a b"])

    assert asyncio.run(inside_a_loop()) == [1.5]
    with pytest.raises(ConfigError):
        Rubric([exact_match], weights=[1.0, 2.0])
    with pytest.raises(ConfigError):
        Rubric([exact_match, exact_match])
    with pytest.raises(ConfigError):
        Rubric([exact_match], required=["nope"])


VERL_MODULE = """
from toolgym.rewards import Rubric, exact_match, math_match, single_answer, to_verl
compute_score = to_verl(Rubric({"correct": math_match, "format": single_answer}, weights=[1.0, 0.1]))
qa_score = to_verl(exact_match)
"""


def _verl_manager(compute_score, batch, reward_kwargs=None):
    """What verl's naive reward manager does per sample: keyword call, dict → 'score' + reward_extra_info."""
    reward_kwargs = reward_kwargs or {}
    rewards, extra_info = [], defaultdict(list)
    for item in batch:
        score = compute_score(
            data_source=item["data_source"],
            solution_str=item["response"],
            ground_truth=item["reward_model"]["ground_truth"],
            extra_info=item.get("extra_info"),
            **reward_kwargs,
        )
        if isinstance(score, dict):
            reward = score["score"]
            for key, value in score.items():
                extra_info[key].append(value)
        else:
            reward = score
        rewards.append(float(reward))
    return rewards, dict(extra_info)


def test_verl_adapter_as_verl_calls_it(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_MODULE)
    spec = importlib.util.spec_from_file_location("custom_module", path)  # verl's get_custom_reward_fn
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    batch = [
        {"data_source": "math_dapo", "response": "<think>…</think><answer>\\frac{1}{2}</answer>",
         "reward_model": {"ground_truth": "0.5"}, "extra_info": {"index": 0, "split": "train"}},
        {"data_source": "math_dapo", "response": "\\boxed{3}", "reward_model": {"ground_truth": "4"}, "extra_info": None},
        {"data_source": "math_dapo", "response": "\\boxed{3}", "reward_model": {"ground_truth": ""}},
    ]  # fmt: skip
    rewards, extra = _verl_manager(module.compute_score, batch, reward_kwargs={"sandbox_fusion_url": None})
    assert rewards == [1.1, 0.0, 0.0]
    assert extra["valid"] == [1.0, 1.0, 0.0] and extra["correct"] == [1.0, 0.0, 0.0]
    assert all(isinstance(v, float) for values in extra.values() for v in values)
    qa = [{"data_source": "searchR1_nq", "response": "<answer>Paris</answer>",
           "reward_model": {"ground_truth": {"target": np.array(["paris", "Paris, France"], dtype=object)}}}]  # fmt: skip
    assert _verl_manager(module.qa_score, qa)[0] == [1.0]
    import pickle

    assert pickle.loads(pickle.dumps(to_verl(math_match)))("x", "\\boxed{2}", "2")["score"] == 1.0


def _post(url, payload):
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_serve_reward_cli(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start(
        [sys.executable, "-m", "toolgym", "serve-reward", "--reward", "exact_match", "--reward", "tag_balance=0", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                body = _post(
                    url + "/get_reward", {"query": ["<answer>4</answer>"], "prompts": [""], "labels": ["4"]}
                )
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(proc.stderr.read() if proc.poll() is not None else "server did not answer")
        assert body["rewards"] == [1.0] and body["extra_logs"]["tag_balance"] == [1.0]
    finally:
        stop(proc)
    bad = subprocess.run(
        [sys.executable, "-m", "toolgym", "serve-reward", "--reward", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown reward 'nope'" in bad.stderr
