"""The base of every toolgym environment: the contract of docs/envs.md.

A subclass fills in small named hooks; ``reset``, ``step`` are ``@typing.final`` (mypy rejects an override),
so the episode loop, its bookkeeping and forking stay the same for every family:

- ``new_episode()``: a fresh object holding the family's per-episode state (``self.episode``); ``reset``
  makes it and ``get_state``/``set_state`` copy it, so a field kept there can never be forgotten by a fork.
- ``make_task()``: draw a task with ``self.np_random`` (required).
- ``tools()``: the tools the model may call (``Tool`` objects).
- ``run_tool(call)``: run one call and return the observation text (default: call the tool's function).
- ``parse(action)``: read one model turn into a ``ParseResult`` (default: the action format's parser).
  ``read_action(action)`` runs it ahead of ``step`` and returns a ``ParsedAction`` that ``step`` then takes
  as it is (the runner records the parsed assistant message and steps with it: each turn is parsed once).
- ``check_answer(answer)``: the reward components of a final answer (required unless command format).
- ``run_command(command)``: for command-format envs (household): advance the world.
- ``tool_reward(call, output)``: optional shaping for a tool call.
- ``expert_action()``: the scripted expert's next action (used by checks, tests, SFT data).
- ``extra_info(info, ended)``: family-specific keys for the info of ``reset`` and of every ``step``.
- ``decorate_observation(messages, ended)``: change the messages ``reset``/``step`` return (screenshots).
- ``begin_episode(options)``, ``extra_state()``/``load_extra_state(state)``: resources beyond plain data.

An env that forks (``supports_fork``) keeps no episode data outside ``self.episode``: while ``make_task`` and
the hooks of a ``step`` run, assigning any attribute of the env but the base's bookkeeping raises
``EnvStateError`` (a resource such as an interpreter goes through ``extra_state``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, final

import gymnasium as gym

from toolgym.envs import prompts
from toolgym.envs.knobs import knob_checked
from toolgym.envs.records import CommandOutcome, ParsedAction, Task
from toolgym.envs.spaces import ActionText, Messages
from toolgym.errors import ConfigError, EnvStateError, EpisodeOverError, InfrastructureError
from toolgym.messages import Message, ToolCall
from toolgym.parsing import ActionFormat, ParseResult, clean_text, parse_action
from toolgym.rewards.extract import lenient_answer
from toolgym.tools import Tool, ToolSpec

__all__ = [
    "DEFAULT_MAX_OBSERVATION_CHARS",
    "TRUNCATIONS",
    "CommandOutcome",
    "ParsedAction",
    "Task",
    "ToolEnv",
    "action_reader",
    "cap_messages",
    "cap_text",
    "tool_env",
]

TRUNCATIONS = ("turn_limit", "token_budget", "timeout", "env_error")
MAX_CALLS_PER_TURN = 16  # calls of one turn that run (a step takes at most this many tools' time limits)
# The most characters of one observation message (``max_observation_chars``). An env that echoes the model's
# reply (GEM's Minesweeper and Mastermind, a web page's text box) or returns a tool's whole output (a search,
# an MCP server, another OpenEnv server) could otherwise hand back up to the parser's 200,000-character reply
# limit. 32,000 is well above what any family shows today (tool outputs cut by the families themselves at
# 2,000-4,000, MiniWoB pages, text-game rooms and task prompts of a few thousand), so it only cuts the runaway.
DEFAULT_MAX_OBSERVATION_CHARS = 32_000
MIN_OBSERVATION_CHARS = 500  # room for the marker and some text on both sides of it
_TAIL_SHARE = 4  # 1/4 of what is kept comes from the end (a board below an echo, a traceback's last line)
_NUDGE = 16  # at most this many characters a cut moves to keep a grapheme whole
# what the base itself changes during an episode (``get_state`` copies each; gymnasium makes ``_np_random``
# on first use): hooks of a forking env may assign none but these while an episode runs (``__setattr__``)
_BOOKKEEPING = frozenset((
    "episode", "_stamp", "_task", "_transcript", "_turn", "_tokens", "_done", "_started", "_episode_reward",
    "_episode_components", "_tool_calls", "_invalid", "_call_counter", "_sealed", "_np_random", "_np_random_seed",
))  # fmt: skip


def _copy_episode(episode: Any) -> Any:
    clone = getattr(episode, "clone", None)  # a family's fast copy; everything else is copied deeply
    return clone() if callable(clone) else copy.deepcopy(episode)


def _valid_text(message: Message) -> Message:
    """``message`` with lone surrogates in its text replaced (``clean_text``): whatever a tool echoes, the
    trainer's tokenizer, a JSONL writer and an OpenAI client must be able to encode the observation."""
    if not isinstance(message.content, str):
        return message
    text = clean_text(message.content)
    return message if text is message.content else message.model_copy(update={"content": text})


