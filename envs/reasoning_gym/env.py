"""toolgym/ReasoningGym-v0 and toolgym/ReasoningGym-<task>-v0: reasoning-gym's tasks, scored by its verifiers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from toolgym.envs.base import Task
from toolgym.envs.coding.interpreter import Interpreter, InterpreterEnv, render, show_last_expression
from toolgym.envs.reasoning_gym import class_name, read_catalog, verify, working_tasks
from toolgym.envs.reasoning_gym.expert import expert_action
from toolgym.envs.reasoning_gym.tasks import dataset, registry_names
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.sandboxes import Sandbox
from toolgym.tools import Tool

TOOL_MODES = ("none", "python")


def answer(answer: str) -> str:
    """Give the final answer and end the episode.

    Args:
        answer: the final answer, in the form the question asks for.
    """
    return answer


class ReasoningGymEnv(InterpreterEnv):
    """reasoning-gym's procedurally generated reasoning tasks, scored by reasoning-gym's own verifiers.

    ## Description
    Each episode is one item of a reasoning-gym dataset (PyPI ``reasoning-gym``: arithmetic, algebra,
    logic, graphs, games, ciphers, ARC, … over 100 generators). By default the model answers in one turn;
    with ``tools="python"`` it may run Python in a sandbox session for several turns first.

    ## Action Space
    Text (or an assistant message with ``tool_calls``). The final answer is ``<answer>…</answer>`` (or
    the ``answer`` tool), written in the form the question asks for. With ``tools="python"``: a ``python``
    tool call (``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``), or
    ``<python>…</python>`` with ``action_format="tags"``.

    ## Observation Space
    ``Messages``: on reset the system prompt and the question (reasoning-gym's own text); on each step the
    tool results, or feedback after an invalid action.

    ## Tools
    ``answer(answer)``: the final answer. With ``tools="python"``: ``python(code)``, a persistent
    interpreter in the episode's sandbox session (docs/sandboxes.md).

    ## Rewards
    ``correct``: reasoning-gym's ``score_answer(answer, entry)`` for the dataset, in [0, 1] (some datasets
    give partial credit); success is a score of 1. A verifier that raises scores 0. The verifier runs in a
    worker process (``verify.py``) within 5 s: one that runs out of that time on the answer scores 0; a
    worker that cannot run it ends the episode as ``env_error``.
    ``format``: ``format_penalty`` (default -0.1) on each invalid action.

    ## Starting State
    Item ``i`` of the dataset built with ``config`` (reasoning-gym's config fields, e.g. difficulty
    ranges), seed 0 and ``size`` items (default: 100000, or less for a dataset that caps its size);
    ``i`` is drawn from ``np_random`` in ``[0, size)``, or set with
    ``reset(options={"index": i})``. A list of tasks draws one per episode.

    ## Episode End
    Terminated by a final answer. Truncated after ``max_turns`` as ``turn_limit``: 2 without tools (one
    answer, and one retry after a reply the parser could not read, e.g. without the tags), 6 with
    python; by ``token_budget`` / ``time_limit_s``; or by a sandbox fault (``env_error``).

    ## Arguments
    ``task`` (a dataset name or a list of names; fixed for the per-task ids), ``config`` (a dict of
    reasoning-gym config overrides), ``size`` (None: 100000 items, fewer where a dataset caps it), ``tools`` ("none" or "python"),
    ``max_turns``, ``sandbox`` ("auto", "docker", "process" or a ``Sandbox``), ``sandbox_options``,
    ``call_timeout_s`` (10), ``max_output_chars`` (2000), ``format_penalty``, ``action_format``,
    ``prompt_format``, ``lenient_answers``.

    ## Version History
    - v0: first version (reasoning-gym 0.1.25).
    """

    family: ClassVar[str] = "reasoning_gym"
    expert_success_rate: ClassVar[float] = 1.0
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")
    fixed_task: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        task: str | Sequence[str] | None = None,
        config: dict[str, Any] | None = None,
        size: int | None = None,
        tools: str = "none",
        max_turns: int | None = None,
        sandbox: Sandbox | str | None = "auto",
        sandbox_options: dict[str, Any] | None = None,
        call_timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        **kwargs: Any,
    ) -> None:
        if self.fixed_task is not None and task not in (None, self.fixed_task):
            raise ConfigError(
                f"this id plays {self.fixed_task!r}; use toolgym/ReasoningGym-v0 for task={task!r}"
            )
        names = task if task is not None else (self.fixed_task or "chain_sum")
        self.tasks = (names,) if isinstance(names, str) else tuple(names)
        if not self.tasks or not all(isinstance(t, str) for t in self.tasks):
            raise ConfigError(f"task must be a reasoning-gym dataset name or a list of names, got {task!r}")
        shipped = {row["task"] for row in read_catalog()}
        unknown = [t for t in self.tasks if t not in shipped]
        if unknown and not set(unknown) <= set(registry_names()):  # a newer reasoning-gym's dataset is fine
            raise ConfigError(f"unknown reasoning-gym task(s) {unknown}; working ones: {working_tasks()}")
        if tools not in TOOL_MODES:
            raise ConfigError(f"tools must be one of {TOOL_MODES}, got {tools!r}")
        if size is not None and (not isinstance(size, int) or size < 1):
            raise ConfigError(f"size must be a positive int (or None), got {size!r}")
        if call_timeout_s <= 0 or max_output_chars < 100:
            raise ConfigError("call_timeout_s must be > 0 and max_output_chars >= 100")
        self.task_config = dict(config or {})
        self.size = size
        self.tool_mode = tools
        self.call_timeout_s = call_timeout_s
        self.max_output_chars = max_output_chars
        self._interpreter = (
            Interpreter(sandbox, sandbox_options, call_timeout_s) if tools == "python" else None
        )
        if self.task_config:  # a config is checked now (it needs reasoning-gym); plain ids import it lazily
            for name in self.tasks:
                dataset(name, self.task_config, size)
        turns = max_turns if max_turns is not None else (6 if tools == "python" else 2)
        super().__init__(max_turns=turns, **kwargs)

    # ----- tools -------------------------------------------------------------------------------------------
    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter: variables and imports stay between calls. Returns
        what the code prints (and the value of a bare last expression), or the error's traceback.

        Args:
            code: Python source, e.g. "print(sum(range(10)))".
        """
        assert self._interpreter is not None
        result = self._interpreter.run(show_last_expression(code))
        return render(result, self.max_output_chars, self.call_timeout_s)

    def tools(self) -> list[Tool]:
        if self.tool_mode == "python":
            return [Tool(self.python, name="python"), Tool(answer)]
        return [Tool(answer)]

    def instructions(self) -> str:
        text = (
            "Answer the question. Think it through, then give only the final answer, in the form the "
            "question asks for, inside <answer></answer> tags."
        )
        if self.tool_mode == "python":
            text += (
                " You can run Python first: the interpreter keeps variables and imports between calls and "
                f"stops code after {self.call_timeout_s:g} s."
            )
        return text

    # ----- hooks -------------------------------------------------------------------------------------------
    def make_task(self) -> Task:
        rng = self.np_random
        name = self.tasks[int(rng.integers(len(self.tasks)))] if len(self.tasks) > 1 else self.tasks[0]
        items = dataset(name, self.task_config, self.size)
        verify.warm(name, self.task_config, self.size)  # the verifier workers start (once) and build it too
        if self._index is not None:
            if not 0 <= self._index < len(items):
                raise ConfigError(f"options['index'] must be in [0, {len(items)}), got {self._index}")
            index, entry = self._index, items[self._index]
        else:
            index, entry = self._draw(items)
        return Task(
            task_id=f"rg-{name}-{index}",
            prompt=str(entry["question"]),
            answer=entry.get("answer"),
            data={"task": name, "index": index, "entry": entry},
        )

    def _draw(self, items: Any, tries: int = 8) -> tuple[int, dict[str, Any]]:
        """A drawn item; an item whose generator raises (a few reasoning-gym generators fail on rare
        indices) is skipped for the next draw, so a seed still gives one fixed task."""
        error: Exception | None = None
        for _ in range(tries):
            index = int(self.np_random.integers(len(items)))
            try:
                return index, items[index]
            except Exception as exc:  # the dataset's bug, not the caller's: draw again
                error = exc
        raise InfrastructureError(f"reasoning-gym's generator failed {tries} times in a row: {error!r}")

    def check_answer(self, answer: str) -> dict[str, float]:
        # in a worker process killed at the deadline, with the answer kept from running as code (verify.py)
        data = self.task.data
        return {
            "correct": verify.score_answer(data["task"], self.task_config, self.size, data["entry"], answer)
        }

    def expert_action(self) -> str:
        """The dataset's gold answer (printed with the python tool first when it is on)."""
        printed = any(m.role == "tool" and m.name == "python" for m in self._transcript)
        return expert_action(
            self.task.data["entry"],
            python=self.tool_mode == "python",
            printed=printed,
            action_format=self.action_format,
        )


