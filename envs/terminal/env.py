"""toolgym/Terminal-v0: tasks in the Harbor format, solved with a shell in a container, graded by tests."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, ClassVar

from toolgym.envs.base import Task, ToolEnv
from toolgym.envs.terminal import expert
from toolgym.envs.terminal.container import (
    MAX_COMMAND_BYTES,
    CommandResult,
    ContainerPool,
    TaskContainer,
)
from toolgym.envs.terminal.harbor import TerminalTask, load_harbor_dir
from toolgym.envs.terminal.image import BASE_IMAGE, ensure_base
from toolgym.envs.terminal.tasks import CATEGORIES, TASKS
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.parsing import ParseResult, final_call
from toolgym.tools import Tool

SUBMIT = expert.SUBMIT


def submit(note: str = "") -> str:
    """Say the task is done: the task's tests then check the container and the episode ends.

    Args:
        note: anything you want to say about the result (not graded).
    """
    return note


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


class TerminalEnv(ToolEnv):
    """Harbor-format terminal tasks (files, text, git, builds, packaging) done with a shell in a container.

    ## Description
    Each episode is one task in the Harbor task format (Terminal-Bench 2.0's: an instruction, a container
    environment, tests run by a verifier after the episode). The model works in a fresh docker container of
    the task's image through a ``shell`` tool, then calls ``submit``; the task's ``tests/test.sh`` runs in the
    container and the reward it writes is the episode's. 26 built-in tasks (``tasks.py``), or any folder of
    Harbor tasks (``tasks="/path"``; converted by ``harbor.load_harbor``).

    ## Action Space
    Text (or an assistant message with ``tool_calls``). Hermes format by default:
    ``<tool_call>{"name": "shell", "arguments": {"command": "ls -la"}}</tool_call>``; tags format
    ``<shell>ls -la</shell>``. The episode ends with ``submit`` (alone in its turn) or ``<answer>…</answer>``.

    ## Observation Space
    ``Messages``: on reset the system prompt and the instruction; each shell call returns the command's
    output (stdout and stderr together, cut to ``max_output_chars``) and ``[exit code N]``, or says it was
    killed at the time limit.

    ## Tools
    ``shell(command)``: one bash command line in the episode's persistent shell (an unprivileged user,
    ``agent``, in the task's working folder, which it owns; ``cd``, variables and functions persist), killed
    after ``command_timeout_s``.
    ``submit(note)``: the task is done; the verifier runs.

    ## Threat model
    The policy is assumed adversarial: it may try to write the reward itself, leave processes that do so
    later, replace the verifier's tools, pre-create files the verifier trusts, or exhaust processes, memory or
    disk. So the agent is an unprivileged user: system folders, ``/tests`` and ``/logs`` are root's (``/tests``
    and ``/logs`` are tmpfs mounts, apart from the disk). After ``submit`` a root warden (started with the
    container) kills every process of the agent's uid, with bash builtins only, until none is left; then root
    makes ``/tests`` and ``/logs/verifier`` afresh and runs ``bash /tests/test.sh`` with a fixed environment
    (system ``PATH``, ``HOME=/root``). Whatever the agent broke, a verifier that writes no reward scores 0,
    never an ``env_error``. The built-in tasks run their checks as the agent's uid with a clean environment
    (no user site, a pytest config of their own) and write the reward as root. Not covered: a Harbor verifier
    that runs the agent's programs as root gives them root (``TOOLGYM_AGENT_UID`` says whom to drop to), and a
    check is only as strong as what it looks at.

    ## Rewards
    ``correct``: the verifier's reward (``/logs/verifier/reward.txt``, or ``reward`` in ``reward.json``;
    built-in tasks: 1 or 0). ``format``: ``format_penalty`` (default -0.1) on each invalid action.

    ## Starting State
    A task drawn with ``np_random`` (``reset(options={"task": name})`` or ``{"index": i}`` picks one); a fresh
    container of its image (``toolgym-terminal``, built offline from the sandbox image, or the task's own
    Dockerfile) with the task's files and setup applied. Containers are started ahead (``pool_spares``).

    ## Episode End
    Terminated by ``submit``. Truncated after ``max_turns`` (``turn_limit``; the verifier does not run), by
    ``token_budget`` / ``time_limit_s``, or by a fault of the machinery (``env_error``: docker failed, the
    warden or the verifier was killed from outside the episode, the host ran out of memory; exclude the
    episode; the agent's own memory hog is killed at the container's limit: an observation). A verifier that writes no reward (it ran past its time limit, or the agent broke what it needs)
    scores 0. ``info["verifier_output"]`` holds the verifier's log tail.

    ## Arguments
    ``tasks`` ("builtin", or a folder of Harbor tasks / one task folder), ``categories`` (built-in
    categories to keep: files, text, git, build, packaging), ``max_turns`` (20), ``command_timeout_s`` (30),
    ``max_output_chars`` (4000), ``pool_spares`` (1: containers started ahead per image), ``format_penalty``,
    ``action_format``, ``prompt_format``, ``token_budget``, ``time_limit_s`` (default: each task's
    ``[agent] timeout_sec``, 900 s for the built-in tasks: an episode past it is truncated as ``timeout``).

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "terminal"
    expert_success_rate: ClassVar[float] = 1.0
    supports_fork: ClassVar[bool] = False  # a container's file system is not forked (trainers replay)
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")
    check_expert_episodes: ClassVar[int | None] = 6

    def __init__(
        self,
        *,
        tasks: str = "builtin",
        categories: tuple[str, ...] | list[str] | None = None,
        max_turns: int = 20,
        command_timeout_s: float = 30.0,
        max_output_chars: int = 4000,
        pool_spares: int = 1,
        **kwargs: Any,
    ) -> None:
        if command_timeout_s <= 0 or max_output_chars < 200 or pool_spares < 0:
            raise ConfigError("command_timeout_s must be > 0, max_output_chars >= 200, pool_spares >= 0")
        if tasks == "builtin":
            chosen = list(TASKS)
        elif Path(tasks).exists():
            chosen = load_harbor_dir(tasks)
        else:
            raise ConfigError(
                f"tasks must be 'builtin' or a folder of Harbor tasks; {tasks!r} does not exist"
            )
        if categories is not None:
            unknown = sorted(set(categories) - set(CATEGORIES))
            if unknown:
                raise ConfigError(f"unknown categories {unknown}; built-in ones: {CATEGORIES}")
            chosen = [t for t in chosen if t.category in categories]
        if not chosen:
            raise ConfigError("no tasks left after the category filter")
        self.tasks: list[TerminalTask] = chosen
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars
        self.pool_spares = pool_spares
        self._pools: dict[str, ContainerPool] = {}
        self._box: TaskContainer | None = None
        self._removals: list[threading.Thread] = []  # containers of ended episodes being removed
        self._pick: int | None = None
        self._verifier = ""
        self._staged = False  # the task's solution/ is in the container (the expert plays)
        super().__init__(max_turns=max_turns, **kwargs)
        self._own_time_limit = self.time_limit_s  # None: each task's own [agent] timeout_sec applies

    # ----- tools -----------------------------------------------------------------------------------------
    def shell(self, command: str) -> str:
        """Run one bash command line in your terminal and return its output and exit code. The shell
        persists for the episode (cd, variables and functions stay); each command is killed after a time
        limit; nothing can be read from standard input and there is no network.

        Args:
            command: the command line, e.g. "ls -la" or "cd src && make".
        """
        if self._box is None:
            raise InfrastructureError("no task container (reset first)")
        size = len(command.encode("utf-8", "surrogatepass"))
        if size > MAX_COMMAND_BYTES:  # (bash reads its input a byte at a time)
            return f"[not run: the command is {size} bytes long; the limit is {MAX_COMMAND_BYTES}]"
        return self._render(self._box.run(command, self.command_timeout_s))

    def _render(self, result: CommandResult) -> str:
        text = _cut(result.output, self.max_output_chars)
        if result.timed_out:
            tail = f"[killed: the command ran past the {self.command_timeout_s:g} s limit]"
        elif result.broken and result.exit_code is None:
            tail = "[the shell could not start the command: no process or file descriptor left]"
        elif result.exit_code is None:
            tail = "[the shell exited]"
        else:
            tail = f"[exit code {result.exit_code}]"
        if result.rerun:  # (it had not started: its shell had died, or had no process or fd left)
            where = " in a new shell: the working folder and variables were reset" if result.restarted else ""
            tail += f" [the command could not start at first; it ran again{where}]"
        elif result.restarted:
            tail += " [a new shell was started: the working folder and variables were reset]"
        return f"{text}\n{tail}" if text.strip() else tail

    def tools(self) -> list[Tool]:
        return [Tool(self.shell, name="shell"), Tool(submit)]

    def instructions(self) -> str:
        return (
            "You work in a Linux terminal: bash, as the user agent, not root (system folders are read-only to "
            "you; install Python packages with pip install --user), in a container without network access "
            "(pip installs only from local folders). Run commands with the shell tool; each call returns the output and the "
            f"exit code, and commands are killed after {self.command_timeout_s:g} s. When the task is done, "
            "call submit: the task's tests then check the container."
        )

    # ----- episode -------------------------------------------------------------------------------------
    def begin_episode(self, options: dict[str, Any] | None) -> None:
        self._end_container()
        options = options or {}
        self._pick = None
        if "task" in options:
            names = [t.name for t in self.tasks]
            if options["task"] not in names:
                raise ConfigError(f"options['task'] must be one of {names}, got {options['task']!r}")
            self._pick = names.index(options["task"])
        elif "index" in options:
            self._pick = int(options["index"]) % len(self.tasks)

    def _pool(self, image: str) -> ContainerPool:
        if image not in self._pools:
            if image == BASE_IMAGE:
                ensure_base()
            task = next(t for t in self.tasks if t.image == image)
            self._pools[image] = ContainerPool(image, task.resources, task.workdir, self.pool_spares)
        return self._pools[image]

    def make_task(self) -> Task:
        index = int(self.np_random.integers(len(self.tasks)))  # drawn always: the task stream stays seeded
        if self._pick is not None:
            index = self._pick
        task = self.tasks[index]
        box = self._pool(task.image).take()
        self._box = box
        self._verifier = ""
        self.time_limit_s = self._own_time_limit or task.agent_timeout_s
        box.prepare(task.files, task.setup)
        self._staged = False
        prompt = (
            f"{task.instruction}\n\n(Your shell starts in {task.workdir}. Call submit when you are done.)"
        )
        data = {"index": index, "name": task.name, "category": task.category, "image": task.image}
        return Task(f"terminal-{task.name}", prompt, None, data)

    @property
    def current(self) -> TerminalTask:
        return self.tasks[self.task.data["index"]]

    def parse(self, action: Any) -> ParseResult:
        """A ``submit`` call, alone in its turn, ends the episode like ``<answer>``."""
        parsed = super().parse(action)
        return final_call(parsed, SUBMIT, "note")

    def check_answer(self, answer: str) -> dict[str, float]:
        """Runs the task's verifier in the container: ``tests/`` to ``/tests``, then ``bash /tests/test.sh``."""
        box, task = self._box, self.current
        if box is None:
            raise InfrastructureError("no task container to verify")
        # every agent process is killed first; /tests and /logs/verifier (root's tmpfs mounts) are made
        # afresh; the verifier runs as root with a fixed environment (see container.py, "Who is who")
        code, out = box.verify(task.tests, timeout_s=task.verifier_timeout_s)
        log = box.read_file("/logs/verifier/checks.log") or ""
        self._verifier = _cut(out + log, 2000)
        reward = _read_reward(box)
        if reward is None:
            # the verifier wrote nothing: it ran out of time (on a program the agent wrote), the agent broke
            # what it needs (its own files), or an agent process could not be killed (it did not run). The
            # episode's own failure, scored 0: were it an env_error, a policy could dodge a 0 by breaking the
            # verifier. Docker faults raise above.
            why = {124: "killed at the time limit", 137: "killed at the time limit", -2: "not run"}.get(
                code, f"exit {code}"
            )
            self._verifier += f"\n[the verifier wrote no reward ({why}): scored 0]"
            reward = 0.0
        return {"correct": reward}

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        extra: dict[str, Any] = {"task_name": self.task.data["name"], "category": self.task.data["category"]}
        if ended:
            extra["verifier_output"] = self._verifier
            self._end_container()
        return extra

    def _end_container(self, wait: bool = False) -> None:
        if self._box is not None:
            self._box.close(wait)
            if self._box.removal is not None:
                self._removals.append(self._box.removal)
            self._box = None
        self._removals[:] = [t for t in self._removals if t.is_alive()]

    def expert_action(self) -> str:
        """The task's reference solution, one command per turn, then submit. A Harbor task's ``solution/``
        is staged in the container first (root's, readable by the agent: only when the expert plays, so a
        model's episode never has it), and its one command runs ``solve.sh`` there: no action carries the
        script, so a solution of any size plays (an action is cut at ``parsing.MAX_ACTION_CHARS``)."""
        task = self.current
        if task.solution_files and not self._staged and self._box is not None:
            self._box.stage_solution(task.solution_files)
            self._staged = True
        return expert.expert_action(task, self._transcript, self.action_format)

    def close(self) -> None:
        # every container goes now: a make_vec worker process exits without running atexit handlers
        self._end_container(wait=True)
        for removal in self._removals:
            removal.join(30)
        for pool in self._pools.values():
            pool.close()
        self._pools = {}
        super().close()


def _read_reward(box: TaskContainer) -> float | None:
    text = box.read_file("/logs/verifier/reward.txt")
    if text is not None and text.strip():
        try:
            return float(text.strip().split()[0])
        except ValueError:
            return None
    text = box.read_file("/logs/verifier/reward.json")
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(data, dict):
        value = data.get("reward", next(iter(data.values()), None)) if data else None
        return float(value) if isinstance(value, (int, float)) else None
    return float(data) if isinstance(data, (int, float)) else None
