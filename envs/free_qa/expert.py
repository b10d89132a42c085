"""FreeQA-v0's scripted expert: the reference answer at once. A pipeline check, not a solver: it scores token
F1 1.0, and a judge should agree."""

from __future__ import annotations

from toolgym.envs.base import Task


def expert_action(task: Task) -> str:
    """The final answer tag holding the task's reference answer.

    >>> expert_action(Task("q1", "Who wrote Hamlet?", "William Shakespeare", {}))
    '<answer>William Shakespeare</answer>'
    """
    return f"<answer>{task.answer}</answer>"
