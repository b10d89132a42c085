"""Trainer adapters. TRL needs none: every toolgym reward already has TRL's form (``completions`` plus
``**kwargs`` columns, string or conversational completions, ``completion_ids``/``completions_ids``, ``async``
allowed). verl calls one sample at a time, ``compute_score(data_source, solution_str, ground_truth,
extra_info=None)``: :func:`to_verl` builds that function from ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolgym.rewards.rubric import Rubric, _run_sync

RewardFn = Callable[..., Any]


class VerlScore:
    """verl's ``compute_score`` around a toolgym reward (picklable, so verl's Ray workers can take it).

    ``ground_truth`` becomes the column ``gold_key`` (``"answer"`` by default); each ``extra_info`` entry
    becomes a column of the same name; ``data_source`` is passed as ``data_source``. A None (not applicable)
    becomes ``none_value``, since verl has no "skip"; the returned dict says so in ``valid``. A
    :class:`Rubric` returns ``{"score": total, part: value, …}`` so verl logs the parts.
    """

    def __init__(self, fn: RewardFn, gold_key: str = "answer", none_value: float = 0.0) -> None:
        self.fn = fn
        self.gold_key = gold_key
        self.none_value = none_value
        self.__name__ = "compute_score"

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, float]:
        columns = {k: [v] for k, v in (extra_info or {}).items()}
        columns.update({"data_source": [data_source], self.gold_key: [ground_truth]})
        if isinstance(self.fn, Rubric):
            result = self.fn.score([solution_str], **columns)
            total, parts = result.total[0], {k: v[0] for k, v in result.parts.items()}
        else:
            total, parts = _run_sync(self.fn, [solution_str], columns)[0], {}
        out = {
            "score": self.none_value if total is None else float(total),
            "valid": 0.0 if total is None else 1.0,
        }
        for name, value in parts.items():
            out[name] = self.none_value if value is None else float(value)
        return out


def to_verl(fn: RewardFn, gold_key: str = "answer", none_value: float = 0.0) -> VerlScore:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict`` (with
    ``"score"``) from a toolgym reward or :class:`Rubric`.

    >>> from toolgym.rewards.qa import exact_match
    >>> compute_score = to_verl(exact_match)
    >>> compute_score(data_source="nq", solution_str="<answer>Paris</answer>", ground_truth=["Paris", "paris, france"])
    {'score': 1.0, 'valid': 1.0}
    >>> compute_score("nq", "<answer>Paris</answer>", ground_truth=[], extra_info={"index": 3})["valid"]
    0.0
    """
    return VerlScore(fn, gold_key, none_value)
