"""Terminal-v0's scripted expert: the task's reference solution, one shell call per command, then submit."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolgym.envs.terminal.harbor import TerminalTask
from toolgym.messages import Message

SHELL, SUBMIT = "shell", "submit"


def expert_action(task: TerminalTask, transcript: Sequence[Message], action_format: str = "hermes") -> str:
    """The next command of ``task.solution`` not yet run (counted by the shell results in the transcript),
    then ``submit``. A Harbor task's is one command that runs its ``solve.sh``, staged by the env."""
    done = sum(1 for m in transcript if m.role == "tool" and m.name == SHELL)
    if done < len(task.solution):
        command = task.solution[done]
        if action_format == "tags":
            return f"<{SHELL}>{command}</{SHELL}>"
        return "<tool_call>" + json.dumps({"name": SHELL, "arguments": {"command": command}}) + "</tool_call>"
    if action_format == "tags":
        return f"<{SUBMIT}>done</{SUBMIT}>"
    return "<tool_call>" + json.dumps({"name": SUBMIT, "arguments": {"note": "done"}}) + "</tool_call>"
