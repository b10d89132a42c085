"""toolgym/PythonMath-v0: math problems solved with a stateful Python interpreter (tool-integrated reasoning)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from toolgym.envs.base import Task
from toolgym.envs.coding.interpreter import Interpreter, InterpreterEnv, render, show_last_expression
from toolgym.envs.python_math.datasets import MathItem, load_math_dataset
from toolgym.envs.python_math.expert import expert_action
from toolgym.envs.python_math.generator import KINDS, check_options, make_problem
from toolgym.errors import ConfigError
from toolgym.messages import ToolCall
from toolgym.parsing import ParseResult, parse_hermes, parse_tags
from toolgym.rewards.extract import extract_boxed, strip_reasoning
from toolgym.rewards.math import math_match
from toolgym.sandboxes import Sandbox
from toolgym.tools import Tool

_DATASETS: dict[tuple[Any, ...], list[MathItem]] = {}


@dataclass
class PythonMathEpisode:
    bonus_given: float = 0.0  # tool bonus earned so far (capped per episode), paid with the final answer
    void_turns: int = 0  # turns with neither code nor an answer (``info["episode_void_turns"]``)
    last_ok: bool = False  # whether the python call just made ran without error (read by tool_reward)


def answer(answer: str) -> str:
    """Give the final answer and end the episode.

    Args:
        answer: the final answer (a number, a fraction such as 3/7, or a LaTeX expression).
    """
    return answer


class PythonMathEnv(InterpreterEnv):
    """Math problems solved by reasoning and running Python in a persistent interpreter (SimpleTIR, ToRL).

    ## Description
    Each episode is one math problem whose answer needs exact computation (large arithmetic, modular
    arithmetic, combinatorics, primes, fractions, linear systems, series) drawn from a seeded generator at a
    difficulty level, or a row of the user's dataset (GSM8K, MATH or any question/answer JSONL). The model
    runs Python as often as it likes (variables and imports persist within the episode), reads the output,
    and gives one final answer.

    ## Action Space
    Text (or an assistant message with ``tool_calls``). Code runs from any of: a ``python`` tool call
    (``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>`` or a native call), a fenced
    ```` ```python ```` block, or ``<python>…</python>``. The final answer is ``\\boxed{…}``,
    ``<answer>…</answer>`` or an ``answer`` tool call. ``action_format`` ("hermes" or "tags") only chooses
    which syntax the system prompt teaches; every form is read in both.

    ## Observation Space
    ``Messages``: on reset the system prompt and the problem; on each step the tool results (stdout, then
    stderr, cut to ``max_output_chars`` with a ``[... N characters truncated ...]`` marker), or feedback
    after an invalid action.

    ## Tools
    ``python(code)``: runs code in the episode's sandbox session (docker by default; see
    docs/sandboxes.md); prints, tracebacks and a bare last expression's repr come back.
    ``answer(answer)``: the final answer.

    ## Rewards
    ``correct``: 1.0 when the final answer is mathematically equal to the gold (``toolgym.rewards.math_match``:
    Math-Verify, so ``\\frac{3}{7}``, ``3/7`` and ``0.428571…`` forms are judged by value), else 0.
    ``format``: ``format_penalty`` (default -0.1) on each invalid action, including void turns.
    ``tool``: ``tool_bonus`` per python call that ran without error, at most ``tool_bonus_cap`` per episode
    (default 0: off), paid with the final answer: an episode that never answers earns none of it.

    ## Starting State
    A problem from ``make_problem(np_random, kinds, difficulty)``, or a dataset row drawn with ``np_random``
    (``reset(options={"index": i})`` picks row ``i``). The interpreter starts empty; its sandbox session
    opens at the first call.

    ## Episode End
    Terminated by a final answer. Truncated after ``max_turns`` (``turn_limit``), by ``token_budget`` /
    ``time_limit_s``, or by a sandbox fault (``env_error``: exclude the episode, it is not the model's
    failure). ``info["void_turn"]`` flags a turn with neither code nor an answer, and
    ``info["episode_void_turns"]`` counts them at the end (SimpleTIR filters such trajectories).

    ## Arguments
    ``difficulty`` (2; 1, 2, 3 or None for a mix), ``kinds`` (all of ``KINDS``), ``dataset`` (None, or a
    JSONL/JSON path or Hugging Face id; then ``dataset_split`` "test", ``dataset_config``,
    ``question_key``, ``answer_key``, ``dataset_limit``), ``max_turns`` (6), ``sandbox`` ("auto", "docker",
    "process" or a ``Sandbox``), ``sandbox_options`` (``Limits`` overrides such as ``{"pool_size": 32}``),
    ``call_timeout_s`` (10), ``max_output_chars`` (2000), ``tool_bonus`` (0.0), ``tool_bonus_cap`` (0.2),
    ``format_penalty`` (-0.1), ``action_format``, ``prompt_format``, ``token_budget``, ``time_limit_s``.

    ## Version History
    - v0: first version; later the opt-in tool bonus is paid with the final answer instead of at each call
      (the default reward, without a bonus, is unchanged).
    """

    family: ClassVar[str] = "code"
    expert_success_rate: ClassVar[float] = 1.0
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format", "tool")

    def __init__(
        self,
        *,
        difficulty: int | None = 2,
        kinds: tuple[str, ...] | list[str] | None = None,
        dataset: str | None = None,
        dataset_split: str = "test",
        dataset_config: str | None = None,
        question_key: str | None = None,
        answer_key: str | None = None,
        dataset_limit: int | None = None,
        max_turns: int = 6,
        sandbox: Sandbox | str | None = "auto",
        sandbox_options: dict[str, Any] | None = None,
        call_timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        tool_bonus: float = 0.0,
        tool_bonus_cap: float = 0.2,
        **kwargs: Any,
    ) -> None:
        self.kinds = tuple(kinds) if kinds is not None else KINDS
        self.difficulty = difficulty
        check_options(self.kinds, difficulty)
        if call_timeout_s <= 0 or max_output_chars < 100:
            raise ConfigError("call_timeout_s must be > 0 and max_output_chars >= 100")
        self.items: list[MathItem] | None = None
        if dataset is not None:
            key = (str(dataset), dataset_split, dataset_config, question_key, answer_key, dataset_limit)
            if key not in _DATASETS:
                _DATASETS[key] = load_math_dataset(
                    dataset,
                    split=dataset_split,
                    config=dataset_config,
                    question_key=question_key,
                    answer_key=answer_key,
                    limit=dataset_limit,
                )
            self.items = _DATASETS[key]
        self.call_timeout_s = call_timeout_s
        self.max_output_chars = max_output_chars
        self.tool_bonus = tool_bonus
        self.tool_bonus_cap = tool_bonus_cap
        self._interpreter: Interpreter = Interpreter(sandbox, sandbox_options, call_timeout_s)
        super().__init__(max_turns=max_turns, **kwargs)

    # ----- tools -------------------------------------------------------------------------------------------
    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter: variables and imports stay between calls. Returns
        what the code prints (and the value of a bare last expression), or the error's traceback.

        Args:
            code: Python source, e.g. "from math import comb\\nprint(comb(40, 12))".
        """
        result = self._interpreter.run(show_last_expression(code))
        self.episode.last_ok = result.ok
        return render(result, self.max_output_chars, self.call_timeout_s)

    def tools(self) -> list[Tool]:
        return [Tool(self.python, name="python"), Tool(answer)]

    def instructions(self) -> str:
        return (
            "Solve the math problem. You can run Python: the interpreter keeps variables and imports between "
            f"calls, shows what you print, and stops code after {self.call_timeout_s:g} s. Use it for exact "
            "computation (integers and fractions.Fraction are exact; floats are not). A ```python fenced "
            "block or <python>CODE</python> also runs code. Put the final answer in \\boxed{ANSWER}."
        )

    def example(self) -> str:
        call = json.dumps(
            {"name": "python", "arguments": {"code": "from math import comb\nprint(comb(30, 4))"}}
        )
        return (
            "user: How many ways are there to choose 4 items from 30 distinct items?\n"
            f"assistant: <tool_call>{call}</tool_call>\n"
            "tool: 27405\n"
            "assistant: The answer is \\boxed{27405}."
        )

    # ----- hooks ---------------------------------------------------------------------------------------
    def new_episode(self) -> PythonMathEpisode:
        return PythonMathEpisode()

    def make_task(self) -> Task:
        if self.items is not None:
            index = self._index if self._index is not None else int(self.np_random.integers(len(self.items)))
            if not 0 <= index < len(self.items):
                raise ConfigError(f"options['index'] must be in [0, {len(self.items)}), got {index}")
            item = self.items[index]
            code = f"answer = {item.answer!r}\nprint(answer)"
            return Task(f"pymath-data-{item.item_id}", item.question, item.answer, {"code": code})
        problem = make_problem(self.np_random, self.kinds, self.difficulty)
        digest = hashlib.sha1(problem.question.encode()).hexdigest()[:10]
        return Task(
            task_id=f"pymath-{problem.kind}-l{problem.level}-{digest}",
            prompt=problem.question,
            answer=problem.answer,
            data={"code": problem.code, "kind": problem.kind, "level": problem.level},
        )

    def parse(self, action: Any) -> ParseResult:
        """Any of the code syntaxes, and a ``\\boxed{}`` answer, whatever ``action_format`` is."""
        parsed = super().parse(action)
        if parsed.error_kind != "no_action":
            return parsed
        if isinstance(action, str):
            other = parse_hermes if self.action_format == "tags" else parse_tags
            alt = other(action, self._specs, self._call_counter)
            if alt.error_kind != "no_action":
                return alt
        boxed = extract_boxed(strip_reasoning(parsed.text))
        if boxed and boxed[-1].strip():
            return ParseResult(text=parsed.text, answer=boxed[-1].strip(), message=parsed.message)
        return parsed

    def format_feedback(self, parsed: ParseResult) -> str:
        if parsed.error_kind == "no_action":
            return (
                "Invalid action: no code and no final answer found. Run Python in a ```python block (or call "
                "the python tool), or give the final answer as \\boxed{ANSWER}."
            )
        return super().format_feedback(parsed)

    def check_answer(self, answer: str) -> dict[str, float]:
        score = math_match([f"<answer>{answer}</answer>"], answer=[self.task.answer])[0]
        # the tool bonus earned so far is paid with the answer: paid per call, a policy can farm it by running
        # code until the turn limit and never answering (what RL learnt on Calculator-v0)
        earned = self.episode.bonus_given
        return {"correct": float(score or 0.0), **({"tool": earned} if earned else {})}

    def tool_reward(self, call: ToolCall, output: str) -> dict[str, float]:
        # read once: a call that raised before python() recorded its result must not reuse the last one's flag
        ep = self.episode
        ran_ok, ep.last_ok = ep.last_ok, False
        if self.tool_bonus <= 0 or not ran_ok:
            return {}
        bonus = min(self.tool_bonus, max(0.0, self.tool_bonus_cap - ep.bonus_given))
        ep.bonus_given += bonus
        return {}  # paid with the final answer (check_answer)

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """A step's ``void_turn`` (no tool call and no answer), and the episode's count when it ends."""
        if info["turn"] == 0:  # reset's info
            return {}
        void = info.get("parse_error") == "no_action"
        self.episode.void_turns += int(void)
        out: dict[str, Any] = {"void_turn": void}
        if ended:
            out["episode_void_turns"] = self.episode.void_turns
        return out

    def expert_action(self) -> str:
        """Run the problem's program with the tool, then box what it printed."""
        return expert_action(self.task, self._transcript, self.action_format)