def _cut_marker(cut: int, total: int, limit: int) -> str:
    return (
        f"\n\n[... {cut:,} characters cut here: this observation had {total:,} characters, "
        f"at most {limit:,} are shown (max_observation_chars) ...]\n\n"
    )


def _joins(text: str, i: int) -> bool:
    """Whether a cut just before ``text[i]`` would split a grapheme: ``text[i]`` is a combining mark (accents,
    variation selectors), a zero-width joiner or an emoji modifier, or ``text[i - 1]`` is a joiner."""
    c = text[i]
    return (
        unicodedata.category(c) in ("Mn", "Mc", "Me")
        or c == "\u200d"
        or "\U0001f3fb" <= c <= "\U0001f3ff"
        or (i > 0 and text[i - 1] == "\u200d")
    )


def cap_text(text: str, limit: int | None) -> str:
    """``text`` as an observation of at most ``limit`` characters: unchanged when it fits (or ``limit`` is 0 or
    None), else its head and tail around a marker that says how many characters were cut. The cut falls on
    code points (a Python ``str`` never holds half of a surrogate pair) and is moved by a few characters rather
    than split a combining sequence or an emoji ZWJ sequence. Deterministic: the same text, the same result.

    >>> out = cap_text("a" * 600 + "b" * 600, 500)
    >>> len(out) <= 500 and out.startswith("aaa") and out.endswith("bbb") and "825 characters cut" in out
    True
    """
    if not limit or len(text) <= limit:
        return text
    # sized for the longest marker this text can need (the cut is at most len(text)), so the result fits
    keep = max(0, limit - len(_cut_marker(len(text), len(text), limit)))
    tail = keep // _TAIL_SHARE
    head = keep - tail
    start = len(text) - tail
    for _ in range(_NUDGE):  # both ends only move inwards: the result never grows
        if head == 0 or not _joins(text, head):
            break
        head -= 1
    for _ in range(_NUDGE):
        if start >= len(text) or not _joins(text, start):
            break
        start += 1
    return text[:head] + _cut_marker(start - head, len(text), limit) + text[start:]


