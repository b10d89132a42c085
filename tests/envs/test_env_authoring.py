"""What an env author and a user meet: misspelt knobs, the fork check, ids from any namespace."""

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from tests.testing_env import COUNTER, Count, CounterEnv, register
from toolgym.cli import main
from toolgym.envs.base import Task, ToolEnv
from toolgym.envs.checks import _fork
from toolgym.envs.knobs import knobs
from toolgym.errors import ConfigError, DependencyNotInstalled, EnvStateError


def test_misspelt_knob_is_a_config_error_listing_the_knobs():
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) \['digitz'\].*digits.*max_turns"):
        gym.make("toolgym/Calculator-v0", digitz=3)


class _Forgetful(ToolEnv):
    """Counts its tool calls in a field of itself, outside ``self.episode``: a fork would lose the count."""

    family = "test"

    def __init__(self, *, start: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.start = start
        self.hidden = 0

    def make_task(self) -> Task:
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


class _Hiding(_Forgetful):
    """Hides the count inside a mutable container: no assignment to catch, so the fork check must."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.box = [0]

    def make_task(self) -> Task:
        self.box[0] = 0
        return super().make_task()

    def check_answer(self, answer: str) -> dict[str, float]:
        return {"correct": float(self.box[0] >= 1)}

    def run_tool(self, call):
        self.box[0] += 1
        return "ok"

    def expert_action(self) -> str:
        return (
            '<tool_call>{"name": "go", "arguments": {}}</tool_call>'
            if self.box[0] == 0
            else "<answer>go</answer>"
        )


def test_knobs_span_the_hierarchy_and_kwargs_forwarding():
    assert {"start", "max_turns", "prompt_format"} <= set(knobs(_Forgetful))
    with pytest.raises(ConfigError, match="strat"):
        _Forgetful(strat=1)


def test_a_forking_env_cannot_keep_episode_data_on_itself():
    env = _Forgetful()
    env.reset(seed=0)
    with pytest.raises(EnvStateError, match=r"_Forgetful set self.hidden during an episode"):
        env.step(env.expert_action())
    # an env that does not fork (a live engine or browser) may keep what it likes
    loose = type("_Loose", (_Forgetful,), {"supports_fork": False})()
    loose.reset(seed=0)
    assert loose.step(loose.expert_action())[1] == 0.0 and loose.hidden == 1
    # the guard is only up while the episode's hooks run: configuring the env between episodes is fine
    env.hidden = 5
    assert env.hidden == 5


def test_fork_check_catches_a_field_the_state_forgets():
    gym.register("tests/Hiding-v0", entry_point=_Hiding, disable_env_checker=True)
    with pytest.raises(AssertionError, match="fork at turn 2"):  # turn 0 has no action, turn 1 calls
        _fork("tests/Hiding-v0")


class _HidingVoid(_Hiding):
    """Counts turns with no action in a container and reports the count in every step's info: rewards and
    observations agree after a fork, only the info (after such a turn) shows what was lost."""

    def extra_info(self, info, ended):
        self.box[0] += int(info.get("parse_error") == "no_action")
        return {"void_turns": self.box[0]} if info["turn"] else {}

    def run_tool(self, call):
        return "ok"

    def expert_action(self) -> str:
        called = any(m.role == "tool" for m in self._transcript)
        return "<answer>go</answer>" if called else '<tool_call>{"name": "go", "arguments": {}}</tool_call>'


def test_fork_check_compares_infos_after_a_turn_with_no_action():
    gym.register("tests/HidingVoid-v0", entry_point=_HidingVoid, disable_env_checker=True)
    with pytest.raises(AssertionError, match="fork at turn 1 diverged"):
        _fork("tests/HidingVoid-v0")


def test_check_accepts_ids_of_other_namespaces(capsys):
    gym.register("tests/Calc-v0", entry_point="toolgym.envs.calculator.env:CalculatorEnv")
    assert main(["check", "tests/Calc-v0", "--garbage", "5", "--expert-episodes", "2"]) == 0
    assert main(["check", "tests/Nope-v0"]) == 2
    assert "unknown env id" in capsys.readouterr().err


def test_dependency_not_installed_says_how():
    err = DependencyNotInstalled("bm25s", "search", why="the search index")
    assert isinstance(err, ImportError) and isinstance(err, ConfigError.__mro__[1])
    assert "pip install 'toolgym[search]'" in str(err)


def test_episode_state_forks_without_author_code():
    register()
    _fork(COUNTER)  # the fork check at every turn of expert episodes: the count lives in self.episode
    env = gym.make(COUNTER).unwrapped
    env.reset(seed=0)
    env.step(env.expert_action())
    state = env.get_state()
    env.step(env.expert_action())
    assert env.episode == Count(2) and state["episode"] == Count(1)
    fork = gym.make(COUNTER).unwrapped
    fork.reset(seed=5)
    fork.set_state(state)
    assert [fork.step(fork.expert_action())[4]["count"] for _ in range(2)] == [2, 2]
    env.reset(seed=0)
    assert env.episode == Count(0)


def test_step_and_reset_are_final():
    # mypy reports a subclass that overrides them; families use the hooks instead
    assert ToolEnv.step.__final__ and ToolEnv.reset.__final__  # type: ignore[attr-defined]
    for name in ("extra_info", "decorate_observation", "new_episode", "make_task", "parse", "begin_episode"):
        assert getattr(ToolEnv, name).__doc__, name


@pytest.mark.slow  # seconds with CI's mypy cache (mypy runs first there), about a minute of CPU without
def test_mypy_rejects_an_env_that_overrides_step():
    api = pytest.importorskip("mypy.api")
    bad = "from typing import Any\nfrom envs.base import ToolEnv\n\n\nclass Bad(ToolEnv):\n"
    bad += "    def step(self, action: Any) -> Any:\n        return None\n"
    out, _, status = api.run(["--no-error-summary", "--follow-imports=silent", "-c", bad])
    assert status == 1 and 'Cannot override final attribute "step"' in out, out


class _Hooked(CounterEnv):
    """Records each extra_info call and marks every returned message."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls: list[tuple[int, bool]] = []  # a test's record, appended to (not episode data)

    def extra_info(self, info, ended):
        self.calls.append((info["turn"], ended))
        return {"count": self.episode.value, "turn": -1 if info["turn"] == 0 else info["turn"]}

    def decorate_observation(self, messages, ended):
        return [{**m, "ended": ended} for m in messages]


def test_extra_info_and_observation_hooks_run_once_per_reset_and_step():
    env = _Hooked(target=1)
    obs, info = env.reset(seed=0)
    assert info["turn"] == -1 and info["count"] == 0 and "tools" in info  # a returned key wins
    assert all(m["ended"] is False for m in obs)
    obs, *_, info = env.step(env.expert_action())
    assert obs[0]["ended"] is False and info["count"] == 1
    obs, _, terminated, _, info = env.step(env.expert_action())
    assert terminated and obs == [] and info["success"] and info["count"] == 1
    assert env.calls == [(0, False), (1, False), (2, True)]


def test_tool_specs_only_in_reset_info():
    env = gym.make("toolgym/Calculator-v0")
    _, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator", "answer"]
    _, _, _, _, info = env.step("<answer>1</answer>")
    assert "tools" not in info
