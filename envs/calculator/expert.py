"""Calculator-v0's scripted expert: call the calculator on the problem's expression (one step per call when
the calculator does one operation per call), then answer with the last result. It reads only the task and
the tool results so far, so it plays on from any point of an episode (forks, tests, SFT data)."""

from __future__ import annotations

from collections.abc import Sequence

from toolgym.envs.base import Task
from toolgym.messages import Message


def expert_action(task: Task, transcript: Sequence[Message], ops_per_call: int, action_format: str) -> str:
    """The next action as model text.

    >>> task = Task("t", "12 packs of 7 pens, then 5 more", 89, {"expression": "12 * 7 + 5", "steps": ["12 * 7", "84 + 5"]})
    >>> expert_action(task, [], 0, "tags"), expert_action(task, [], 1, "tags")
    ('<calculator>12 * 7 + 5</calculator>', '<calculator>12 * 7</calculator>')
    """
    results = [m.text for m in transcript if m.role == "tool" and m.name == "calculator"]
    done = [r for r in results if not r.startswith("Error")]
    steps = task.data["steps"]
    stepwise = ops_per_call > 0 and len(steps) > 1
    if done and (not stepwise or len(done) >= len(steps)):
        return f"<answer>{done[-1]}</answer>"
    # stepwise: each step's first operand is the previous result (the task's numbers agree)
    expression = steps[len(done)] if stepwise else task.data["expression"]
    if action_format == "tags":
        return f"<calculator>{expression}</calculator>"
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
