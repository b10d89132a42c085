"""The text games' scripted expert: the engine's own walkthrough (gold path), replayed from the start of the
episode one command a turn. Each adapter stores the walkthrough in its episode when the game starts, so a
fork plays on from where it was forked."""

from __future__ import annotations

from collections.abc import Sequence


def walkthrough_action(gold: Sequence[str], turn: int, past_end: str = "look") -> str:
    """The walkthrough's command for ``turn`` (0-based); ``past_end`` once the walkthrough is used up.

    >>> walkthrough_action(["open door", "go north"], 1), walkthrough_action(["open door"], 1, "wait1")
    ('go north', 'wait1')
    """
    return gold[turn] if turn < len(gold) else past_end
