"""The engine adapters: TextWorld (generated, cached games), ScienceWorld and TextWorldExpress (JVMs reused
through the pool). Each test skips, with the reason, where its engine cannot run."""

from __future__ import annotations

import shutil
import time

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.envs.text_games.common import POOL
from toolgym.errors import ConfigError, DependencyNotInstalled


def needs(module: str, java: bool = False) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install 'toolgym[household]')")
    if java and shutil.which("java") is None:
        pytest.skip("no Java runtime (apt-get install default-jre-headless)")


def play_expert(env) -> dict:
    inner = env.unwrapped
    info: dict = {}
    for _ in range(inner.max_turns):
        _, _, term, trunc, info = env.step(inner.expert_action())
        if term or trunc:
            break
    return info


def test_textworld_games_are_generated_once_and_cached(tmp_path):
    needs("textworld")
    from toolgym.envs.text_games.textworld_env import game_file

    path = game_file(1, 0, tmp_path)
    assert path.exists() and path.with_suffix(".json").exists()
    start = time.perf_counter()
    assert game_file(1, 0, tmp_path) == path
    assert time.perf_counter() - start < 0.1
    env = gym.make("toolgym/TextWorld-v0", difficulty=1, games=1, cache_dir=str(tmp_path))
    obs, info = env.reset(seed=0)
    assert "$$" not in obs[1]["content"]  # the banner is dropped, the quest and the first room stay
    assert info["admissible_commands"] and info["gold_steps"] >= 1
    key = info["state_key"]
    *_, info2 = env.step("inventory")
    *_, info3 = env.step("inventory")
    assert info2["state_key"] == info3["state_key"] and isinstance(key, str)
    env.reset(seed=0)
    final = play_expert(env)
    assert final["success"] and final["episode_reward"] == pytest.approx(1.0)
    env.close()


def test_textworld_dense_score_and_knobs(tmp_path):
    needs("textworld")
    env = gym.make("toolgym/TextWorld-v0", difficulty=1, games=1, cache_dir=str(tmp_path), dense_rewards=True)
    env.reset(seed=0)
    info = play_expert(env)
    assert info["episode_reward_components"]["score"] == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        gym.make("toolgym/TextWorld-v0", difficulty=9)


def test_missing_engine_is_a_clear_error(monkeypatch):
    import sys

    # hidden as an uninstalled package is, whatever an earlier test imported (a None entry makes every
    # import of it fail; patching builtins.__import__ missed importlib and modules imported already)
    for name in [m for m in sys.modules if m == "textworld" or m.startswith("textworld.")] + ["textworld"]:
        monkeypatch.setitem(sys.modules, name, None)
    env = gym.make("toolgym/TextWorld-v0", cache_dir="/nonexistent-cache", games=1)
    with pytest.raises(DependencyNotInstalled, match=r"toolgym\[household\]"):
        env.reset(seed=0)


def test_engine_fault_is_an_env_error_not_a_model_failure():
    needs("textworld_express", java=True)
    env = gym.make("toolgym/TextWorldExpress-v0", games=["coin"])
    env.reset(seed=0)
    inner = env.unwrapped

    def broken(command):
        raise RuntimeError("the JVM went away")

    inner._step = broken
    _, reward, term, trunc, info = env.step("look around")
    assert trunc and not term and info["truncation"] == "env_error" and reward == 0.0
    assert "JVM went away" in info["infra_error"]
    env.close()


@pytest.mark.parametrize("game", ["cookingworld", "twc", "coin"])
def test_textworld_express_expert_wins(game):
    needs("textworld_express", java=True)
    env = gym.make("toolgym/TextWorldExpress-v0", games=[game])
    for seed in range(3):
        _, info = env.reset(seed=seed)
        assert info["admissible_commands"] == sorted(info["admissible_commands"])
        assert play_expert(env)["success"]
    env.close()


def test_jvm_is_reused_across_envs():
    needs("textworld_express", java=True)
    first = gym.make("toolgym/TextWorldExpress-v0", games=["coin"])
    first.reset(seed=0)
    engine = first.unwrapped._engine
    first.close()
    second = gym.make("toolgym/TextWorldExpress-v0", games=["coin"])
    second.reset(seed=1)
    assert second.unwrapped._engine is engine  # taken back from the pool, no new JVM
    second.close()
    assert POOL._idle["textworld_express"][-1] is engine
    with pytest.raises(ConfigError):
        gym.make("toolgym/TextWorldExpress-v0", games=["chess"])


@pytest.mark.slow
def test_scienceworld_expert_and_engine_reuse():
    needs("scienceworld", java=True)
    env = gym.make("toolgym/ScienceWorld-v0", tasks=["find-living-thing", "melt"])
    names = set()
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        names.add(info["task_id"].split("-train-")[0])
        assert obs[1]["content"].startswith("Your task is to")
        final = play_expert(env)
        assert final["success"], info["task_id"]
    engine = env.unwrapped._engine
    env.close()
    again = gym.make("toolgym/ScienceWorld-v0", tasks=["melt"], split="test")
    again.reset(seed=0)
    assert again.unwrapped._engine is engine
    again.close()
    with pytest.raises(ConfigError):
        gym.make("toolgym/ScienceWorld-v0", split="valid")
    bad = gym.make("toolgym/ScienceWorld-v0", tasks=["cook dinner"])
    with pytest.raises(ConfigError):
        bad.reset(seed=0)
    bad.close()
