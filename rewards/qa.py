"""Short-answer QA rewards: exact match and token F1 under SQuAD normalisation, against several gold aliases.

The answer is the one extracted by :func:`~toolgym.rewards.extract.extract_answer` (``<answer>`` tag first;
reasoning ignored). Hedging is not rewarded: several distinct answers, or more than ``max_answer_tags`` answer
tags, score 0; an empty answer never matches. Substring matching rewards the empty answer and answers that
list every candidate, so :func:`substring_match` exists only as an explicit opt-in.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable
from typing import Any

from toolgym.errors import ConfigError
from toolgym.rewards.extract import Several, completion_text, extract_answer, strip_reasoning

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_ANSWER_OPEN = "<answer>"


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, punctuation and articles removed, whitespace collapsed.

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    >>> normalize_answer("An apple, a day")
    'apple day'
    """
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _aliases(gold: Any) -> list[str]:
    try:
        return _alias_list(gold)
    except Exception:  # a gold whose str() fails has no usable alias: the reward is None
        return []


def _alias_list(gold: Any) -> list[str]:
    if gold is None:
        return []
    if isinstance(gold, dict):
        gold = gold.get("target", gold.get("aliases", gold.get("answer")))
    if hasattr(gold, "tolist"):  # numpy arrays, as verl's batches hold them
        gold = gold.tolist()
    if isinstance(gold, str):
        return [gold]
    if isinstance(gold, (list, tuple, set)):
        return [str(g) for g in gold if g is not None]
    return [str(gold)]


def _golds(kwargs: dict[str, Any], n: int) -> list[list[str]]:
    for key in ("answer", "solution", "ground_truth", "answers"):
        if kwargs.get(key) is not None:
            golds = list(kwargs[key])
            if len(golds) != n:
                raise ConfigError(
                    f"got {n} completions but {len(golds)} values of '{key}'; pass one per completion."
                )
            return [[a for a in _aliases(g) if normalize_answer(a)] for g in golds]
    raise ConfigError(
        "QA rewards need the gold answers as a dataset column named 'answer' (a string or a list of aliases)."
    )


def _prediction(completion: Any, several: Several, max_answer_tags: int, fallback: bool) -> str | None:
    text = completion_text(completion)
    if strip_reasoning(text).count(_ANSWER_OPEN) > max_answer_tags:
        return None
    answer = extract_answer(text, several, same=normalize_answer)  # "Paris" and "paris" are one answer
    if answer is None and fallback:
        answer = strip_reasoning(text)
    return answer


def token_f1_score(prediction: str, gold: str) -> float:
    """SQuAD token F1 between two strings.

    >>> token_f1_score("Eiffel Tower, Paris", "the Eiffel Tower")
    0.8
    >>> token_f1_score("", "x")
    0.0
    """
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _score(
    completions: list[Any],
    kwargs: dict[str, Any],
    compare: Callable[[str, str], float],
    several: Several,
    max_answer_tags: int,
    fallback: bool,
) -> list[float | None]:
    out: list[float | None] = []
    for completion, aliases in zip(completions, _golds(kwargs, len(completions)), strict=True):
        if not aliases:
            out.append(None)
            continue
        pred = _prediction(completion, several, max_answer_tags, fallback)
        if pred is None or not normalize_answer(pred):
            out.append(0.0)
            continue
        out.append(max(compare(pred, a) for a in aliases))
    return out


def exact_match(
    completions: list[Any],
    *,
    several: Several = "reject",
    max_answer_tags: int = 5,
    fallback: bool = False,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the normalised answer equals any gold alias (column ``answer``), else 0.0; None without gold.

    >>> exact_match(["<answer>the Eiffel tower</answer>", "<answer></answer>"], answer=[["Eiffel Tower", "tour Eiffel"], "x"])
    [1.0, 0.0]
    >>> exact_match(["<answer>Paris</answer>"], answer=[[]])
    [None]
    """
    return _score(
        completions,
        kwargs,
        lambda p, g: float(normalize_answer(p) == normalize_answer(g)),
        several,
        max_answer_tags,
        fallback,
    )


def token_f1(
    completions: list[Any],
    *,
    several: Several = "reject",
    max_answer_tags: int = 5,
    fallback: bool = False,
    **kwargs: Any,
) -> list[float | None]:
    """Best SQuAD token F1 of the answer against the gold aliases (column ``answer``); None without gold.

    >>> token_f1(["<answer>Eiffel Tower, Paris</answer>", "<answer>Louvre</answer>"], answer=["the Eiffel Tower", "Eiffel"])
    [0.8, 0.0]
    >>> token_f1(["<answer>x</answer><answer>y</answer>"], answer=["x"])
    [0.0]
    """
    return _score(completions, kwargs, token_f1_score, several, max_answer_tags, fallback)


def substring_match(
    completions: list[Any],
    *,
    several: Several = "reject",
    max_answer_tags: int = 5,
    fallback: bool = False,
    **kwargs: Any,
) -> list[float | None]:
    """Opt-in: 1.0 when a normalised gold alias occurs (on word boundaries) inside the normalised answer.
    Beware: an answer listing every candidate scores 1.0; the empty answer scores 0.0 here, never 1.0.

    >>> substring_match(["<answer>It is the Eiffel Tower.</answer>", "<answer></answer>"], answer=["Eiffel Tower", "x"])
    [1.0, 0.0]
    >>> substring_match(["<answer>Tower</answer>"], answer=["Eiffel Tower"])
    [0.0]
    """

    def contains(pred: str, gold: str) -> float:
        return float(f" {normalize_answer(gold)} " in f" {normalize_answer(pred)} ")

    return _score(completions, kwargs, contains, several, max_answer_tags, fallback)
