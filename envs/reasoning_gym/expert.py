"""The scripted expert of the reasoning-gym envs: it gives the dataset's gold answer (after printing it with
the python tool, in the multi-turn mode). A dataset whose gold does not score 1.0 under its own
``score_answer`` fails the expert check and gets no id of its own (see ``catalog.tsv``)."""

from __future__ import annotations

import json
from typing import Any


def gold(entry: dict[str, Any]) -> str:
    answer = entry.get("answer")
    return "" if answer is None else str(answer)


def expert_action(entry: dict[str, Any], *, python: bool, printed: bool, action_format: str) -> str:
    """One expert turn: the final answer, or first a python call printing it when the tool is on."""
    answer = gold(entry)
    if python and not printed:
        code = f"answer = {answer!r}\nprint(answer)"
        if action_format == "tags":
            return f"<python>{code}</python>"
        return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
    return f"<answer>{answer}</answer>"
