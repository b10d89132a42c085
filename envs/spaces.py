"""Gymnasium spaces for chat environments.

Gymnasium's ``Text`` space accepts alphanumeric characters only and rejects real prompts, so toolgym has its
own: ``Messages`` (a list of OpenAI chat dicts) and ``ActionText`` (any string or assistant message).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

from toolgym.messages import Message

_ROLES = ("system", "user", "assistant", "tool")
_SAMPLE_PIECES = (
    "<tool_call>",
    "</tool_call>",
    '{"name": "calculator", "arguments": {"expression": "2+2"}}',
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "{",
    "}",
    '"',
    "7",
    " ",
    "\n",
    "hello",
    "```python\n",
    "```",
    "é",
    "\x00",
)


class Messages(Space[list[dict[str, Any]]]):
    """A list of chat messages; ``contains`` checks structure (roles, content types), not wording."""

    def __init__(self, max_messages: int = 10_000, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_messages = max_messages

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list) or len(x) > self.max_messages:
            return False
        for m in x:
            if not isinstance(m, dict) or m.get("role") not in _ROLES:
                return False
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                return False
        return True

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, Any]]:
        n = int(self.np_random.integers(0, 3))
        return [
            {"role": "user", "content": f"sample {int(self.np_random.integers(0, 1000))}"} for _ in range(n)
        ]

    def __repr__(self) -> str:
        return "Messages()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Messages) and other.max_messages == self.max_messages


class ActionText(Space[str]):
    """Any string (or an assistant ``Message``/dict). ``sample`` gives random fragments of tool syntax, so
    random actions exercise the parsers, not only the no-action path."""

    def __init__(self, max_length: int = 4096, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return len(x) <= self.max_length
        if isinstance(x, Message):
            return x.role == "assistant"
        return isinstance(x, dict) and x.get("role") == "assistant"

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, 12))
        idx = self.np_random.integers(0, len(_SAMPLE_PIECES), size=n)
        return "".join(_SAMPLE_PIECES[int(i)] for i in np.atleast_1d(idx))

    def __repr__(self) -> str:
        return f"ActionText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActionText) and other.max_length == self.max_length
