"""A rubric: a weighted sum of reward functions, itself a reward function in TRL's form.

Weight 0 makes a part a logged metric: computed, returned and logged, but not added. Per-part values come back
from :meth:`Rubric.score` (and are logged through TRL's ``log_metric`` / ``log_extra`` when the trainer
passes them). Envs compute their terminal reward with :meth:`Rubric.score_one`, so training elsewhere with the
same rubric gives exactly the env's reward.

A part that returns None is not applicable to that completion and adds nothing. When a *required* part
returns None the total is None (skipped by the trainer); by default the required part is the first one with
a non-zero weight (the correctness check, whose None means "the gold cannot be scored").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolgym.errors import ConfigError

RewardFn = Callable[..., Any]


def _name(fn: RewardFn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", type(fn).__name__))


def _is_async(fn: RewardFn) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__dict__.get("__call__"))


def _run_sync(fn: RewardFn, completions: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
    """Call a reward function from sync code, awaiting it when it is ``async`` (also inside a running loop)."""
    if not _is_async(fn):
        return list(fn(completions, **kwargs))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return list(asyncio.run(fn(completions, **kwargs)))
    with concurrent.futures.ThreadPoolExecutor(1) as ex:  # a loop runs here: await it on another thread
        return list(ex.submit(asyncio.run, fn(completions, **kwargs)).result())


@dataclass(frozen=True)
class RubricResult:
    """Totals (one per completion) and each part's raw values, by part name."""

    total: list[float | None]
    parts: dict[str, list[float | None]]


class Rubric:
    """Weighted sum of reward functions ``fn(completions, **kwargs) -> list[float | None]``.

    >>> from toolgym.rewards.qa import exact_match
    >>> from toolgym.rewards.format import single_answer, tag_balance
    >>> rubric = Rubric({"em": exact_match, "format": single_answer, "tags": tag_balance}, weights=[1.0, 0.2, 0.0])
    >>> rubric(["<answer>Paris</answer>", "<answer>Rome</answer><answer>x</answer>"], answer=["Paris", "Paris"])
    [1.2, 0.0]
    >>> rubric.score(["<answer>Paris</answer>"], answer=[[]]).total
    [None]
    """

    def __init__(
        self,
        funcs: Sequence[RewardFn] | Mapping[str, RewardFn],
        weights: Sequence[float] | None = None,
        required: Sequence[str] | None = None,
        name: str = "rubric",
    ) -> None:
        items = list(funcs.items()) if isinstance(funcs, Mapping) else [(_name(f), f) for f in funcs]
        if not items:
            raise ConfigError("a Rubric needs at least one reward function.")
        names = [n for n, _ in items]
        if len(set(names)) != len(names):
            raise ConfigError(f"reward part names must differ, got {names}; pass a dict name -> function.")
        weights = [1.0] * len(items) if weights is None else [float(w) for w in weights]
        if len(weights) != len(items):
            raise ConfigError(f"{len(items)} reward functions but {len(weights)} weights.")
        self.names = names
        self.funcs = [f for _, f in items]
        self.weights = weights
        weighted = [n for n, w in zip(names, weights, strict=True) if w != 0]
        self.required = list(required) if required is not None else weighted[:1]
        unknown = set(self.required) - set(names)
        if unknown:
            raise ConfigError(f"required parts {sorted(unknown)} are not among the rubric's parts {names}.")
        self.__name__ = name

    def _combine(self, n: int, values: list[list[float | None]]) -> list[float | None]:
        total: list[float | None] = []
        for i in range(n):
            row = {name: vals[i] for name, vals in zip(self.names, values, strict=True)}
            if any(row[r] is None for r in self.required):
                total.append(None)
                continue
            s = sum(
                w * float(v)
                for w, v in zip(self.weights, row.values(), strict=True)
                if w != 0 and v is not None
            )
            total.append(round(s, 12))
        return total

    def _log(self, result: RubricResult, kwargs: dict[str, Any]) -> None:
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        for name, vals in result.parts.items():
            seen = [v for v in vals if v is not None]
            if callable(log_metric) and seen:
                log_metric(f"{self.__name__}/{name}", sum(seen) / len(seen))
            if callable(log_extra):
                log_extra(f"{self.__name__}/{name}", list(vals))

    def score(self, completions: list[Any], **kwargs: Any) -> RubricResult:
        """Totals and per-part values; logs the parts through ``log_metric``/``log_extra`` when given."""
        values: list[list[float | None]] = []
        for name, fn in zip(self.names, self.funcs, strict=True):
            out = _run_sync(fn, completions, kwargs)
            if len(out) != len(completions):
                raise ConfigError(
                    f"reward part '{name}' returned {len(out)} values for {len(completions)} completions."
                )
            values.append(out)
        result = RubricResult(
            self._combine(len(completions), values), dict(zip(self.names, values, strict=True))
        )
        self._log(result, kwargs)
        return result

    async def ascore(self, completions: list[Any], **kwargs: Any) -> RubricResult:
        """:meth:`score` for asyncio: parts run concurrently (sync ones in threads)."""

        async def one(fn: RewardFn) -> list[float | None]:
            if _is_async(fn):
                return list(await fn(completions, **kwargs))
            return list(await asyncio.to_thread(fn, completions, **kwargs))

        values = list(await asyncio.gather(*(one(f) for f in self.funcs)))
        result = RubricResult(
            self._combine(len(completions), values), dict(zip(self.names, values, strict=True))
        )
        self._log(result, kwargs)
        return result

    def score_one(self, completion: Any, **row: Any) -> tuple[float | None, dict[str, float | None]]:
        """One completion with scalar columns (``answer="4"``): the total and the parts (for an env's step)."""
        result = self.score([completion], **{k: [v] for k, v in row.items()})
        return result.total[0], {k: v[0] for k, v in result.parts.items()}

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        return self.score(completions, **kwargs).total
