"""Small envs for tests across the repo, built only from ``ToolEnv``'s hooks.

None of them overrides ``reset``/``step``/``get_state``/``set_state`` (``step`` and ``reset`` are final), so
a test that uses them exercises the base class's loop, bookkeeping and forking as every family does.

- ``VowelCountEnv`` (``tests/VowelCount-v0``): two turns with rewards that vary with every token, for
  trainer and rollout tests with a random tiny model.
- ``CounterEnv`` (``tests/Counter-v0``): a tool that counts, the count kept in ``self.episode``: the
  smallest env whose forks must carry per-episode state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from toolgym.envs.base import Task, ToolEnv
from toolgym.messages import ToolCall
from toolgym.parsing import ParseResult
from toolgym.tools import Tool

VOWEL_COUNT = "tests/VowelCount-v0"
COUNTER = "tests/Counter-v0"


class VowelCountEnv(ToolEnv):
    """Two turns. Turn 1: whatever the model writes is read as a call of the ``look`` tool, which answers
    ``ok`` (a tool message, so branching policies see a tool boundary). Turn 2: whatever it writes is the
    final answer, scored (sum of its character codes mod 7) / 6 so that rewards vary between rollouts of a
    random model; success above 0.1. No action is ever invalid."""

    family = "test"

    def __init__(
        self, *, max_turns: int = 2, system_prompt: str | None = "Say vowels.", **kwargs: Any
    ) -> None:
        super().__init__(max_turns=max_turns, system_prompt=system_prompt, **kwargs)

    def make_task(self) -> Task:
        n = int(self.np_random.integers(1000))
        return Task(task_id=str(n), prompt=f"Say vowels. Task {n}.")

    def tools(self) -> list[Tool]:
        def look() -> str:
            """Look around."""
            return "ok"

        return [Tool(look)]

    def parse(self, action: Any) -> ParseResult:
        text = str(action)
        if self.transcript_turns() == 0:
            return ParseResult(text=text, tool_calls=(ToolCall(id="call_0", name="look", arguments={}),))
        return ParseResult(text=text, answer=text)

    def check_answer(self, answer: str) -> dict[str, float]:
        return {"correct": (sum(map(ord, answer)) % 7) / 6}

    def is_success(self, components: dict[str, float]) -> bool:
        return components["correct"] > 0.1

    def expert_action(self) -> str:
        return "look" if self.transcript_turns() == 0 else "aeiou!"

    def transcript_turns(self) -> int:
        """Model turns taken so far in this episode."""
        return sum(m["role"] == "assistant" for m in self.transcript)


@dataclass
class Count:
    """The per-episode state of ``CounterEnv``: reset makes a fresh one, forks copy it."""

    value: int = 0


class CounterEnv(ToolEnv):
    """Call ``add`` until the count reaches ``target``, then answer the count. The count lives in
    ``self.episode``: forks carry it without any fork code."""

    family = "test"

    def __init__(self, *, target: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target

    def new_episode(self) -> Count:
        return Count()

    def make_task(self) -> Task:
        return Task("count", f"Call add {self.target} times, then answer the count.", answer=str(self.target))

    def tools(self) -> list[Tool]:
        def add() -> str:
            """Add one to the count."""
            self.episode.value += 1
            return str(self.episode.value)

        return [Tool(add)]

    def check_answer(self, answer: str) -> dict[str, float]:
        return {"correct": float(answer.strip() == str(self.episode.value) == self.task.answer)}

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        return {"count": self.episode.value}

    def expert_action(self) -> str:
        if self.episode.value < self.target:
            return '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
        return f"<answer>{self.episode.value}</answer>"


def register() -> None:
    """Registers the envs above under their ``tests/`` ids (once)."""
    for env_id, cls in ((VOWEL_COUNT, VowelCountEnv), (COUNTER, CounterEnv)):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=cls, disable_env_checker=True)
