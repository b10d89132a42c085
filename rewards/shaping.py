"""Shaped and turn-level rewards: stage-wise progressive shaping, and IGPO's information-gain turn reward.

IGPO (Information Gain-based Policy Optimization) rewards turn ``t`` of a multi-turn rollout by how much it
raised the policy's belief in the gold answer: ``r_t = p(gold | history_t) - p(gold | history_{t-1})``, with
``history_0`` the prompt and ``p`` the probability the policy assigns to the gold answer's tokens when teacher
forced after the history. The trainer owns the model, so the probability comes from a ``scorer`` callback
``scorer(messages, gold) -> log p(gold | messages)``; everything here is pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from toolgym.errors import ConfigError
from toolgym.rewards.extract import completion_text, extract_answer

RewardFn = Callable[..., list[float | None]]
Scorer = Callable[[list[dict[str, Any]], str], float]


def has_answer(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when a final answer can be extracted (``<answer>``, ``\\boxed{}``, "Answer:"; not in ``<think>``).

    >>> has_answer(["\\\\boxed{3}", "<think><answer>3</answer></think>"])
    [1.0, 0.0]
    >>> has_answer(["Answer: 4", "four"])
    [1.0, 0.0]
    """
    return [1.0 if extract_answer(completion_text(c)) is not None else 0.0 for c in completions]


class Progressive:
    """Stage-wise shaping: the reward is the value of the last stage passed, checking stages in order and
    stopping at the first that fails, e.g. parseable (0.1) → well-formed (0.3) → correct (1.0).

    A stage passes when its function gives ≥ ``threshold``; a None (not applicable) passes an intermediate
    stage, and a None from the last stage makes the whole reward None (e.g. unparseable gold).

    >>> from toolgym.rewards.format import single_answer
    >>> from toolgym.rewards.qa import exact_match
    >>> shaped = Progressive([(has_answer, 0.1), (single_answer, 0.3), (exact_match, 1.0)])
    >>> shaped(["no answer", "\\\\boxed{Paris}", "<answer>Rome</answer>", "<answer>Paris</answer>"], answer=["Paris"] * 4)
    [0.0, 0.1, 0.3, 1.0]
    >>> shaped(["<answer>Paris</answer>"], answer=[[]])
    [None]
    """

    def __init__(
        self, stages: Sequence[tuple[RewardFn, float]], threshold: float = 1.0, name: str = "progressive"
    ):
        if not stages:
            raise ConfigError("Progressive needs at least one (reward function, value) stage.")
        self.stages = list(stages)
        self.threshold = threshold
        self.__name__ = name

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        rewards: list[float | None] = [0.0] * n
        alive = list(range(n))
        for k, (fn, value) in enumerate(self.stages):
            if not alive:
                break
            scores = fn([completions[i] for i in alive], **_subset(kwargs, alive, n))
            still = []
            for i, s in zip(alive, scores, strict=True):
                if s is None:
                    if k == len(self.stages) - 1:
                        rewards[i] = None
                    else:
                        still.append(i)
                elif s >= self.threshold:
                    rewards[i] = value
                    still.append(i)
            alive = still
        return rewards


def _subset(kwargs: dict[str, Any], keep: list[int], n: int) -> dict[str, Any]:
    """Per-completion columns cut to ``keep``; everything else (callables, settings) passed as is."""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if isinstance(value, (list, tuple)) and len(value) == n and not isinstance(value, str):
            out[key] = [value[i] for i in keep]
        else:
            out[key] = value
    return out


def split_turns(completion: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Cut a conversational completion into turns: an assistant message plus the env messages after it.

    >>> [len(t) for t in split_turns([{"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}])]
    [2, 1]
    >>> split_turns([])
    []
    """
    turns: list[list[dict[str, Any]]] = []
    for message in completion:
        if message.get("role") == "assistant" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


def information_gain(
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    gold: str,
    scorer: Scorer,
    space: Literal["prob", "logprob"] = "prob",
    outcome: float | None = None,
) -> list[float]:
    """IGPO turn rewards of one rollout: for each turn, the gain in ``p(gold | history)`` it brought
    (``space="logprob"`` takes differences of log-probabilities instead). With ``outcome`` given, the last
    turn (the answer) gets the outcome reward instead of its gain, as in IGPO.

    >>> values = {0: math.log(0.1), 2: math.log(0.4), 3: math.log(0.3)}  # log p(gold) after k messages
    >>> fake = lambda messages, gold: values[len(messages) - 1]           # prompt = 1 message
    >>> conv = [{"role": "assistant", "content": "search"}, {"role": "tool", "content": "hit"},
    ...         {"role": "assistant", "content": "<answer>x</answer>"}]
    >>> [round(r, 6) for r in information_gain([{"role": "user", "content": "q"}], conv, "x", fake)]
    [0.3, -0.1]
    >>> [round(r, 6) for r in information_gain([{"role": "user", "content": "q"}], conv, "x", fake, outcome=1.0)]
    [0.3, 1.0]
    """
    if not isinstance(completion, list):
        raise ConfigError("information_gain needs a conversational completion (a list of chat messages).")
    transform = math.exp if space == "prob" else (lambda v: v)
    history = list(prompt)
    before = transform(scorer(history, gold))
    gains: list[float] = []
    for turn in split_turns(completion):
        history = history + turn
        after = transform(scorer(history, gold))
        gains.append(after - before)
        before = after
    if outcome is not None and gains:
        gains[-1] = outcome
    return gains


def information_gain_rewards(
    completions: list[list[dict[str, Any]]],
    *,
    prompts: list[list[dict[str, Any]]],
    answer: list[str],
    scorer: Scorer,
    space: Literal["prob", "logprob"] = "prob",
    outcomes: list[float | None] | None = None,
    **kwargs: Any,
) -> list[list[float]]:
    """:func:`information_gain` over a batch (turn rewards per rollout, not one float: for turn-level
    advantage estimators, not for TRL's ``reward_funcs``).

    >>> fake = lambda messages, gold: math.log(0.5) if len(messages) > 1 else math.log(0.25)
    >>> information_gain_rewards([[{"role": "assistant", "content": "a"}]], prompts=[[{"role": "user", "content": "q"}]],
    ...                          answer=["x"], scorer=fake)
    [[0.25]]
    """
    outcomes = outcomes if outcomes is not None else [None] * len(completions)
    return [
        information_gain(p, c, str(g), scorer, space, o)
        for p, c, g, o in zip(prompts, completions, answer, outcomes, strict=True)
    ]
