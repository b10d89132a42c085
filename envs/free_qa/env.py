"""toolgym/FreeQA-v0: open questions answered in free form, graded by token F1 or by a judge model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from toolgym.envs.base import Task, ToolEnv
from toolgym.envs.free_qa.expert import expert_action
from toolgym.errors import ConfigError
from toolgym.jsonl import bad_line, read_jsonl
from toolgym.rewards.qa import token_f1_score
from toolgym.tools import Tool

QUESTIONS = Path(__file__).with_name("questions.jsonl")
REWARDS = ("f1", "judge")


def answer(answer: str) -> str:
    """Give the final answer and end the episode.

    Args:
        answer: the answer, in a few words or a sentence.
    """
    return answer


def load_questions(path: str | Path) -> list[dict[str, str]]:
    """Rows ``{"question", "reference"}`` (``id`` optional) of a JSONL file; a ConfigError names a bad line.

    >>> rows = load_questions(QUESTIONS); len(rows), sorted(rows[0])
    (32, ['id', 'question', 'reference'])
    """
    rows = []
    for n, row in read_jsonl(path, "questions file"):
        if not isinstance(row, dict) or not {"question", "reference"} <= set(row):
            raise bad_line(path, n, "a row needs 'question' and 'reference'")
        rows.append(
            {"id": str(row.get("id", f"row{n}")), **{k: str(row[k]) for k in ("question", "reference")}}
        )
    if not rows:
        raise ConfigError(f"{path} holds no questions")
    return rows


class FreeQAEnv(ToolEnv):
    """Open questions answered in free form, graded against a reference answer.

    ## Description
    Each episode is one question ("Why does a balloon filled with helium rise?") with a reference answer
    that a correct reply need not repeat word for word: the case for a judge model. 32 questions ship with
    the env (science, geography, arithmetic facts and one-sentence explanations); ``questions=PATH`` loads
    your own JSONL ``{"question", "reference"}`` rows.

    ## Action Space
    Text (or an assistant message with ``tool_calls``): the final answer as ``<answer>…</answer>`` or a call
    of the ``answer`` tool (Hermes format by default).

    ## Observation Space
    ``Messages``: the system prompt and the question on reset; feedback after an invalid action.

    ## Tools
    ``answer(answer)``: the final answer.

    ## Rewards
    ``correct``: with ``reward="f1"`` (default) SQuAD token F1 of the answer against the reference; with
    ``reward="judge"`` the score in [0, 1] a judge model gives it (``toolgym.rewards.judge``; the judge's
    ``check`` caps it when one is set). A judge that fails ends the episode as ``env_error``, never scored.
    ``format``: ``format_penalty`` (-0.1) on each invalid action. Success: ``correct >= success_at``.

    ## Starting State
    A question drawn with ``np_random`` from the bank.

    ## Episode End
    Terminated by a final answer. Truncated after ``max_turns`` turns (``turn_limit``; 2: an answer and
    one retry after an unreadable reply), by ``token_budget`` / ``time_limit_s``, or with ``env_error`` when
    the judge fails.

    ## Arguments
    ``reward`` ("f1" or "judge"), ``judge`` (a ``Judge``, a dict of ``toolgym.rewards.judge`` keywords
    such as ``{"base_url": "http://127.0.0.1:8000", "model": "m"}``, a URL, or None: ``$TOOLGYM_JUDGE_URL``),
    ``success_at`` (0.5), ``questions`` (None: the shipped bank), ``max_turns`` (2), ``format_penalty``,
    ``action_format``, ``prompt_format``, ``lenient_answers``.

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "qa"
    expert_success_rate: ClassVar[float] = 1.0
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")

    def __init__(
        self,
        *,
        reward: str = "f1",
        judge: Any = None,
        success_at: float = 0.5,
        questions: str | None = None,
        max_turns: int = 2,
        **kwargs: Any,
    ) -> None:
        if reward not in REWARDS:
            raise ConfigError(f"reward must be one of {REWARDS}, got {reward!r}")
        if not 0.0 < success_at <= 1.0:
            raise ConfigError(f"success_at must be in (0, 1], got {success_at}")
        self.reward = reward
        self.success_at = success_at
        self.rows = load_questions(questions or QUESTIONS)
        self.judge = None
        if reward == "judge":
            from toolgym.rewards.judge import as_judge

            self.judge = as_judge(judge)
        elif judge is not None:
            raise ConfigError("judge= is only used with reward='judge'")
        super().__init__(max_turns=max_turns, **kwargs)

    def tools(self) -> list[Tool]:
        return [Tool(answer)]

    def instructions(self) -> str:
        return "Answer the question correctly and briefly: a few words, or one sentence when it asks why."

    def example(self) -> str:
        return (
            "user: What is the boiling point of water at sea level in degrees Celsius?\n"
            "assistant: <answer>100 degrees Celsius</answer>"
        )

    def make_task(self) -> Task:
        row = self.rows[int(self.np_random.integers(len(self.rows)))]
        return Task(task_id=f"freeqa-{row['id']}", prompt=row["question"], answer=row["reference"])

    def check_answer(self, answer: str) -> dict[str, float]:
        if self.judge is not None:
            from toolgym.rewards.judge import judge_answer

            return {"correct": judge_answer(self.judge, self.task.prompt, answer, self.task.answer)}
        return {"correct": token_f1_score(answer, str(self.task.answer))}

    def is_success(self, components: dict[str, float]) -> bool:
        return components.get("correct", 0.0) >= self.success_at

    def expert_action(self) -> str:
        """The reference answer (a pipeline check: F1 1.0; a judge should agree)."""
        return expert_action(self.task)
