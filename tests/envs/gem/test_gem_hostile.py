"""Hostile replies against every GEM id of the catalog: each is an observation and a penalty, never an exception
out of ``step`` and never ``env_error``. A reply that makes GEM's own step raise is an invalid move (format
penalty, game over); an exception that is not the reply's doing stays ``env_error`` (the rule is in
``GemEnv._raised``). gem-llm is opt-in (``toolgym.optional.GEM_INSTALL``): these skip where it is missing."""

import pickle
import random

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401
from toolgym.envs.gem import ENVS

pytest.importorskip("gem")

BIG = "9" * 5000  # past Python's 4300-digit int() limit
HOSTILE = {
    "empty": "",
    "blank": " \n\t ",
    "huge": "x" * 1_000_000,  # past the parser's cap (toolgym.parsing.MAX_ACTION_CHARS): never reaches GEM
    "long": "x" * 190_000,  # the rest reach GEM's step
    "long_open_box": "\\boxed{" + "1" * 190_000,
    "long_number_box": "\\boxed{" + "1" * 190_000 + "}",
    "long_word_box": "\\boxed{" + "a" * 190_000 + " 1 1}",
    "lone_surrogates": "\ud83d \\boxed{1 1 1}\udfff \\boxed{\ud800}",
    "nul": "\\boxed{1\x001}\x00",
    "arabic_digits": "\\boxed{\u0663 \u0664 \u0665}",
    "fullwidth_digits": "\\boxed{\uff11 \uff12}",
    "negative": "\\boxed{-1 -1 -1}",
    "zeros": "\\boxed{0 0 0}",
    "huge_one": "\\boxed{" + BIG + "}",
    "huge_three": "\\boxed{" + " ".join([BIG] * 3) + "}",
    "huge_cell": "\\boxed{" + BIG + " 1 A}",
    "huge_reveal": "\\boxed{reveal 1 " + BIG + "}",
    "limit_digits": "\\boxed{" + " ".join(["9" * 4300] * 3) + "}",
    "many_numbers": "\\boxed{" + " ".join(["1"] * 90_000) + "}",
    "unclosed": "\\boxed{",
    "brace_soup": "\\boxed{{}}} \\boxed}",
    "nested": "\\boxed{\\boxed{\\boxed{1}}}",
    "brackets": "[[[[{{{{((((" * 15_000,
    "many_boxes": "\\boxed{1}" * 19_000,
    "float": "\\boxed{1.5}",
    "not_text": ["not", "text"],
    "none": None,
}
IDS = sorted(ENVS)


def _ok(info: dict, env) -> None:
    assert info.get("truncation") != "env_error", info.get("infra_error")
    if info.get("gem_error"):
        assert info["invalid_action"] and info["reward_components"]["format"] == env.format_penalty


@pytest.mark.parametrize("env_id", IDS)
def test_hostile_replies_are_observations_never_env_errors(env_id):
    env = gym.make(env_id)
    env.reset(seed=3)  # one reset, then forks: Sokoban's harder levels take seconds per reset
    base = env.unwrapped
    starts = [base.get_state()]
    for _ in range(3):  # and a game in progress (the expert's moves; a fixed move where there is none)
        if env.step(base.expert_action())[2]:
            break
    else:
        starts.append(base.get_state())
    for start in starts:
        for name, reply in HOSTILE.items():
            base.set_state(start)
            obs, reward, terminated, truncated, info = env.step(reply)
            _ok(info, base)
            assert isinstance(reward, float) and obs, name
            if not (terminated or truncated):  # the same reply again, as a stuck policy would
                _ok(env.step(reply)[4], base)


def test_a_reply_gem_raises_on_is_an_invalid_move():
    env = gym.make("toolgym/GEM-Crosswords-easy-v0")
    env.reset(seed=1)
    random.seed(5)
    np.random.seed(5)
    before = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    obs, reward, terminated, truncated, info = env.step("\\boxed{" + BIG + " 1 A}")  # int() raises in GEM
    assert (random.random(), np.random.random()) == before  # the replay ran on scratch RNGs
    assert terminated and not truncated and not info["success"]
    assert info["invalid_action"] and "ValueError" in info["gem_error"]
    assert info["reward_components"] == {"gem": 0.0, "format": env.unwrapped.format_penalty}
    assert reward == env.unwrapped.format_penalty and info["episode_invalid_actions"] == 1
    assert "could not be played" in obs[0]["content"]


def _patch_step(monkeypatch, env, raise_when):
    """Make the game's step raise ``RuntimeError`` whenever ``raise_when(game, reply)``."""
    cls = type(env.unwrapped.episode.game)
    real = cls.step

    def step(self, action):
        if raise_when(self, action):
            raise RuntimeError("boom")
        return real(self, action)

    monkeypatch.setattr(cls, "step", step)


