"""One parametrised test runs toolgym's env checks over every registered id, as Gymnasium's
tests/envs/test_envs.py runs check_env over its registry."""

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.envs import ENVS, list_envs
from toolgym.envs.checks import check

# ~90 MiniWoB ids share one code path and each check starts Chromium: the full check runs on a few
# (a solved task, one with no solver, Web-v0); tests/envs/test_web.py resets every id and runs the solvers
WEB_FULL_CHECK = {"toolgym/Web-v0", "toolgym/MiniWoB-click-button-v0", "toolgym/MiniWoB-email-inbox-v0"}
# ~100 reasoning-gym ids share one code path too: tests/interop/test_reasoning_gym.py checks a sample, and
# envs/reasoning_gym/catalog.tsv records the checks of every one (python -m toolgym.envs.reasoning_gym.catalog)
CHECKED = sorted(
    i
    for i in ENVS
    if (not i.startswith("toolgym/MiniWoB-") or i in WEB_FULL_CHECK)
    and (not i.startswith("toolgym/ReasoningGym-") or i == "toolgym/ReasoningGym-v0")
    and not i.startswith("toolgym/GEM-")  # gem-llm is opt-in: tests/interop/test_gem.py, where installed
)


@pytest.mark.parametrize("env_id", CHECKED)
def test_env_checks(env_id):
    report = check(env_id, garbage_actions=200, expert_episodes=20)
    assert report.ok, report.errors
    assert report.expert_success >= report.declared_success


def test_every_toolgym_id_is_listed():
    registered = {i for i in gym.registry if i.startswith("toolgym/")}
    assert registered == set(ENVS)
    infos = {e.id: e for e in list_envs()}
    assert set(infos) == registered
    for info in infos.values():
        assert info.description and info.family


def test_registered_envs_fork(env_id="toolgym/Calculator-v0"):
    env = gym.make(env_id)
    inner = env.unwrapped
    env.reset(seed=5)
    if not inner.supports_fork:
        pytest.skip("env cannot fork")
    first = inner.expert_action()
    env.step(first)
    state = inner.get_state()
    rest_a = env.step(inner.expert_action())
    transcript_a = inner.transcript
    inner.set_state(state)
    rest_b = env.step(inner.expert_action())
    assert rest_a[:4] == rest_b[:4]
    assert inner.transcript == transcript_a
