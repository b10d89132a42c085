"""toolgym/Web-v0 and toolgym/MiniWoB-<task>-v0: real MiniWoB++ tasks in a real Chromium."""

from __future__ import annotations

import ast
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from toolgym.envs.base import CommandOutcome, Task, ToolEnv
from toolgym.envs.web import class_name, miniwob_tasks
from toolgym.envs.web.browser import BrowserHost
from toolgym.envs.web.expert import SOLVERS
from toolgym.envs.web.page import KEYS, MiniWoBPage, Snapshot, miniwob_html_dir
from toolgym.errors import ConfigError, InfrastructureError
from toolgym.messages import ToolCall
from toolgym.tools import Tool

ACTIONS = ("click", "type", "press", "select", "scroll", "click_xy")
_ARITY = {
    "click": (1, 1),
    "type": (2, 2),
    "press": (1, 1),
    "select": (2, 2),
    "scroll": (1, 2),
    "click_xy": (2, 2),
}
_COMMAND = re.compile(r"^\s*([a-z_]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)
NO_LIMIT_MS = 2_000_000_000  # MiniWoB's own 10 s episode clock would time out any LLM


def render(snapshot: Snapshot) -> str:
    """The page as compact text: one line per element, ``[id] role "label" value=… states``."""
    lines = []
    for e in snapshot.elements:
        line = f"[{e['id']}] {e['role']}"
        if e.get("text"):
            line += f' "{e["text"]}"'
        if "value" in e:
            line += f" value={json.dumps(e['value'])}"
        if e.get("options"):
            line += " options=" + json.dumps(e["options"])
        for state in ("checked", "disabled", "readonly", "focused"):
            if e.get(state):
                line += f" {state}"
        lines.append(line)
    return "\n".join(lines) if lines else "(the page shows nothing to act on)"


def parse_command(text: str) -> tuple[str, tuple[Any, ...]] | str:
    """``click(3)``, ``type(4, "hi")``, ``press Enter`` … -> (name, args), or an error text."""
    match = _COMMAND.match(text.strip().splitlines()[0] if text.strip() else "")
    if not match:
        return f"cannot read {text[:80]!r} as an action"
    name, inner = match.group(1), match.group(2)
    if name not in ACTIONS:
        return f"unknown action {name!r}"
    if inner is None:
        args: tuple[Any, ...] = ()
    else:
        try:
            value = ast.literal_eval(f"({inner},)") if inner.strip() else ()
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # TypeError: {[1]: 2}
            return f"cannot read the arguments of {name}({inner[:60]})"
        args = tuple(value) if isinstance(value, tuple) else (value,)
    low, high = _ARITY[name]
    if not low <= len(args) <= high:
        return f"{name} takes {low}{'' if low == high else f' to {high}'} argument(s), got {len(args)}"
    # the page takes numbers and text (a complex number or a set made json.dumps and float() raise in the step)
    if not all(a is None or isinstance(a, (int, float, str)) for a in args):
        return f"the arguments of {name} are numbers or quoted text"
    if name == "click_xy" and not all(isinstance(a, (int, float)) for a in args):
        return "click_xy takes two numbers"
    return name, args


@dataclass
class Episode:
    """Per-episode state: the page as last seen and MiniWoB's verdict."""

    snapshot: Snapshot = field(default_factory=Snapshot)
    task: str = ""
    seed: int = 0
    done: bool = False
    reward: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)  # the scripted solver's notes