def cap_messages(
    messages: list[dict[str, Any]], limit: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    """Observation messages (plain dicts, system ones left whole) with each text content cut by ``cap_text``,
    and what was cut for ``info["observation_truncated"]`` (each cut message's index and original length).
    For envs that build their observations outside ``ToolEnv.reset``/``step`` (``Remote-v0``)."""
    out: list[dict[str, Any]] = []
    cuts: list[dict[str, int]] = []
    for i, message in enumerate(messages):
        if isinstance(message, dict) and (
            capped := _capped(message.get("role"), message.get("content"), limit)
        ):
            cuts.append({"index": i, "chars": len(message["content"])})
            message = {**message, "content": capped}
        out.append(message)
    return out, cuts


def _capped(role: Any, content: Any, limit: int | None) -> str | None:
    """``content`` cut by ``cap_text`` when it is text over ``limit`` in a message that is not the system
    prompt (that one is the env's own, never cut); None when nothing is to be cut."""
    if limit and isinstance(content, str) and len(content) > limit and role != "system":
        return cap_text(content, limit)
    return None


def _not_run(call: ToolCall, cap: int) -> Message:
    """The answer to a call past ``max_calls_per_turn``: one turn of many slow calls held its step for the
    per-call time limit times the number of calls (thousands in a 200,000-character turn)."""
    return Message(
        role="tool",
        tool_call_id=call.id,
        name=call.name,
        content=f"Error: not run: at most {cap} tool calls run per turn; make the others in the next turn.",
    )


def _whitespace_tokens(text: str) -> int:
    return len(text.split())


class ToolEnv(gym.Env[list[dict[str, Any]], Any]):
    """Base class; see the module docstring for the hooks. Subclasses document themselves under the headings
    of docs/envs.md (Description, Action Space, …, Version History)."""

    family: ClassVar[str] = "generic"
    expert_success_rate: ClassVar[float] = 1.0
    supports_fork: ClassVar[bool] = True
    action_format: ActionFormat = "hermes"
    reward_keys: ClassVar[tuple[str, ...]] = ("correct", "format")
    # a cap on the expert episodes `toolgym check` plays, for envs whose episodes are slow (a JVM, a browser)
    check_expert_episodes: ClassVar[int | None] = None
    # True for a family that forwards arbitrary **kwargs (e.g. to an outside engine): no knob check then
    accepts_any_kwargs: ClassVar[bool] = False
    metadata = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 (gymnasium declares it so)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = knob_checked(cls.__init__)  # type: ignore[method-assign]

    def __init__(
        self,
        *,
        max_turns: int = 8,
        prompt_format: str = "tools",
        action_format: ActionFormat | None = None,
        format_penalty: float = -0.1,
        token_budget: int | None = None,
        token_counter: Callable[[str], int] | None = None,
        time_limit_s: float | None = None,
        system_prompt: str | None = None,
        lenient_answers: bool = False,
        render_mode: str | None = None,
        mcp: Any = None,
        max_calls_per_turn: int = MAX_CALLS_PER_TURN,
        max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
        if max_calls_per_turn < 1:
            raise ConfigError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        if max_observation_chars is not None and (
            not isinstance(max_observation_chars, int)
            or max_observation_chars < 0
            or 0 < max_observation_chars < MIN_OBSERVATION_CHARS
        ):
            raise ConfigError(
                f"max_observation_chars must be 0 or None (no cap) or >= {MIN_OBSERVATION_CHARS}, "
                f"got {max_observation_chars!r}"
            )
        if prompt_format not in ("tools", "text"):
            raise ConfigError(f"prompt_format must be 'tools' or 'text', got {prompt_format!r}")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.max_observation_chars = max_observation_chars or None
        self.prompt_format = prompt_format
        if action_format is not None:
            self.action_format = action_format
        self.format_penalty = format_penalty
        self.token_budget = token_budget
        self.token_counter = token_counter or _whitespace_tokens
        self.time_limit_s = time_limit_s
        self.custom_system_prompt = system_prompt
        self.lenient_answers = lenient_answers
        self.render_mode = render_mode
        self.observation_space = Messages()
        self.action_space = ActionText()
        self._tools: dict[str, Tool] = {t.name: t for t in self.tools()}
        self._specs = [t.spec for t in self._tools.values()]
        self._tool_dicts = [s.to_dict() for s in self._specs]
        self.mcp_servers = None
        if mcp is not None:  # MCP servers' tools join the env's own (toolgym.envs.mcp.attach)
            from toolgym.envs.mcp.attach import attach_mcp

            self.mcp_servers = attach_mcp(self, mcp)
        self._task: Task | None = None
        self._transcript: list[Message] = []
        self._zero_counters()
        self.episode: Any = None
        self._stamp = object()  # who may trust a ParsedAction: renewed whenever the state changes

    def _zero_counters(self) -> None:
        """The base's per-episode counts, as a new episode starts them (``get_state`` copies each)."""
        self._turn = self._tokens = self._tool_calls = self._invalid = self._call_counter = 0
        self._done = False
        self._started = time.monotonic()
        self._episode_reward = 0.0
        self._episode_components: dict[str, float] = dict.fromkeys(self.reward_keys, 0.0)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_sealed") and name not in _BOOKKEEPING:
            raise EnvStateError(
                f"{type(self).__name__} set self.{name} during an episode: a fork (get_state/set_state) would "
                "lose it. Keep per-episode data in the object new_episode() returns (self.episode), or a "
                "resource's state in extra_state()/load_extra_state()."
            )
        super().__setattr__(name, value)

    @contextlib.contextmanager
    def _episode_sealed(self) -> Iterator[None]:
        """While the family's episode hooks run, a forking env may change only ``self.episode``."""
        self._sealed = self.supports_fork
        try:
            yield
        finally:
            self._sealed = False

    # ----- hooks -------------------------------------------------------------------------------------------
    def begin_episode(self, options: dict[str, Any] | None) -> None:
        """Called first by ``reset`` with its ``options``: start resources an episode needs (a sandbox
        session, say) so that a missing service fails ``reset``, not a step. Default: nothing."""
        return None

    def new_episode(self) -> Any:
        """A fresh per-episode state object (a dataclass, say), made by ``reset`` before ``make_task`` and
        kept in ``self.episode``. Forks copy it with its ``clone()`` method when it has one, else deeply.
        Keep every field that changes during an episode here; the default (None) keeps nothing."""
        return None

    def make_task(self) -> Task:
        """Draw the episode's task with ``self.np_random``. Required. The returned ``Task`` is not changed
        afterwards (forks share it); mutable world state belongs in ``self.episode``."""
        raise NotImplementedError

    def tools(self) -> list[Tool]:
        """The tools the model may call, as ``Tool`` objects (built from typed, documented functions). Called
        once, by ``__init__``; their specs go to the system prompt and to reset's ``info["tools"]``. Default:
        none."""
        return []

    def run_tool(self, call: ToolCall) -> str:
        """Run one parsed ``ToolCall`` (its name is one of ``tools()``) and return the observation text. Default:
        call the tool's function; any exception but ``InfrastructureError`` becomes ``"Error: …"`` feedback
        for the model. Raise ``InfrastructureError`` for a fault of the env's machinery (a dead sandbox): the
        episode then ends as ``truncation="env_error"`` and is not scored as the model's failure."""
        tool = self._tools[call.name]
        try:
            return str(tool(**call.arguments))
        except InfrastructureError:
            raise
        except Exception as exc:  # a tool error is feedback for the model, not a crash
            return f"Error: {exc}"

    def check_answer(self, answer: str) -> dict[str, float]:
        """The reward components of a final answer (the text inside ``<answer>``), e.g. ``{"correct": 1.0}``;
        the step's reward is their sum and the episode ends. Required unless the env is command-format. May
        raise ``InfrastructureError`` (a grader that could not run)."""
        raise NotImplementedError

    def is_success(self, components: dict[str, float]) -> bool:
        """Whether the final answer's reward components mean solved (``info["success"]``). Default:
        ``correct >= 1``."""
        return components.get("correct", 0.0) >= 1.0

    def run_command(self, command: str) -> CommandOutcome:
        """Command-format envs (household, text games): advance the world by one command and return a
        ``CommandOutcome`` (observation, reward components, whether the episode ended and was won). May raise
        ``InfrastructureError`` (an engine that died)."""
        raise NotImplementedError

    def tool_reward(self, call: ToolCall, output: str) -> dict[str, float]:
        """Optional shaping for one tool call, given its output: reward components added to the step's.
        Default: none."""
        return {}

    def expert_action(self) -> str:
        """The scripted expert's next action as model text, from the episode so far (used by ``toolgym check``,
        tests and SFT data). Required by the checks: determinism, fork and expert checks play it."""
        raise NotImplementedError

    def parse(self, action: Any) -> ParseResult:
        """Read one model turn; never raises. Envs that accept more syntax (a ``\\boxed{}`` answer, a tool
        that ends the episode) override it and start from ``super().parse(action)``."""
        parsed = parse_action(action, self._specs, self.action_format, self._call_counter)
        if self.lenient_answers and parsed.error_kind == "no_action":
            parsed = lenient_answer(parsed)
        return parsed

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """Family-specific keys for the info dict that ``reset`` and every ``step`` return.

        Receives the info built so far (read it, do not change it): ``task_id`` and ``turn`` always
        (``turn == 0`` only in reset's info); in a step also ``invalid_action``, ``tool_calls``,
        ``reward_components``, and when they apply ``parse_error``, ``truncation``, ``infra_error`` and, when
        ``ended``, ``success`` and the ``episode_*`` totals. ``ended`` is True on the step that ends the
        episode (terminated or truncated), False in reset's info. Returns the keys to add; a returned key
        replaces the base's (e.g. ``invalid_action`` for a command the world refused). Called exactly once per
        ``reset`` and per ``step``, after the turn's world change, so it may count per-turn facts in
        ``self.episode``. Default: no keys. An exception here propagates out of ``reset``/``step`` (it is an
        env bug, not the model's failure)."""
        return {}

    def decorate_observation(self, messages: list[dict[str, Any]], ended: bool) -> list[dict[str, Any]]:
        """The messages ``reset`` and ``step`` return, as plain dicts: return them as they are (the default) or
        changed (a web env adds a screenshot to the last one). ``ended`` is True on the step that ends the
        episode. To keep the transcript in step, change ``self._transcript``'s last entries the same way. May
        raise ``InfrastructureError`` only where its caller can: it is not caught here."""
        return messages

    def instructions(self) -> str:
        """The task-specific part of the system prompt."""
        return "Solve the task."

    def example(self) -> str | None:
        """A short worked exchange shown in the text prompt format (small models copy its syntax)."""
        return None

    def extra_state(self) -> Any:
        """World state beyond the transcript and ``self.episode``, for forking (deep-copied): for resources
        that are not plain data, such as a sandbox session to fork. Prefer ``new_episode`` for plain data."""
        return None

    def load_extra_state(self, state: Any) -> None:
        """Restore what ``extra_state`` returned (a deep copy of it)."""
        return None

    # ----- the contract ------------------------------------------------------------------------------------
    @property
    def tool_specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    @property
    def transcript(self) -> list[dict[str, Any]]:
        """The whole episode so far, as plain dicts."""
        return [m.to_dict() for m in self._transcript]

    @property
    def task(self) -> Task:
        if self._task is None:
            raise EpisodeOverError("no episode yet: call reset() first")
        return self._task

    def system_prompt(self) -> str:
        """The system message: ``system_prompt=`` when given, else the instructions and how to act in this
        action format (``toolgym.envs.prompts``)."""
        if self.custom_system_prompt is not None:
            return self.custom_system_prompt
        example = self.example() if self.prompt_format == "text" and self.action_format == "hermes" else None
        return prompts.system_prompt(
            self.instructions(), list(self._tools.values()), self.action_format, self.prompt_format, example
        )

    @final
    def read_action(self, action: Any) -> ParsedAction:
        """Parse one model turn now, with ``parse`` in the env's current state, for ``step`` to take without
        parsing it again (see ``ParsedAction``). A ParsedAction passed in is read again from its ``raw``."""
        raw = action.raw if isinstance(action, ParsedAction) else action
        return ParsedAction(raw, self.parse(raw), self.action_format, self._stamp)

    def _parse_once(self, action: Any) -> ParseResult:
        """``step``'s reading of its action: a ParsedAction this env made in this state as it is, any other
        ParsedAction from its raw action, anything else through ``parse``."""
        if isinstance(action, ParsedAction):
            if action.stamp is self._stamp and action.action_format == self.action_format:
                return action.result
            action = action.raw
        return self.parse(action)

    def _info(self, **extra: Any) -> dict[str, Any]:
        info: dict[str, Any] = {"task_id": self.task.task_id, "turn": self._turn}
        info.update(extra)
        return info

    def _observed(self, messages: list[Message]) -> tuple[list[Message], list[dict[str, int]]]:
        """The messages as the model gets them: text without lone surrogates (``_valid_text``) and, but for the
        system prompt, at most ``max_observation_chars`` characters each (``cap_text``); with what was cut,
        for ``info["observation_truncated"]``. Every observation of ``reset`` and ``step`` passes here."""
        out: list[Message] = []
        cuts: list[dict[str, int]] = []
        limit = self.max_observation_chars
        for i, message in enumerate(messages):
            message = _valid_text(message)
            if capped := _capped(message.role, message.content, limit):
                cuts.append({"index": i, "chars": len(message.content)})  # type: ignore[arg-type]  # (text: capped)
                message = message.model_copy(update={"content": capped})
            out.append(message)
        return out, cuts

    @final
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        super().reset(seed=seed)
        self._stamp = object()
        self.begin_episode(options)
        self.episode = self.new_episode()
        with self._episode_sealed():
            self._task = self.make_task()
            self._zero_counters()
            obs, cuts = self._observed(
                [
                    Message(role="system", content=self.system_prompt()),
                    Message(role="user", content=self._task.prompt),
                ]
            )
            self._transcript = list(obs)
            # the tool specs travel once, with the task: they do not change during an episode
            info = self._info(tools=self._tool_dicts)
            if cuts:
                info["observation_truncated"] = cuts
                # a task cut before the model acts is likely a setting (a long-context config): say so, in
                # words that do not change between tasks, so that Python's default filter says it once
                warnings.warn(
                    f"{type(self).__name__}: a task longer than max_observation_chars={self.max_observation_chars:,}"
                    " was cut (info['observation_truncated']); raise it, or pass None, for long-context tasks",
                    stacklevel=2,
                )
            info.update(self.extra_info(info, False))
            messages = self.decorate_observation([m.to_dict() for m in obs], False)
        return messages, info

    @final
    def step(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """One model turn: text, an assistant message, or a ``ParsedAction`` from ``read_action``."""
        if self._task is None or self._done:
            raise EpisodeOverError("the episode is over (or never started): call reset() before step()")
        with self._episode_sealed():
            parsed = self._parse_once(action)
            self._stamp = object()  # the state moves on: a turn read before this step must be read again
            if parsed.message is None:
                self._call_counter += len(parsed.tool_calls)
            self._turn += 1
            self._tokens += self.token_counter(parsed.text)
            self._transcript.append(parsed.assistant_message())
            components = dict.fromkeys(self.reward_keys, 0.0)
            obs: list[Message] = []
            terminated = False
            success: bool | None = None
            truncation: str | None = None
            infra_error: str | None = None
            try:
                if not parsed.ok:
                    self._invalid += 1
                    components["format"] = self.format_penalty
                    obs.append(Message(role="user", content=self.format_feedback(parsed)))
                elif parsed.answer is not None:
                    components.update(self.check_answer(parsed.answer))
                    terminated = True
                    success = self.is_success(components)
                elif parsed.command is not None:
                    outcome = self.run_command(parsed.command)
                    components.update(outcome.reward_components)
                    obs.append(Message(role="user", content=outcome.observation))
                    terminated = outcome.terminated
                    success = outcome.success if terminated else None
                else:
                    for i, call in enumerate(parsed.tool_calls):
                        if i >= self.max_calls_per_turn:  # each call may take its tool's time limit
                            obs.append(_not_run(call, self.max_calls_per_turn))
                            continue
                        self._tool_calls += 1
                        output = self.run_tool(call)
                        for key, value in self.tool_reward(call, output).items():
                            components[key] = components.get(key, 0.0) + value
                        # built from trusted parts: skip validation on this hot path
                        obs.append(
                            Message.model_construct(
                                role="tool",
                                tool_call_id=call.id,
                                name=call.name,
                                content=output,
                                tool_calls=None,
                            )
                        )
            except InfrastructureError as exc:
                truncation, infra_error = "env_error", str(exc)
                obs = []
            reward = float(sum(components.values())) if infra_error is None else 0.0
            obs, cuts = self._observed(obs)
            self._transcript.extend(obs)
            if not terminated and truncation is None:
                if self._turn >= self.max_turns:
                    truncation = "turn_limit"
                elif self.token_budget is not None and self._tokens >= self.token_budget:
                    truncation = "token_budget"
                elif self.time_limit_s is not None and time.monotonic() - self._started > self.time_limit_s:
                    truncation = "timeout"
            truncated = truncation is not None
            self._episode_reward += reward
            for key, value in components.items():
                self._episode_components[key] = self._episode_components.get(key, 0.0) + value
            info = self._info(
                invalid_action=not parsed.ok,
                tool_calls=len(parsed.tool_calls) if parsed.ok else 0,
                reward_components=components,
            )
            if not parsed.ok:
                info["parse_error"] = parsed.error_kind
            if truncated:
                info["truncation"] = truncation
            if infra_error is not None:
                info["infra_error"] = infra_error
            if cuts:
                info["observation_truncated"] = cuts
            if terminated or truncated:
                self._done = True
                info["success"] = bool(success)
                info["episode_reward"] = self._episode_reward
                info["episode_reward_components"] = dict(self._episode_components)
                info["episode_tool_calls"] = self._tool_calls
                info["episode_invalid_actions"] = self._invalid
            ended = terminated or truncated
            info.update(self.extra_info(info, ended))
            messages = self.decorate_observation([m.to_dict() for m in obs], ended)
        return messages, reward, terminated, truncated, info

    def format_feedback(self, parsed: ParseResult) -> str:
        """The observation after an invalid action: what was wrong and the expected format."""
        return prompts.format_feedback(parsed, list(self._tools), self.action_format)

    # ----- forking -----------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """A copy of the episode, enough to continue it elsewhere with ``set_state``. Messages and the task
        are immutable and shared; ``self.episode`` and ``extra_state()`` are copied."""
        return {
            "task": self._task,
            "transcript": list(self._transcript),
            "turn": self._turn,
            "tokens": self._tokens,
            "done": self._done,
            "elapsed": time.monotonic() - self._started,
            "episode_reward": self._episode_reward,
            "episode_components": dict(self._episode_components),
            "tool_calls": self._tool_calls,
            "invalid": self._invalid,
            "call_counter": self._call_counter,
            "rng": copy.deepcopy(self.np_random.bit_generator.state),
            "episode": _copy_episode(self.episode),
            "extra": copy.deepcopy(self.extra_state()),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._stamp = object()
        self._task = state["task"]
        self._transcript = list(state["transcript"])
        self._turn = state["turn"]
        self._tokens = state["tokens"]
        self._done = state["done"]
        self._started = time.monotonic() - state["elapsed"]
        self._episode_reward = state["episode_reward"]
        self._episode_components = dict(state["episode_components"])
        self._tool_calls = state["tool_calls"]
        self._invalid = state["invalid"]
        self._call_counter = state["call_counter"]
        self.np_random.bit_generator.state = copy.deepcopy(state["rng"])
        self.episode = _copy_episode(state.get("episode"))
        self.load_extra_state(copy.deepcopy(state["extra"]))

    def render(self) -> str | None:  # type: ignore[override]
        if self.render_mode != "ansi":
            return None
        calls = [
            "".join(f" [{c.name}({json.dumps(c.arguments)})]" for c in m.tool_calls or ())
            for m in self._transcript
        ]
        return "\n".join(f"[{m.role}] {m.text}{c}" for m, c in zip(self._transcript, calls, strict=True))


def action_reader(env: gym.Env[Any, Any]) -> Callable[[Any], ParsedAction] | None:
    """``read_action`` of the ToolEnv under ``env`` when a ``ParsedAction`` given to ``env.step`` reaches that
    env's own ``step`` as it is: no ``gym.ActionWrapper`` in between (it would change the text) and the base
    ``step`` (``Remote-v0`` replaces it: its server parses). None otherwise: step with the raw action."""
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, gym.ActionWrapper):
            return None
        layer = layer.env
    if not isinstance(layer, ToolEnv) or type(layer).step is not ToolEnv.step:
        return None
    return layer.read_action


def tool_env(env: gym.Env[Any, Any]) -> ToolEnv:
    """The ``ToolEnv`` under any wrappers, or a ConfigError naming what was passed."""
    inner = env.unwrapped
    if not isinstance(inner, ToolEnv):
        raise ConfigError(f"expected a toolgym environment, got {type(inner).__name__}")
    return inner
