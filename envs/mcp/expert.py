"""MCP-v0's scripted expert: the task's plan (turns of tool calls, computed from the catalog), then the
answer."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolgym.envs.base import Task
from toolgym.messages import Message


def expert_action(task: Task, transcript: Sequence[Message]) -> str:
    """The next turn of ``task.data["plan"]`` not yet played (counted by the assistant turns that called
    tools), then ``<answer>``."""
    plan = task.data["plan"]
    turns_done = sum(1 for m in transcript if m.role == "assistant" and m.tool_calls)
    if turns_done < len(plan):
        return "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in plan[turns_done])
    return f"<answer>{task.answer}</answer>"
