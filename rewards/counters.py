"""Counters of the events a reward does not score: unparseable gold, verifier timeouts, sandbox faults.

A reward returns None (skip) for these rather than 0, and counts them here so a run can see how often it
happens. When the trainer passes TRL's ``log_metric`` callable, the batch's count is logged as well.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

_COUNTS: Counter[str] = Counter()
_LOCK = threading.Lock()


def count(name: str, n: int = 1, log_metric: Callable[[str, float], Any] | None = None) -> None:
    """Add ``n`` to the counter ``name`` (e.g. ``"math/gold_unparseable"``) and log it when asked.

    >>> reset_counters(); count("demo/x", 2); count("demo/x"); counters()["demo/x"]
    3
    >>> count("demo/y", 0); "demo/y" in counters()
    False
    """
    if n <= 0:
        return
    with _LOCK:
        _COUNTS[name] += n
    if callable(log_metric):
        with contextlib.suppress(Exception):  # a logger must never break a reward
            log_metric(name, float(n))


def counters() -> dict[str, int]:
    """A snapshot of every counter since the last :func:`reset_counters`."""
    with _LOCK:
        return dict(_COUNTS)


def reset_counters() -> None:
    """Set every counter back to zero."""
    with _LOCK:
        _COUNTS.clear()
