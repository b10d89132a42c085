"""toolgym/Calculator-v0: arithmetic word problems with a calculator tool."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from toolgym.envs.base import Task, ToolEnv
from toolgym.envs.calculator.arithmetic import ArithmeticError_, evaluate, format_number
from toolgym.envs.calculator.expert import expert_action
from toolgym.envs.calculator.tasks import SPLITS, as_choices, make_problem
from toolgym.errors import ConfigError
from toolgym.messages import ToolCall
from toolgym.rewards.numeric import numeric_match
from toolgym.tools import Tool


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: plain arithmetic with numbers and + - * / // % ** and parentheses, e.g. "37*58".
    """
    try:
        return format_number(evaluate(expression))
    except ArithmeticError_ as exc:
        return f"Error: {exc}"


def answer(answer: str) -> str:
    """Give the final answer and end the episode.

    Args:
        answer: the final answer, a number.
    """
    return answer


def count_operations(expression: str) -> int:
    """How many binary operations an expression holds (0 when it does not parse: the tool reports that).

    >>> count_operations("(3 + 4) * 2"), count_operations("12")
    (2, 0)
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return 0
    return sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))


@dataclass
class CalculatorEpisode:
    bonus_given: float = 0.0  # tool bonus earned so far (capped per episode), paid with the final answer


def _draw(rng: Any, choices: tuple[int, ...]) -> int:
    """One of the choices; a single choice draws nothing (the task stream stays that of a plain int)."""
    return choices[int(rng.integers(len(choices)))] if len(choices) > 1 else choices[0]


# the worked example of the text prompt: one operation, or a chain in parentheses
EXAMPLES = ("single", "chain")


class CalculatorEnv(ToolEnv):
    """Arithmetic word problems solved with a calculator tool.

    ## Description
    Each episode is one word problem ("A crate holds 37 packs of 58 pens. How many pens…?") whose answer is a
    whole number. The model may call ``calculator`` any number of times, then gives the final answer.

    ## Action Space
    Text (or an assistant message with ``tool_calls``). Hermes format by default:
    ``<tool_call>{"name": "calculator", "arguments": {"expression": "37*58"}}</tool_call>``; the final answer
    is ``<answer>2146</answer>`` or a call of the ``answer`` tool.

    ## Observation Space
    ``Messages``: on reset the system prompt and the problem; on each step the new messages (tool results,
    or feedback after an invalid action).

    ## Tools
    ``calculator(expression)``: exact arithmetic (an AST walk over fractions; no ``eval``). With
    ``ops_per_call=k`` an expression of more than k operations is refused ("Error: …"), so a problem of
    several operations takes several calls, each on the last result: a multi-turn task where an early
    mistake spoils the answer (for credit assignment and branching studies).
    ``answer(answer)``: the final answer.

    ## Rewards
    ``correct``: 1.0 when the final answer equals the true value (``toolgym.rewards.numeric_match``).
    ``format``: ``format_penalty`` (default -0.1) on each invalid action.
    ``tool``: ``tool_bonus`` per successful calculator call, at most ``tool_bonus_cap`` in an episode
    (default 0: off), paid with the final answer: an episode that never answers earns none of it.

    ## Starting State
    A problem drawn with ``np_random``: ``num_ops`` operations on ``digits``-digit numbers. Either may be a
    list (``digits=[2, 3], num_ops=[1, 2]``): each task draws one of each, so one env mixes difficulties.
    Sentence templates come from ``split``: ``"train"``, the held-out ``"test"`` ones, or ``"all"``
    (``toolgym.envs.calculator.tasks``). Products of 3-digit numbers are where mental arithmetic fails and
    only the tool pays.

    ## Episode End
    Terminated when a final answer is given. Truncated after ``max_turns`` turns (``turn_limit``), or by
    ``token_budget`` / ``time_limit_s`` when set.

    ## Arguments
    ``digits`` (2; an int or a list), ``num_ops`` (1; an int or a list), ``split`` ("all", "train" or
    "test"), ``max_turns`` (4), ``tool_bonus`` (0.0), ``tool_bonus_cap`` (0.2), ``ops_per_call`` (0: no limit),
    ``format_penalty`` (-0.1), ``prompt_format`` ("tools" or "text"; "text" also shows a worked example),
    ``action_format`` ("hermes" or "tags"), ``example`` ("single": the text prompt's worked example is one
    operation; "chain": a two-step chain written with parentheses, ``(12 + 5) * 3``, which shows that the
    calculator keeps the usual order of operations), ``lenient_answers`` (False: when True, "Answer: N", a boxed N or
    "the answer is N" also end the episode, for small models that have not learned the tags yet).

    ## Version History
    - v0: first version; later: more templates per operation count, a train/test template split, and
      mixed digits/operation counts (the defaults draw the same kind of problem as before); then more
      templates (12 per operation for one operation, 10 per chained step) and ``ops_per_call``; the
      opt-in tool bonus is paid with the final answer instead of at each call (the default reward, without
      a bonus, is unchanged).
    """

    family: ClassVar[str] = "math"
    expert_success_rate: ClassVar[float] = 1.0
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format", "tool")

    def __init__(
        self,
        *,
        digits: int | Sequence[int] = 2,
        num_ops: int | Sequence[int] = 1,
        split: str = "all",
        max_turns: int = 4,
        tool_bonus: float = 0.0,
        tool_bonus_cap: float = 0.2,
        ops_per_call: int = 0,
        example: str = "single",
        **kwargs: Any,
    ) -> None:
        if example not in EXAMPLES:
            raise ConfigError(f"example must be one of {EXAMPLES}, got {example!r}")
        self.example_kind = example
        self.digit_choices = as_choices(digits, "digits", 1, 12)
        self.op_choices = as_choices(num_ops, "num_ops", 1, 8)
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        self.digits = digits
        self.num_ops = num_ops
        self.split = split
        self.tool_bonus = tool_bonus
        self.tool_bonus_cap = tool_bonus_cap
        if not isinstance(ops_per_call, int) or ops_per_call < 0:
            raise ConfigError(f"ops_per_call must be an int >= 0 (0: no limit), got {ops_per_call!r}")
        self.ops_per_call = ops_per_call
        super().__init__(max_turns=max_turns, **kwargs)

    def tools(self) -> list[Tool]:
        return [Tool(calculator), Tool(answer)]

    def example(self) -> str:
        def call(expression: str) -> str:
            if self.action_format == "tags":
                return f"<calculator>{expression}</calculator>"
            args = f'{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}'
            return f"<tool_call>{args}</tool_call>"

        if self.ops_per_call == 1:
            return (
                "user: Ada has 12 packs of 7 pens. Then she gets 5 more. How many pens does she have now?\n"
                f"assistant: {call('12 * 7')}\ntool: 84\nassistant: {call('84 + 5')}\ntool: 89\n"
                "assistant: <answer>89</answer>"
            )
        if self.example_kind == "chain":  # the order of a chain's steps kept with parentheses
            return (
                "user: Ada has 12 pens. Then she gets 5 more. Then the pile grows to 3 times its size. "
                "How many pens does she have now?\n"
                f"assistant: {call('(12 + 5) * 3')}\ntool: 51\nassistant: <answer>51</answer>"
            )
        return (
            "user: A bag holds 12 packs of 7 pens. How many pens are in the bag?\n"
            f"assistant: {call('12 * 7')}\ntool: 84\nassistant: <answer>84</answer>"
        )

    def system_prompt(self) -> str:
        prompt = super().system_prompt()
        # the tags format gets the worked example too (the base shows it for hermes only)
        if (
            self.custom_system_prompt is None
            and self.action_format == "tags"
            and self.prompt_format == "text"
        ):
            prompt += f"\n\nExample:\n{self.example()}"
        return prompt

    def instructions(self) -> str:
        text = (
            "You solve arithmetic word problems. Use the calculator tool for the arithmetic, "
            "then give the final answer as a number."
        )
        if self.ops_per_call == 1:
            text += " The calculator does one operation per call: work step by step."
        elif self.ops_per_call > 1:
            text += f" The calculator does at most {self.ops_per_call} operations per call."
        return text

    def new_episode(self) -> CalculatorEpisode:
        return CalculatorEpisode()

    def make_task(self) -> Task:
        rng = self.np_random
        digits, num_ops = _draw(rng, self.digit_choices), _draw(rng, self.op_choices)
        problem = make_problem(rng, digits, num_ops, self.split)
        digest = hashlib.sha1(problem.text.encode()).hexdigest()[:10]
        return Task(
            task_id=f"calc-d{digits}o{num_ops}-{digest}",
            prompt=problem.text,
            answer=problem.answer,
            data={
                "expression": problem.expression,
                "digits": digits,
                "num_ops": num_ops,
                "split": self.split,
                "steps": list(problem.steps),
            },
        )

    def check_answer(self, answer: str) -> dict[str, float]:
        score = numeric_match([answer], answer=[self.task.answer])[0]
        # the tool bonus earned so far is paid with the answer: paid per call, RL alone learnt to call the
        # tool until the turn limit and never answer (benchmarks/results/learning.md)
        earned = self.episode.bonus_given
        return {"correct": float(score or 0.0), **({"tool": earned} if earned else {})}

    def run_tool(self, call: ToolCall) -> str:
        if call.name == "calculator" and self.ops_per_call:
            n = count_operations(str(call.arguments.get("expression", "")))
            if n > self.ops_per_call:
                limit = "one operation" if self.ops_per_call == 1 else f"{self.ops_per_call} operations"
                return f"Error: this calculator does {limit} per call (got {n}); compute step by step"
        return super().run_tool(call)

    def tool_reward(self, call: ToolCall, output: str) -> dict[str, float]:
        if self.tool_bonus <= 0 or output.startswith("Error"):
            return {}
        bonus = min(self.tool_bonus, max(0.0, self.tool_bonus_cap - self.episode.bonus_given))
        self.episode.bonus_given += bonus
        return {}  # paid with the final answer (check_answer)

    def expert_action(self) -> str:
        """Call the calculator on the problem's expression (step by step under ``ops_per_call``), then
        answer with its result."""
        return expert_action(self.task, self._transcript, self.ops_per_call, self.action_format)


class CalculatorChainEnv(CalculatorEnv):
    """toolgym/CalculatorChain-v0: Calculator-v0 where the calculator does one operation per call.

    Problems of 2-3 operations on 2-3 digit numbers, so an episode is 2-3 calculator calls, each on the
    last result, then the answer: a multi-turn task where credit matters (a wrong first step spoils every
    later one). Every argument of ``CalculatorEnv`` applies; only these defaults differ.
    """

    def __init__(
        self,
        *,
        digits: int | Sequence[int] = (2, 3),
        num_ops: int | Sequence[int] = (2, 3),
        ops_per_call: int = 1,
        max_turns: int = 6,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            digits=digits, num_ops=num_ops, ops_per_call=ops_per_call, max_turns=max_turns, **kwargs
        )
