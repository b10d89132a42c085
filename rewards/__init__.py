"""Reward functions in TRL's form ``fn(completions, **kwargs) -> list[float | None]``."""

from toolgym.rewards.numeric import numeric_match, parse_number

__all__ = ["numeric_match", "parse_number"]
