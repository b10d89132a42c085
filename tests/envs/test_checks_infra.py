"""The env checks (envs/checks.py) tell an infrastructure error from a property of the env: an episode that hit
one (a sandbox that did not start under load) is played again with a warning, never reported as the env being
non-deterministic or its forks diverging; one that hits it every time fails naming the error; and a real
difference is still caught, naming where the two runs part."""

from __future__ import annotations

import itertools
import random
from typing import Any, ClassVar

import gymnasium as gym
import pytest

from tests.testing_env import CounterEnv
from toolgym.envs import checks
from toolgym.errors import InfrastructureError
from toolgym.tools import Tool


class FlakyCounterEnv(CounterEnv):
    """``add`` fails as infrastructure on some calls (``fail``: which call numbers, counted from ``calls``)."""

    calls: ClassVar[itertools.count[int]] = itertools.count()
    fail: ClassVar[Any] = staticmethod(lambda n: n in (1, 7, 20))

    def tools(self) -> list[Tool]:
        def add() -> str:
            """Add one to the count."""
            if type(self).fail(next(type(self).calls)):
                raise InfrastructureError("the sandbox did not start")
            self.episode.value += 1
            return str(self.episode.value)

        return [Tool(add)]


class BrokenCounterEnv(FlakyCounterEnv):
    fail = staticmethod(lambda n: True)


class RandomCounterEnv(CounterEnv):
    """Not deterministic: ``add`` answers a random number."""

    def tools(self) -> list[Tool]:
        def add() -> str:
            """Add one to the count."""
            self.episode.value += 1
            return f"{self.episode.value} ({random.random():.6f})"

        return [Tool(add)]


@pytest.fixture(autouse=True)
def _registered() -> None:
    for env_id, cls in (
        ("tests/FlakyCounter-v0", FlakyCounterEnv),
        ("tests/BrokenCounter-v0", BrokenCounterEnv),
        ("tests/RandomCounter-v0", RandomCounterEnv),
    ):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=cls, disable_env_checker=True)


@pytest.mark.parametrize(
    "run",
    [
        lambda: checks._determinism("tests/FlakyCounter-v0"),
        lambda: checks._fork("tests/FlakyCounter-v0"),
        lambda: checks.expert_success_rate("tests/FlakyCounter-v0", episodes=6) == 1.0 or 1 / 0,
    ],
    ids=["determinism", "fork", "expert"],
)
def test_an_infrastructure_error_is_played_again_not_a_difference(run: Any) -> None:
    FlakyCounterEnv.calls = itertools.count()
    with pytest.warns(UserWarning, match="infrastructure error, played again"):
        run()


def test_an_infrastructure_error_every_time_fails_naming_it() -> None:
    with (
        pytest.warns(UserWarning),
        pytest.raises(AssertionError, match="infrastructure error in each of 3 tries"),
    ):
        checks._determinism("tests/BrokenCounter-v0")
    failures: list[str] = []
    with pytest.warns(UserWarning):
        assert checks.expert_success_rate("tests/BrokenCounter-v0", episodes=2, failures=failures) == 0.0
    assert "the sandbox did not start" in failures[0]


def test_a_real_difference_is_reported_with_where_the_runs_part() -> None:
    with pytest.raises(AssertionError, match=r"seed 0: two runs of the same actions differ: step 0: "):
        checks._determinism("tests/RandomCounter-v0")