def _a_move(base, rng: random.Random) -> str:
    """A well-formed move, rarely a winning one (GEM's own sampler where it has a working one)."""
    game = base.episode.game
    if base.game_name == "Crosswords":  # its sampler writes a form its own parser does not read
        return f"\\boxed{{{rng.randrange(len(game.board))} {rng.randrange(len(game.board[0]))} {rng.choice('AEST')}}}"
    if base.game_name == "Sudoku":  # no sampler
        return f"\\boxed{{{rng.randint(1, game.scale)} {rng.randint(1, game.scale)} {rng.randint(1, game.scale)}}}"
    if base.game_name == "TowerofHanoi":  # no sampler
        return f"\\boxed{{{rng.choice('ABC')} {rng.choice('ABC')}}}"
    random.seed(rng.random())
    return game.sample_random_action()


@pytest.mark.parametrize("env_id", IDS)
def test_the_rebuilt_game_is_the_game_before_the_turn(env_id):
    """The verdict's replay: a fresh game, the seed and the moves give the live game's state and RNGs, in a
    second episode of a reused game too (2048 and Minesweeper draw from ``random`` as they play)."""
    env = gym.make(env_id)
    base = env.unwrapped
    rng = random.Random(0)
    for seed in (3, 4):
        env.reset(seed=seed)
        for _ in range(6):
            if env.step(_a_move(base, rng))[2]:
                break
    game, state = base._rebuilt()
    live = base.episode.game
    assert game is not live and state[0] == base.episode.rng[0]
    assert all(np.array_equal(state[1][i], base.episode.rng[1][i]) for i in range(len(state[1])))
    mine, theirs = vars(game), vars(live)
    assert mine.keys() == theirs.keys()
    assert [k for k in mine if pickle.dumps(mine[k]) != pickle.dumps(theirs[k])] == []


def test_a_fault_that_follows_the_reply_after_some_moves_is_the_models(monkeypatch):
    env = gym.make("toolgym/GEM-TowerofHanoi-easy-v0")
    env.reset(seed=0)
    # raises only from turn 3 on: the verdict needs the earlier moves replayed
    _patch_step(monkeypatch, env, lambda game, reply: "boom" in reply and game.turn_count >= 2)
    for _ in range(2):
        env.step(env.unwrapped.expert_action())
    _, _, terminated, _, info = env.step("\\boxed{A C} boom")
    assert terminated and info["invalid_action"] and "RuntimeError: boom" in info["gem_error"]
    assert info.get("truncation") is None


def test_a_game_that_fails_whatever_the_reply_is_an_env_error(monkeypatch):
    env = gym.make("toolgym/GEM-GuessTheNumber-easy-v0")
    env.reset(seed=0)
    _patch_step(monkeypatch, env, lambda game, reply: game.turn_count >= 0)  # every step, even an empty reply
    _, reward, _, truncated, info = env.step("\\boxed{5}")
    assert truncated and info["truncation"] == "env_error" and reward == 0.0
    assert "not of the reply" in info["infra_error"] and not info["invalid_action"]


def test_a_fault_that_does_not_come_back_is_an_env_error(monkeypatch):
    env = gym.make("toolgym/GEM-GuessTheNumber-easy-v0")
    env.reset(seed=0)
    calls: list[str] = []

    def first_call_only(game, reply):
        calls.append(reply)
        return len(calls) == 1

    _patch_step(monkeypatch, env, first_call_only)  # the replay's step with the same reply does not raise
    _, _, _, truncated, info = env.step("\\boxed{5}")
    assert truncated and info["truncation"] == "env_error"


def test_a_game_that_cannot_be_rebuilt_is_an_env_error(monkeypatch):
    env = gym.make("toolgym/GEM-GuessTheNumber-easy-v0")
    env.reset(seed=0)
    env.step("\\boxed{5}")
    _patch_step(monkeypatch, env, lambda game, reply: True)  # also fails the replayed earlier move
    _, _, _, truncated, info = env.step("\\boxed{6}")
    assert truncated and info["truncation"] == "env_error" and "could not be rebuilt" in info["infra_error"]


def test_a_fork_rebuilds_its_own_game():
    env = gym.make("toolgym/GEM-Crosswords-hard-v0")
    env.reset(seed=4)
    env.step("\\boxed{0 0 A}")
    fork = gym.make("toolgym/GEM-Crosswords-hard-v0")
    fork.reset(seed=9)
    fork.unwrapped.set_state(env.unwrapped.get_state())
    assert fork.unwrapped.episode.moves == ["\\boxed{0 0 A}"]
    info = fork.step("\\boxed{" + BIG + " 0 A}")[4]
    assert info["invalid_action"] and info.get("truncation") is None
