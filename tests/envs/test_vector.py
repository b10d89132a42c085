"""toolgym.make_vec: gymnasium's vector API over toolgym envs, sync and async, SAME_STEP autoreset."""

import gymnasium as gym
import numpy as np
import pytest

import toolgym
from toolgym.errors import ConfigError
from toolgym.vector import check_vector, make_vec

CALC = "toolgym/Calculator-v0"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_check_vector_passes(mode):
    check_vector(CALC, n=3, mode=mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_same_step_autoreset_and_per_env_infos(mode):
    vec = toolgym.make_vec(CALC, 2, mode=mode)
    try:
        obs, infos = vec.reset(seed=[5, 6])
        assert isinstance(obs, tuple) and len(obs) == 2
        assert [m["role"] for m in obs[0]] == ["system", "user"]
        assert vec.env_infos[1]["tools"][0]["function"]["name"] == "calculator"
        assert list(infos["_task_id"]) == [True, True]
        answers = list(vec.call("expert_action"))
        # env 0 answers wrongly at once; env 1 calls the calculator
        obs, rewards, terms, truncs, infos = vec.step(["<answer>-1</answer>", answers[1]])
        assert list(terms) == [True, False] and list(truncs) == [False, False]
        assert rewards[0] == 0.0
        # the ended env was reset in the same step: a new task's first messages, the old info kept
        assert [m["role"] for m in obs[0]] == ["system", "user"]
        assert vec.env_infos[0]["final_info"]["success"] is False
        assert vec.env_infos[0]["turn"] == 0 and "tools" in vec.env_infos[0]
        assert list(infos["_final_info"]) == [True, False]
        assert obs[1][0]["role"] == "tool" and vec.env_infos[1]["turn"] == 1
        obs, rewards, terms, _, _ = vec.step(list(vec.call("expert_action")))
        assert terms[1] and rewards[1] == 1.0 and vec.env_infos[1]["final_info"]["success"] is True
    finally:
        vec.close()


def test_sync_and_async_agree():
    results = {}
    for mode in ("sync", "async"):
        vec = make_vec(CALC, 3, mode=mode, digits=3)
        try:
            first, _ = vec.reset(seed=11)
            steps = [vec.step(list(vec.call("expert_action"))) for _ in range(3)]
            results[mode] = (first, [(s[0], s[1].tolist(), s[2].tolist()) for s in steps])
        finally:
            vec.close()
    assert results["sync"] == results["async"]


def test_next_step_mode_is_gymnasiums():
    vec = make_vec(CALC, 1, autoreset_mode="next_step")
    try:
        vec.reset(seed=0)
        _, _, terms, _, _ = vec.step(["<answer>0</answer>"])
        assert terms[0]
        obs, reward, terms, _, _ = vec.step(["ignored: this step resets"])
        assert [m["role"] for m in obs[0]] == ["system", "user"] and reward[0] == 0.0 and not terms[0]
    finally:
        vec.close()


def test_per_env_kwargs_and_async_split_step():
    vec = make_vec(CALC, 2, mode="async", env_kwargs=[{"max_turns": 1}, {"max_turns": 4}])
    try:
        vec.reset(seed=0)
        vec.step_async(["no tags here", "no tags here"])
        _, rewards, _, truncs, _ = vec.step_wait()
        assert list(truncs) == [True, False]
        assert np.allclose(rewards, [-0.1, -0.1])
        assert vec.env_infos[0]["final_info"]["truncation"] == "turn_limit"
    finally:
        vec.close()


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="mode"):
        make_vec(CALC, 2, mode="threads")
    with pytest.raises(ConfigError, match="unknown env id"):
        make_vec("toolgym/Nope-v0", 2)
    with pytest.raises(ConfigError, match="n must be"):
        make_vec(CALC, 0)
    with pytest.raises(ConfigError, match="autoreset_mode"):
        make_vec(CALC, 1, autoreset_mode="later")
    assert isinstance(make_vec(CALC, 1).single_observation_space, type(gym.make(CALC).observation_space))


def test_async_envs_step_one_at_a_time():
    """Continuous batching: each env steps when its own turn is ready, in any order; the results are those
    of a batch step."""
    batch = make_vec(CALC, 3, mode="sync")
    vec = make_vec(CALC, 3, mode="async")
    try:
        batch.reset(seed=4)
        vec.reset(seed=4)
        expected = batch.step(list(batch.call("expert_action")))
        actions = list(vec.call("expert_action"))
        for i in (2, 0):
            vec.send(i, actions[i])
        with pytest.raises(RuntimeError, match="in flight"):
            vec.step(actions)
        while len(ready := vec.ready(timeout=5)) < 2:
            pass
        assert ready == [0, 2]
        vec.send(1, actions[1])
        results = {i: vec.recv(i) for i in (2, 1, 0)}
        for i in range(3):
            obs, reward, term, trunc, info = results[i]
            assert obs == expected[0][i] and reward == expected[1][i]
            assert term == expected[2][i] and trunc == expected[3][i]
            assert vec.env_infos[i]["turn"] == info["turn"] == 1
        # an answer ends env 0's episode: SAME_STEP autoreset in the worker, the old info kept
        vec.send(0, "<answer>-5</answer>")
        obs, reward, term, _, info = vec.recv(0)
        assert term and info["final_info"]["success"] is False and obs[0]["role"] == "system"
        _, _, terms, _, _ = vec.step(list(vec.call("expert_action")))  # batch steps work again
        assert list(terms) == [False, True, True]
    finally:
        batch.close()
        vec.close()


def test_toolgym_check_runs_the_vector_check():
    from toolgym.envs.checks import check

    report = check(CALC, garbage_actions=5, expert_episodes=2)
    assert report.passed.get("vector") is True, report.errors.get("vector")
