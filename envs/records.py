"""The plain records the env loop passes around: a ``Task``, a model turn as an env read it (``ParsedAction``)
and what a command did to the world (``CommandOutcome``). ``toolgym.envs.base`` re-exports each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolgym.messages import Message
from toolgym.parsing import ActionFormat, ParseResult


@dataclass
class Task:
    """One task: the prompt the model sees, the hidden answer, and data for the world and the expert."""

    task_id: str
    prompt: str
    answer: Any = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedAction:
    """One model turn as an env's own parser read it (``ToolEnv.read_action``), to pass to that env's
    ``step`` in place of the raw action: ``step`` takes ``result`` as it is instead of parsing again.

    Trusted only where it was made: ``step`` uses ``result`` when ``stamp`` is the env's current one (the
    same env object, in the same state: ``reset``, ``step`` and ``set_state`` renew it, since a family's
    ``parse`` may read the episode and call ids count on) and ``action_format`` is the env's. Anything else
    (a turn read by another env or family, for a fork, or before another step) has ``raw`` parsed again,
    exactly as if the raw action had been passed."""

    raw: Any  # what the model gave: text, or an assistant message
    result: ParseResult
    action_format: ActionFormat
    stamp: object = field(default=None, repr=False, compare=False)

    def assistant_message(self) -> Message:
        """The assistant message ``step`` records for this turn (structured calls when there were any)."""
        return self.result.assistant_message()


@dataclass
class CommandOutcome:
    """What a command did to the world (command-format envs)."""

    observation: str
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    success: bool = False
