"""What an env tells the model about acting: the system prompt's standard parts and the feedback after an
invalid action, for each action format (``ToolEnv.system_prompt`` and ``ToolEnv.format_feedback`` call
these; a family changes them by overriding those methods or ``instructions``/``example``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from toolgym.parsing import ANSWER_TOOL, ActionFormat, ParseResult
from toolgym.tools import Tool


def system_prompt(
    instructions: str,
    tools: Sequence[Tool],
    action_format: ActionFormat,
    prompt_format: str,
    example: str | None = None,
) -> str:
    """The instructions, then how to call the tools and how to answer in ``action_format``. The ``text``
    prompt format also lists the tools' schemas (no chat template carries them) and shows ``example``."""
    parts = [instructions]
    if action_format == "hermes":
        if prompt_format == "text" and tools:
            schemas = "\n".join(json.dumps(t.spec.to_dict()["function"]) for t in tools)
            parts.append(f"You may call these tools:\n{schemas}")
        if tools:
            parts.append(
                'To call a tool, write <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>; '
                "the result comes back in the next message."
            )
        parts.append("When you know the final answer, write it as <answer>ANSWER</answer>.")
        if example:
            parts.append(f"Example:\n{example}")
    elif action_format == "tags":
        for t in tools:
            first = next(iter(t.spec.parameters.get("properties", {})), "input")
            parts.append(f"<{t.name}>{first.upper()}</{t.name}>: {t.spec.description}")
        parts.append("When you know the final answer, write it as <answer>ANSWER</answer>.")
    return "\n\n".join(parts)


def format_feedback(parsed: ParseResult, tool_names: Sequence[str], action_format: ActionFormat) -> str:
    """What was wrong with an invalid action, and the expected format.

    >>> bad = ParseResult(text="?", error="no tool call or answer found.", error_kind="no_action")
    >>> format_feedback(bad, ["search"], "tags")
    'Invalid action: no tool call or answer found. Call a tool (<search>…</search>) or give the final answer as <answer>…</answer>.'
    """
    if action_format == "command":
        how = "Reply with one command."
    elif action_format == "tags":
        names = ", ".join(f"<{n}>…</{n}>" for n in tool_names)
        how = f"Call a tool ({names}) or give the final answer as <answer>…</answer>."
    else:
        names = ", ".join(n for n in tool_names if n != ANSWER_TOOL) or "none"
        how = (
            'Call a tool with <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> '
            f"(tools: {names}) or give the final answer as <answer>…</answer>."
        )
    return f"Invalid action: {parsed.error} {how}"
