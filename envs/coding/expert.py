"""Coding-v0's scripted expert: run the visible tests on the task's canonical solution, then submit it. It
reads only the problem and the tool results so far, so it plays on from any point of an episode."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolgym.envs.coding.tasks import CodingProblem
from toolgym.errors import ConfigError
from toolgym.messages import Message

SUBMIT = "submit"


def expert_action(problem: CodingProblem, transcript: Sequence[Message], action_format: str) -> str:
    """The next action as model text; a ConfigError for a task without a canonical solution."""
    code = problem.canonical
    if code is None:
        raise ConfigError(f"task {problem.task_id} has no canonical solution for the expert")
    tested = any(m.role == "tool" and m.name == "run_tests" for m in transcript)
    name = SUBMIT if tested or not problem.visible else "run_tests"
    if action_format == "tags":
        return f"<{name}>\n{code}\n</{name}>"
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"