class WebEnv(ToolEnv):
    """Real MiniWoB++ web tasks in a real Chromium, read as text (and optionally as a screenshot).

    ## Description
    Each episode is one MiniWoB++ task instance (``click-button``, ``login-user``, ``choose-date``, …): its
    page, from PyPI ``miniwob``, is served to a context of one shared headless Chromium (Playwright), the
    episode is started and seeded through MiniWoB's own JavaScript, and MiniWoB's reward is the env reward.
    ``toolgym/Web-v0`` draws the task from ``tasks`` (default: the tasks with a scripted solver);
    ``toolgym/MiniWoB-<task>-v0`` fixes it.

    ## Action Space
    Text commands (``action_format="command"``, the default), one per turn: ``click(ID)``,
    ``type(ID, "text")``, ``press("Enter")``, ``select(ID, "option")``, ``scroll("down"[, ID])``,
    ``click_xy(X, Y)``. With ``action_format="hermes"`` (or "tags") the same six are tools; the episode then
    ends with ``<answer>done</answer>`` after the page has given its reward.

    ## Observation Space
    ``Messages``: the instruction and the page as text, one line per visible element:
    ``[12] button "Submit"``, ``[4] textbox "Username" value="ann" focused``, ``[7] checkbox "red" checked``,
    ``[9] combobox value="" options=["a","b"]``, ``[3] text "Lorem ipsum"``. Ids are stable for the page's
    life. With ``screenshots=True`` each observation also carries a PNG as an ``image_url`` content part.
    A bad id, a stale element or an unknown option is an observation, never an exception.

    ## Tools
    ``click``, ``type``, ``press``, ``select``, ``scroll``, ``click_xy`` (hermes/tags formats only).

    ## Rewards
    ``reward``: MiniWoB's raw reward when the episode ends (1 solved, -1 or partial otherwise; with
    ``time_penalty=True`` MiniWoB's time-discounted reward); ``format``: ``format_penalty`` for an
    unreadable action. Success means MiniWoB's reward > 0.

    ## Episode End
    ``terminated`` when MiniWoB ends the episode (command format) or at the answer (tool formats);
    ``truncated`` at ``max_turns`` (default 20) or, with ``info["truncation"] = "env_error"``, when Chromium
    crashed (it is relaunched on the next reset).

    ## Arguments
    ``task`` (a MiniWoB task name, Web-v0 only), ``tasks`` (the pool Web-v0 draws from), ``screenshots``
    (False), ``screenshot_dir`` (None: a ``screenshot`` command saves a PNG there, for people playing),
    ``time_penalty`` (False), ``episode_time_limit_s`` (None: no MiniWoB clock), ``action_timeout_ms``
    (2000), ``reload_each_episode`` (False), ``own_browser`` (False: share the process's Chromium; True: a
    Chromium of its own with the same step code, for comparison), plus the base knobs.

    ## Info
    ``miniwob_task``, ``miniwob_reward`` (after the episode), ``elements`` (count of listed elements).

    ## Expert
    Scripted solvers for the tasks in ``toolgym.envs.web.expert.SOLVERS`` read the same element list the
    model sees; other tasks have no expert (it gives up) and declare ``expert_success_rate = 0``.
    """

    family: ClassVar[str] = "web"
    supports_fork: ClassVar[bool] = False  # a live page cannot be copied
    expert_success_rate: ClassVar[float] = 0.9
    action_format = "command"
    reward_keys: ClassVar[tuple[str, ...]] = ("reward", "format")
    fixed_task: ClassVar[str | None] = None
    check_expert_episodes: ClassVar[int | None] = 10  # `toolgym check`: browser episodes are slow
    # False: a seed does not fix the episode (the page moves with the wall clock); the checks skip determinism
    deterministic: ClassVar[bool] = True

    def __init__(
        self,
        task: str | None = None,
        tasks: list[str] | None = None,
        screenshots: bool = False,
        screenshot_dir: str | None = None,
        time_penalty: bool = False,
        episode_time_limit_s: float | None = None,
        action_timeout_ms: int = 2000,
        reload_each_episode: bool = False,
        own_browser: bool = False,
        max_turns: int = 20,
        **kwargs: Any,
    ) -> None:
        known = miniwob_tasks()
        if self.fixed_task is not None:
            if task not in (None, self.fixed_task) or tasks is not None:
                raise ConfigError(f"{type(self).__name__} plays {self.fixed_task} only; use Web-v0 to choose")
            pool = [self.fixed_task]
        elif task is not None:
            pool = [task]
        else:
            pool = list(tasks) if tasks is not None else sorted(SOLVERS)
        unknown = [t for t in pool if t not in known]
        if unknown or not pool:
            raise ConfigError(f"unknown MiniWoB task(s) {unknown or pool}; playable ones: {', '.join(known)}")
        if episode_time_limit_s is not None and episode_time_limit_s <= 0:
            raise ConfigError(f"episode_time_limit_s must be > 0 or None, got {episode_time_limit_s}")
        if action_timeout_ms < 1:
            raise ConfigError(f"action_timeout_ms must be >= 1, got {action_timeout_ms}")
        self.pool = pool
        self.screenshots = screenshots
        self.screenshot_dir = Path(screenshot_dir) if screenshot_dir else None
        self.time_penalty = time_penalty
        self.max_time_ms = int(episode_time_limit_s * 1000) if episode_time_limit_s else NO_LIMIT_MS
        self.action_timeout_ms = action_timeout_ms
        self.reload_each_episode = reload_each_episode
        self.own_browser = own_browser
        self._host: BrowserHost | None = None
        self._page: MiniWoBPage | None = None
        self._html_dir = miniwob_html_dir()
        self._command_ok = True
        self._pending: dict[str, float] = {}
        super().__init__(max_turns=max_turns, **kwargs)

    # ----- the browser -------------------------------------------------------------------------------------
    def _ensure_page(self) -> MiniWoBPage:
        if self._page is not None and self._page.alive():
            return self._page
        if self._page is not None:  # the browser died under us: drop the old context, open a new one
            self._page.close()
            self._page = None
        if self._host is None:
            self._host = BrowserHost() if self.own_browser else BrowserHost.shared()
            self._host.acquire()
        page = MiniWoBPage(self._host, self._html_dir, self.action_timeout_ms)
        page.open()
        self._page = page
        return page

    def close(self) -> None:
        if self._page is not None:
            self._page.close()
            self._page = None
        if self._host is not None:
            host, self._host = self._host, None
            host.release()
        super().close()

    def __del__(self) -> None:  # an env dropped without close() must still give its holder count back
        try:
            if getattr(self, "_host", None) is not None:
                self.close()
        except Exception:
            pass

    # ----- hooks -------------------------------------------------------------------------------------------
    def new_episode(self) -> Episode:
        return Episode()

    def make_task(self) -> Task:
        name = self.pool[int(self.np_random.integers(len(self.pool)))] if len(self.pool) > 1 else self.pool[0]
        seed = int(self.np_random.integers(2**31 - 1))
        snap = None
        for attempt in range(2):  # one retry on a fresh browser: a crash between episodes is not the task's
            try:
                page = self._ensure_page()
                snap = page.start(name, seed, self.max_time_ms, self.reload_each_episode)
                break
            except InfrastructureError:
                if attempt == 1:
                    raise
                if self._page is not None:
                    self._page.close()
                    self._page = None
        assert snap is not None
        ep = self.episode
        ep.snapshot, ep.task, ep.seed = snap, name, seed
        prompt = f"Task: {snap.utterance}\n\nPage:\n{render(snap)}"
        return Task(task_id=f"miniwob-{name}-{seed}", prompt=prompt, data={"miniwob_task": name})

    def tools(self) -> list[Tool]:
        if self.action_format == "command":
            return []
        return [Tool(self.click), Tool(self.type), Tool(self.press), Tool(self.select), Tool(self.scroll),
                Tool(self.click_xy)]  # fmt: skip

    def instructions(self) -> str:
        how = (
            'Reply with exactly one action per turn: click(ID), type(ID, "text"), press("Enter"), '
            'select(ID, "option"), scroll("down") or scroll("down", ID), click_xy(X, Y).'
            if self.action_format == "command"
            else "Act with the tools, one action per call. When the page says the task is over, give the final "
            "answer done."
        )
        return (
            "You operate a web page to do the task it states. The page is listed one element per line as "
            f'[ID] role "label" value=... states; IDs stay the same while the page lives. {how}'
        )

    def run_command(self, command: str) -> CommandOutcome:
        if command.strip() == "screenshot":
            return CommandOutcome(observation=self._save_screenshot())
        if command.strip() == "stop":  # giving up ends the episode as a failure
            self.episode.done = True
            return CommandOutcome(observation="You stopped: the task is not done.", terminated=True)
        parsed = parse_command(command)
        if isinstance(parsed, str):
            self._command_ok = False
            return CommandOutcome(
                observation=f"Invalid action: {parsed}. Actions: {', '.join(a + '(…)' for a in ACTIONS)}.",
                reward_components={"format": self.format_penalty} if self.format_penalty else {},
            )
        self._command_ok = True
        return self._do(*parsed)

    def check_answer(self, answer: str) -> dict[str, float]:
        return {}  # tool formats: MiniWoB's reward came with the action that ended its episode

    def is_success(self, components: dict[str, float]) -> bool:
        ep = self.episode
        return bool(ep is not None and ep.done and ep.reward > 0)

    def tool_reward(self, call: ToolCall, output: str) -> dict[str, float]:
        pending, self._pending = self._pending, {}
        return pending

    def expert_action(self) -> str:
        """The scripted solver's next action for this task (or giving up when the task has none)."""
        ep = self.episode
        if ep.done:
            return "<answer>done</answer>"
        solver = SOLVERS.get(ep.task)
        command = solver(ep.snapshot, ep.memory) if solver is not None else None
        if command is None:
            return "<answer>give up</answer>" if self.action_format != "command" else "stop"
        if self.action_format == "command":
            return command
        parsed = parse_command(command)
        assert not isinstance(parsed, str), parsed
        name, args = parsed
        params = list(Tool(getattr(self, name)).spec.parameters["properties"])
        arguments = dict(zip(params, args, strict=False))
        if self.action_format == "tags":
            return f"<{name}>{json.dumps(arguments)}</{name}>"
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """The MiniWoB task, the page's element count, its reward once done; a refused command is invalid."""
        ep = self.episode
        if ep is None or not ep.task:
            return {}
        out: dict[str, Any] = {"miniwob_task": ep.task, "elements": len(ep.snapshot.elements)}
        if not self._command_ok:
            out["invalid_action"] = True
            self._command_ok = True
        if ep.done:
            out["miniwob_reward"] = ep.reward
        return out

    # ----- the actions (tools in hermes/tags formats) -------------------------------------------------------
    def click(self, id: int) -> str:
        """Click an element.

        Args:
            id: the element's number, as in [12].
        """
        return self._do("click", (id,)).observation

    def type(self, id: int, text: str) -> str:
        """Replace the text of a text field.

        Args:
            id: the text field's number.
            text: the text to enter.
        """
        return self._do("type", (id, text)).observation

    def press(self, key: str) -> str:
        """Press a key on the focused element.

        Args:
            key: a key name such as Enter, Tab, Escape, Backspace, ArrowDown, or a character.
        """
        return self._do("press", (key,)).observation

    def select(self, id: int, option: str) -> str:
        """Choose an option of a dropdown.

        Args:
            id: the dropdown's number.
            option: the option's text.
        """
        return self._do("select", (id, option)).observation

    def scroll(self, direction: str, id: int | None = None) -> str:
        """Scroll the page, or one element.

        Args:
            direction: up, down, left or right.
            id: the element to scroll (default: the page).
        """
        return self._do("scroll", (direction,) if id is None else (direction, id)).observation

    def click_xy(self, x: float, y: float) -> str:
        """Click at a point of the page (in CSS pixels from its top-left corner; the page is 500x340).

        Args:
            x: pixels from the left.
            y: pixels from the top.
        """
        return self._do("click_xy", (x, y)).observation

    # ----- internals ---------------------------------------------------------------------------------------
    def _do(self, name: str, args: tuple[Any, ...]) -> CommandOutcome:
        ep = self.episode
        if ep.done:
            return CommandOutcome(observation="The task is over; give the final answer done.")
        if name == "press" and str(args[0]) not in KEYS and len(str(args[0])) != 1:
            error: str | None = f"unknown key {args[0]!r}; keys: {', '.join(KEYS)} or one character"
            snap = ep.snapshot
        else:
            page = self._page
            if page is None:
                raise InfrastructureError("the browser page is gone")
            error, snap = page.act(name, args)
        ep.snapshot = snap
        components: dict[str, float] = {}
        if snap.done:
            ep.done = True
            ep.reward = snap.reward if self.time_penalty else snap.raw_reward
            components["reward"] = ep.reward
            verdict = "solved" if ep.reward > 0 else "failed"
            text = f"The task is over: {verdict} (reward {ep.reward:g})."
            if self.action_format != "command":
                text += " Give the final answer done."
        else:
            text = render(snap)
            if error:
                text = f"Error: {error}\n\nPage:\n{text}"
        self._pending = components if self.action_format != "command" else {}
        return CommandOutcome(observation=text, reward_components=components, terminated=ep.done,
                              success=ep.done and ep.reward > 0)  # fmt: skip

    def _save_screenshot(self) -> str:
        if self.screenshot_dir is None:
            return "Screenshots are off: make the env with screenshot_dir=DIR to save them."
        page = self._page
        if page is None:
            raise InfrastructureError("the browser page is gone")
        self.screenshot_dir.mkdir(parents=True, exist_ok=True)
        path = self.screenshot_dir / f"{self.task.task_id}-turn{self._turn}-{int(time.time() * 1000)}.png"
        path.write_bytes(page.screenshot())
        return f"Saved a screenshot to {path}."

    def _with_image(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        page = self._page
        if not messages or page is None or not page.alive():
            return messages
        last = messages[-1]
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        url = f"data:image/png;base64,{page.screenshot_b64()}"
        parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
        messages = [*messages[:-1], {**last, "content": parts}]
        old = self._transcript[-1]
        self._transcript[-1] = old.model_copy(update={"content": parts})
        return messages

    def decorate_observation(self, messages: list[dict[str, Any]], ended: bool) -> list[dict[str, Any]]:
        """With ``screenshots``: the page's screenshot joins the last message while the episode runs."""
        return self._with_image(messages) if self.screenshots and not ended and messages else messages


# Tasks whose page changes with the wall clock, so one seed does not give one episode: stock-market's price
# ticks every 100 ms from the moment the page starts, and the price shown depends on when it is read
WALL_CLOCK_TASKS = {"stock-market": "the price ticks every 100 ms of wall-clock time"}


def _task_class(task: str) -> type[WebEnv]:
    clock = WALL_CLOCK_TASKS.get(task)
    doc = (
        f"MiniWoB++ ``{task}`` in a real Chromium"
        + (f" (not deterministic per seed: {clock})" if clock else "")
        + " (see ``WebEnv`` for the contract).\n"
    )
    declared = 0.9 if task in SOLVERS else 0.0
    attrs = {"fixed_task": task, "__doc__": doc, "expert_success_rate": declared, "deterministic": not clock}
    return type(class_name(task), (WebEnv,), attrs)


_CLASSES = {class_name(t): t for t in miniwob_tasks()}


def __getattr__(name: str) -> type[WebEnv]:
    """``MiniWoB_click_button`` and friends: one class per task id, made on first use."""
    task = _CLASSES.get(name)
    if task is None:
        raise AttributeError(name)
    cls = _task_class(task)
    globals()[name] = cls
    return cls