def task_class(task: str, *, has_gold: bool | None = None) -> type[ReasoningGymEnv]:
    """The class of ``toolgym/ReasoningGym-<task>-v0``. A dataset without gold answers (several valid
    ones: graph colourings, say) has no expert, and declares an expert success of 0."""
    row: dict[str, str] = next((r for r in read_catalog() if r["task"] == task), {})
    if has_gold is None:
        has_gold = row.get("status") != "ok-no-gold"
    what = row.get("description") or task
    doc = (
        f"reasoning-gym's ``{task}`` task ({row.get('category', 'other')}): {what}\n\n"
        "See ``ReasoningGymEnv`` for the contract; ``task`` is fixed.\n"
    )
    attrs = {"fixed_task": task, "__doc__": doc, "expert_success_rate": 1.0 if has_gold else 0.0}
    return type(class_name(task), (ReasoningGymEnv,), attrs)


def __getattr__(name: str) -> type[ReasoningGymEnv]:
    """``ReasoningGym_chain_sum`` and friends: one class per catalog task, made on first use."""
    prefix = class_name("")
    if not name.startswith(prefix) or not any(r["task"] == name[len(prefix) :] for r in read_catalog()):
        raise AttributeError(name)
    cls = task_class(name[len(prefix) :])
    globals()[name] = cls
    return cls
