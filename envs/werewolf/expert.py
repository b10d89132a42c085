"""Werewolf-v0's expert: the ``strong`` scripted player in the learner's seat, its move written as the model
would write it (one tool call). It reads only what that seat may know (``agents.view_of``)."""

from __future__ import annotations

import json

import numpy as np

from toolgym.envs.werewolf.agents import strong_policy, view_of
from toolgym.envs.werewolf.rules import Move, WerewolfGame

TOOL_OF = {"kill": "kill", "inspect": "inspect", "protect": "protect", "vote": "vote", "speak": "say"}


def move_text(move: Move, action_format: str) -> str:
    """A move as model text.

    >>> move_text(Move(kind="vote", target="P3"), "tags")
    '<vote>P3</vote>'
    >>> move_text(Move(kind="speak", text="I suspect P2."), "hermes")
    '<tool_call>{"name": "say", "arguments": {"text": "I suspect P2."}}</tool_call>'
    """
    name = TOOL_OF[move.kind]
    value = move.text if move.kind == "speak" else str(move.target)
    if action_format == "tags":
        return f"<{name}>{value}</{name}>"
    key = "text" if move.kind == "speak" else "player"
    return f"<tool_call>{json.dumps({'name': name, 'arguments': {key: value}})}</tool_call>"


def expert_action(game: WerewolfGame, seat: str, rng: np.random.Generator, action_format: str) -> str:
    return move_text(strong_policy(view_of(game, seat), rng), action_format)
