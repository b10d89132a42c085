"""PythonMath-v0's scripted expert: run the problem's own program with the python tool, then box the one
value it printed. It reads only the task and the tool results so far, so it plays on from any point of an
episode (forks, tests, SFT data)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolgym.envs.base import Task
from toolgym.messages import Message


def _looks_like_answer(output: str) -> bool:
    return bool(output) and "\n" not in output and not output.startswith("[") and "Error" not in output


def expert_action(task: Task, transcript: Sequence[Message], action_format: str) -> str:
    """The next action as model text.

    >>> expert_action(Task("t", "q", "3", {"code": "print(3)"}), [], "hermes")
    '<tool_call>{"name": "python", "arguments": {"code": "print(3)"}}</tool_call>'
    """
    outputs = [m.text.strip() for m in transcript if m.role == "tool" and m.name == "python"]
    if outputs and _looks_like_answer(outputs[-1]):
        return f"The program prints the exact value, so the answer is \\boxed{{{outputs[-1]}}}."
    code = task.data["code"]
    if action_format == "tags":
        return f"Let me compute it exactly.\n```python\n{code}\n```"
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
