"""reasoning-gym datasets, built once per process and settings, and drawn from with the env's ``np_random``.

reasoning-gym generates item ``i`` of a dataset from ``Random(seed + i)``, so an item is a pure function of
(task, config, seed, index): the env builds each dataset once with ``seed=0`` and draws the index.
Importing reasoning-gym takes seconds, so it happens here on first use, never on ``import toolgym``.
"""

from __future__ import annotations

import json
from typing import Any

from toolgym.errors import ConfigError
from toolgym.optional import require

_DATASETS: dict[tuple[str, str, int | None], Any] = {}
# sizes tried in turn when the user sets none: a few datasets cap their size (word_ladder: 20000)
DEFAULT_SIZES = (100_000, 20_000, 1_000)


def reasoning_gym() -> Any:
    """The ``reasoning_gym`` module, or DependencyNotInstalled naming the extra that brings it."""
    return require("reasoning_gym")


def registry_names() -> list[str]:
    """Every dataset name in the installed reasoning-gym's registry (imports reasoning-gym)."""
    reasoning_gym()  # first: importing the package fills the registry (and says what to install if missing)
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def dataset(task: str, config: dict[str, Any] | None = None, size: int | None = None) -> Any:
    """The reasoning-gym dataset ``task`` with config overrides ``config`` (cached per process); ``size``
    None takes the largest of ``DEFAULT_SIZES`` that the dataset accepts."""
    rg = reasoning_gym()
    key = (task, json.dumps(config or {}, sort_keys=True, default=str), size)
    if key not in _DATASETS:
        from reasoning_gym.factory import DATASETS

        if task not in DATASETS:
            raise ConfigError(f"reasoning-gym has no dataset {task!r}; known: {', '.join(sorted(DATASETS))}")
        error: Exception | None = None
        for n in (size,) if size is not None else DEFAULT_SIZES:
            try:
                _DATASETS[key] = rg.create_dataset(task, **{"seed": 0, "size": n, **(config or {})})
                break
            except (TypeError, ValueError, AssertionError) as exc:
                error = exc
        else:
            raise ConfigError(f"reasoning-gym rejected the config of {task!r}: {error}") from error
    return _DATASETS[key]


def describe(task: str) -> tuple[str, str]:
    """(category, one-line description) of a dataset, from its class (imports reasoning-gym)."""
    reasoning_gym()
    from reasoning_gym.factory import DATASETS

    cls = DATASETS[task][0]
    category = cls.__module__.split(".")[1] if cls.__module__.count(".") >= 2 else "other"
    doc = (cls.__doc__ or "").strip().splitlines()
    return category, (doc[0].strip() if doc else task)
