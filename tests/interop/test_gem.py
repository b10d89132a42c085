"""GEM's games (PyPI ``gem-llm``) as toolgym envs, driven through ``gem.make``: toolgym's env checks on a
sample, GEM's own observations and rewards, private RNGs (GEM seeds the global ones). gem-llm is an opt-in
extra (it pins reasoning-gym 0.1.23: ``toolgym[gem]`` holds its other dependencies, then ``pip install --no-deps
gem-llm==0.1.0``), so most of this file runs only where it is installed; the last test runs everywhere."""

import os
import random
import sys

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401
from tests import processes
from toolgym.envs import ENVS
from toolgym.envs.gem import GAMES, env_id, gem_id

# games with an expert (declared 1.0) and one without (2048: declared 0)
SAMPLE = [
    ("GuessTheNumber", "hard"),
    ("Mastermind", "easy"),
    ("TowerofHanoi", "easy"),
    ("Sudoku", "easy"),
    ("Minesweeper", "easy"),
    ("Game2048", "easy"),
]


def _needs_gem():
    return pytest.importorskip("gem")


def test_every_game_level_is_registered():
    ids = {env_id(g, lv) for g, levels in GAMES.items() for lv in levels}
    assert ids <= set(ENVS) and "toolgym/GEM-v0" in ENVS


@pytest.mark.parametrize(("game", "level"), SAMPLE)
def test_env_checks_on_a_sample(game, level):
    _needs_gem()
    from toolgym.envs.checks import check

    report = check(env_id(game, level))
    assert report.ok, report.errors


def test_observations_and_rewards_are_gems():
    gem = _needs_gem()
    env = gym.make(env_id("GuessTheNumber", "hard"))
    obs, _ = env.reset(seed=4)
    seed = env.unwrapped.task.data["seed"]
    game = gem.make(gem_id("GuessTheNumber", "hard"))
    random.seed(seed)
    np.random.seed(seed)
    first, info = game.reset(seed=seed)
    assert obs[1]["content"].startswith(first) and obs[1]["content"].endswith(info["suffix"])
    for guess in ("\\boxed{10}", "I guess \\boxed{30}", "no move"):
        expected = game.step(guess)
        got = env.step(guess)
        assert got[0][0]["content"].startswith(expected[0]) and got[1] == expected[1]
        if got[2]:
            break


def test_the_board_is_in_the_observation_and_seeds_vary_it():
    _needs_gem()
    env = gym.make(env_id("Sudoku", "easy"))
    prompts = {env.reset(seed=s)[0][1]["content"] for s in range(6)}
    assert len(prompts) > 1
    assert all("current board layout" in p for p in prompts)


def test_gem_runs_on_private_rngs():
    _needs_gem()
    env = gym.make(env_id("Game2048", "easy"))
    env.reset(seed=0)
    random.seed(123)
    before = random.random()
    random.seed(123)
    env.step("\\boxed{up}")  # 2048 draws a new tile from `random`
    assert random.random() == before


def test_generic_id_and_bad_input():
    _needs_gem()
    from toolgym.errors import ConfigError

    env = gym.make("toolgym/GEM-v0", env_id="game:Sudoku-v0-easy")
    obs, _ = env.reset(seed=0)
    assert "Sudoku" in obs[1]["content"]
    with pytest.raises(ConfigError, match="GEM has no env"):
        gym.make("toolgym/GEM-v0", env_id="game:Nope-v0").reset(seed=0)
    with pytest.raises(ConfigError, match="this id plays"):
        gym.make(env_id("Sudoku", "easy"), env_id="game:Sokoban-v0-easy")


def test_without_gem_a_reset_says_what_to_install():
    code = (
        "import sys; sys.modules['gem'] = None  # as if gem-llm were not installed\n"
        "import gymnasium as gym, toolgym\n"
        "env = gym.make('toolgym/GEM-Sudoku-easy-v0')\n"
        "try:\n    env.reset(seed=0)\nexcept toolgym.DependencyNotInstalled as exc:\n    print(exc)\n"
    )
    out = processes.run([sys.executable, "-c", code], timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "gem-llm is not installed" in out.stdout and "toolgym[gem]" in out.stdout
    assert "pip install --no-deps gem-llm==0.1.0" in out.stdout  # the recipe that downgrades nothing
    # gymnasium's own error class: code written for gymnasium's envs catches it
    assert issubclass(
        __import__("toolgym").DependencyNotInstalled, __import__("gymnasium").error.DependencyNotInstalled
    )
