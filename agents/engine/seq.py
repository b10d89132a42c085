"""A sequence of the engine (its ids, its cache slot, the turn being generated) and the engine's counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from toolgym.agents.engine.sampling import SampleMode

State = Literal["new", "queued", "active", "idle", "released"]


@dataclass(eq=False)
class Seq:
    """One sequence: its ids, its slot, and the turn being generated (``out``/``logprobs``/``entropies``)."""

    id: int
    ids: list[int]
    slot: int | None = None
    kv: int = 0
    state: State = "new"
    mode: SampleMode = field(default_factory=SampleMode)
    max_new: int = 0
    stop: tuple[str, ...] = ()
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish: str = ""
    tag: Any = None
    queued_at: int = 0  # the engine step at which the sequence was queued
    # the turn's sampling key (set by submit; sampling.py keyed_race): 0 draws from the engine's generator
    key: int = 0


@dataclass
class EngineStats:
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_steps: int = 0
    forked_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    graphs: int = 0
