"""What an env author and a user meet: misspelt knobs, the fork check, ids from any namespace."""

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.cli import main
from toolgym.envs.base import Task, ToolEnv, knobs
from toolgym.envs.checks import _fork
from toolgym.errors import ConfigError, DependencyNotInstalled


def test_misspelt_knob_is_a_config_error_listing_the_knobs():
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) \['digitz'\].*digits.*max_turns"):
        gym.make("toolgym/Calculator-v0", digitz=3)


class _Forgetful(ToolEnv):
    """Counts steps in a field that get_state does not copy: the fork check must catch it."""

    family = "test"

    def __init__(self, *, start: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.start = start
        self.hidden = 0

    def make_task(self) -> Task:
        self.hidden = 0
        return Task("t", "say go twice", answer="go")

    def check_answer(self, answer: str) -> dict[str, float]:
        return {"correct": float(self.hidden >= 1)}

    def run_tool(self, call):
        self.hidden += 1
        return "ok"

    def tools(self):
        from toolgym.tools import Tool

        def go() -> str:
            """Go."""
            return "ok"

        return [Tool(go)]

    def expert_action(self) -> str:
        if self.hidden == 0:
            return '<tool_call>{"name": "go", "arguments": {}}</tool_call>'
        return "<answer>go</answer>"


def test_knobs_span_the_hierarchy_and_kwargs_forwarding():
    assert {"start", "max_turns", "prompt_format"} <= set(knobs(_Forgetful))
    with pytest.raises(ConfigError, match="strat"):
        _Forgetful(strat=1)


def test_fork_check_catches_a_field_the_state_forgets():
    gym.register("tests/Forgetful-v0", entry_point=_Forgetful, disable_env_checker=True)
    with pytest.raises(AssertionError, match="fork at turn 1"):
        _fork("tests/Forgetful-v0")


def test_check_accepts_ids_of_other_namespaces(capsys):
    gym.register("tests/Calc-v0", entry_point="toolgym.envs.calculator.env:CalculatorEnv")
    assert main(["check", "tests/Calc-v0", "--garbage", "5", "--expert-episodes", "2"]) == 0
    assert main(["check", "tests/Nope-v0"]) == 2
    assert "unknown env id" in capsys.readouterr().err


def test_dependency_not_installed_says_how():
    err = DependencyNotInstalled("bm25s", "search", why="the search index")
    assert isinstance(err, ImportError) and isinstance(err, ConfigError.__mro__[1])
    assert "pip install 'toolgym[search]'" in str(err)


class _Counter(_Forgetful):
    """The same env with its counter in ``self.episode``: forks carry it without any fork code."""

    def new_episode(self):
        return {"hidden": 0}

    def make_task(self) -> Task:
        return Task("t", "say go twice", answer="go")

    def check_answer(self, answer: str) -> dict[str, float]:
        return {"correct": float(self.episode["hidden"] >= 1)}

    def run_tool(self, call):
        self.episode["hidden"] += 1
        return "ok"

    def expert_action(self) -> str:
        if self.episode["hidden"] == 0:
            return '<tool_call>{"name": "go", "arguments": {}}</tool_call>'
        return "<answer>go</answer>"


def test_episode_state_forks_without_author_code():
    gym.register("tests/Counter-v0", entry_point=_Counter, disable_env_checker=True)
    _fork("tests/Counter-v0")
    env = gym.make("tests/Counter-v0").unwrapped
    env.reset(seed=0)
    env.step(env.expert_action())
    state = env.get_state()
    env.step(env.expert_action())
    assert env.episode == {"hidden": 1} and state["episode"] == {"hidden": 1}
    env.reset(seed=0)
    assert env.episode == {"hidden": 0}


def test_tool_specs_only_in_reset_info():
    env = gym.make("toolgym/Calculator-v0")
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator", "answer"]
    _, _, _, _, info = env.step("<answer>1</answer>")
    assert "tools" not in info
