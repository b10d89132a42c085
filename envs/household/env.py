"""toolgym/Household-v0: ALFWorld-style household tasks in a fast pure-Python world."""

from __future__ import annotations

from typing import Any, ClassVar

from toolgym.envs.base import CommandOutcome, Task, ToolEnv
from toolgym.envs.household.catalog import ALIASES, TASK_TYPES
from toolgym.envs.household.expert import expert_action, plan
from toolgym.envs.household.tasks import LAYOUTS, SPLITS, make_scene, min_receptacles
from toolgym.envs.household.world import (
    CLOSE,
    EXAMINE,
    EXAMINE_HELD,
    GO,
    GO_ROOM,
    INVENTORY,
    LOOK,
    OPEN,
    World,
)
from toolgym.errors import ConfigError
from toolgym.messages import ToolCall
from toolgym.tools import Tool

WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
NOTHING = "Nothing happens."
# actions that never change how far the goal is (GO can, in look tasks: arriving at a lit lamp)
_QUIET = frozenset({GO_ROOM, OPEN, CLOSE, EXAMINE, EXAMINE_HELD, LOOK, INVENTORY})


class HouseholdEnv(ToolEnv):
    """ALFWorld's household tasks (put, clean, heat, cool, examine under a lamp, two objects) as text.

    ## Description
    A seeded world of rooms, numbered receptacles (cabinet 1, drawer 2, fridge 1, sinkbasin 1, …) and objects
    (mug 1, apple 2, desklamp 1, …). Each episode asks for one of ALFWorld's six task types, e.g. "Your task
    is to: put a clean mug in coffeemachine." The agent only sees what it walks up to, and a closed
    receptacle hides its contents until opened. Texts and commands follow ALFWorld's, so prompts and
    policies carry over.

    ## Action Space
    Plain commands (``action_format="command"``, the default): the whole reply (outside ``<think>``) is one
    command: ``go to R``, ``open R``, ``close R``, ``take O from R``, ``put O in/on R`` (also "put O in R",
    "put O on R", "move O to R"), ``clean O with R``, ``heat O with R``, ``cool O with R``, ``use L``,
    ``examine X``, ``look``, ``inventory``. With ``action_format="hermes"`` (or "tags") the same commands go
    through an ``act(command)`` tool, and the episode ends with a final answer once the task is done.

    ## Observation Space
    ``Messages``: on reset the system prompt and the opening text (room overview and task); on each step one
    message with ALFWorld's feedback ("You arrive at cabinet 1. The cabinet 1 is closed.", or "Nothing
    happens." for a command that does nothing here). ``info["admissible_commands"]`` lists every command that
    does something in the current state; ``list_commands=True`` also appends them to each observation.

    ## Tools
    None in command format. ``act(command)`` in tool formats (the observation is its result).

    ## Rewards
    ``success``: 1.0 when the goal is reached. ``progress``: ``subgoal_reward`` the first time each
    intermediate subgoal is reached (holding a goal object; cleaned/heated/cooled it; the first of two
    placed), default 0 (sparse). ``invalid``: ``invalid_penalty`` (default -0.01) for a command that does
    nothing. ``format``: ``format_penalty`` for an empty reply (or a malformed tool call).

    ## Starting State
    A layout (rooms and receptacles) from the split, a goal it supports, goal objects placed anywhere but
    in the goal's receptacle type, distractor objects, and the agent in the middle of a random room.
    ``info`` carries ``optimal_steps`` (the planner's plan length from the start), ``task_type``,
    ``admissible_commands`` and ``state_key`` (an exact text key of the world state, for GiGPO groups).

    ## Episode End
    Terminated when the goal is reached (command format) or when a final answer is given (tool formats;
    success if the goal was reached). Truncated after ``max_turns`` (default 50, ALFWorld's usual budget).

    ## Arguments
    ``rooms`` (1, up to 4: kitchen, livingroom, bedroom, bathroom; several rooms are joined, and "go to
    bedroom" moves between them), ``receptacles`` (None: ALFWorld-like sizes, about 10-35 a room; an int
    sets the count per room, at least 8), ``distractors`` (None: 6-14 objects a room; an int sets it),
    ``task_types`` (None: all six; names as ALFWorld's or short: pick, look, clean, heat, cool, pick_two),
    ``split`` ("train", "seen": held-out goals in training layouts, "unseen": held-out layouts),
    ``subgoal_reward`` (0.0), ``invalid_penalty`` (-0.01), ``list_commands`` (False), ``max_turns`` (50),
    ``action_format`` ("command", or "hermes"/"tags" for the act tool), ``format_penalty`` (-0.1).

    ## Version History
    - v0: first version.
    """

    family: ClassVar[str] = "household"
    expert_success_rate: ClassVar[float] = 1.0
    action_format = "command"
    reward_keys: ClassVar[tuple[str, ...]] = ("success", "progress", "invalid", "format")

    def __init__(
        self,
        *,
        rooms: int = 1,
        receptacles: int | None = None,
        distractors: int | None = None,
        task_types: list[str] | tuple[str, ...] | str | None = None,
        split: str = "train",
        subgoal_reward: float = 0.0,
        invalid_penalty: float = -0.01,
        list_commands: bool = False,
        max_turns: int = 50,
        **kwargs: Any,
    ) -> None:
        if not 1 <= rooms <= 4:
            raise ConfigError(f"rooms must be between 1 and 4, got {rooms}")
        low = min_receptacles(rooms)
        if receptacles is not None and not low <= receptacles <= 60:
            raise ConfigError(f"receptacles must be None or between {low} and 60 per room, got {receptacles}")
        if distractors is not None and not 0 <= distractors <= 60:
            raise ConfigError(f"distractors must be None or between 0 and 60 per room, got {distractors}")
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {list(SPLITS)}, got {split!r}")
        self.rooms = rooms
        self.receptacles = receptacles
        self.distractors = distractors
        self.task_types = _task_types(task_types)
        self.split = split
        self.subgoal_reward = subgoal_reward
        self.invalid_penalty = invalid_penalty
        self.list_commands = list_commands
        super().__init__(max_turns=max_turns, **kwargs)

    # ----- hooks -------------------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        if self.action_format == "command":
            return []
        return [Tool(self.act)]

    def act(self, command: str) -> str:
        """Do one household command (e.g. "go to cabinet 1", "take mug 1 from cabinet 1").

        Args:
            command: one command in ALFWorld's grammar.
        """
        return self._do(command).observation

    def instructions(self) -> str:
        how = (
            "Reply with exactly one command per turn."
            if self.action_format == "command"
            else "Act with the act tool, one command per call; when the task is done, give the final answer done."
        )
        return (
            "You are an agent in a household. Reach the goal with text commands: go to [receptacle], "
            "open [receptacle], close [receptacle], take [object] from [receptacle], "
            "put [object] in/on [receptacle], clean [object] with [receptacle], heat [object] with "
            "[receptacle], cool [object] with [receptacle], use [lamp], examine [something], look, "
            f"inventory. You can hold one object at a time. {how}"
        )

    def make_task(self) -> Task:
        scene, where, room, index = make_scene(
            self.np_random,
            rooms=self.rooms,
            receptacles=self.receptacles,
            distractors=self.distractors,
            task_types=self.task_types,
            split=self.split,
        )
        ep = self.episode
        ep.world = World(scene, where, room)
        ep.look = scene.goal.kind == "look_at_obj_in_light"
        ep.layout = index
        ep.optimal = len(plan(ep.world))
        goal = scene.goal
        prompt = f"{WELCOME}\n\n{scene.overview(room)}\n\nYour task is to: {goal.text}"
        if self.list_commands:
            prompt += self._commands_text()
        task_id = f"household-{self.split}-L{index}-{goal.kind}-{goal.obj_type}-{goal.target_type}-{hash(tuple(where)) & 0xFFFFFF:06x}"
        return Task(task_id=task_id, prompt=prompt, answer=None, data={"task_type": goal.kind})

    def run_command(self, command: str) -> CommandOutcome:
        return self._do(command)

    def check_answer(self, answer: str) -> dict[str, float]:
        return {}  # tool formats: the success reward came when the goal was reached

    def is_success(self, components: dict[str, float]) -> bool:
        return self.world is not None and self.world.solved()

    def tool_reward(self, call: ToolCall, output: str) -> dict[str, float]:
        return self.episode.pending

    def expert_action(self) -> str:
        """The planner's next command (it sees the whole world); in tool formats, an act call or the answer."""
        return expert_action(self._world(), self.action_format)

    # ----- the world ---------------------------------------------------------------------------------------
    @property
    def world(self) -> World | None:
        """The episode's world (None before the first reset)."""
        return self.episode.world if self.episode is not None else None

    def new_episode(self) -> Episode:
        return Episode()

    def _world(self) -> World:
        world = self.world
        if world is None:
            self.task  # noqa: B018  (raises the "call reset() first" error)
        assert world is not None
        return world

    def _do(self, command: str) -> CommandOutcome:
        world = self._world()
        components: dict[str, float] = {}
        action = world.parse(command)
        ep = self.episode
        if action is None:
            ep.command_ok = False
            self._invalid += 1
            if self.invalid_penalty:
                components["invalid"] = self.invalid_penalty
            text = NOTHING
            done = False
        else:
            ep.command_ok = True
            text = world.execute(action)
            if action[0] in _QUIET or (action[0] == GO and not ep.look):
                return self._outcome(text, components, False)
            reached = world.progress()
            done = reached[-1]
            count = 0
            for ok in reached:
                if not ok:
                    break
                count += 1
            if count > ep.reached:
                if self.subgoal_reward:
                    components["progress"] = self.subgoal_reward * (
                        min(count, len(reached) - 1) - min(ep.reached, len(reached) - 1)
                    )
                if done and ep.reached < len(reached):
                    components["success"] = 1.0
                ep.reached = count
        return self._outcome(text, components, done)

    def _outcome(self, text: str, components: dict[str, float], done: bool) -> CommandOutcome:
        if self.list_commands and not done:
            text += self._commands_text()
        self.episode.pending = components if self.action_format != "command" else {}
        return CommandOutcome(
            observation=text,
            reward_components=components,
            terminated=done and self.action_format == "command",
            success=done,
        )

    def _commands_text(self) -> str:
        return "\nAdmissible commands: " + ", ".join(self._world().commands()) + "."

    def extra_info(self, info: dict[str, Any], ended: bool) -> dict[str, Any]:
        """Admissible commands, the state key (GiGPO), the optimal step count and the task type; a command
        the world refused makes the turn invalid."""
        world = self.world
        if world is None:
            return {}
        out: dict[str, Any] = {
            "admissible_commands": world.commands(),
            "state_key": world.key(),
            "optimal_steps": self.episode.optimal,
            "task_type": world.scene.goal.kind,
        }
        if not self.episode.command_ok:
            out["invalid_action"] = True
            self.episode.command_ok = True
        return out


class Episode:
    """Everything that changes in an episode (the base class copies it for forks with ``clone``)."""

    __slots__ = ("command_ok", "layout", "look", "optimal", "pending", "reached", "world")

    def __init__(self) -> None:
        self.world: World | None = None
        self.layout = -1
        self.optimal = 0
        self.reached = 0  # subgoals reached so far (they are ordered; progress never goes back)
        self.look = False
        # within one step: whether the world understood the command (read by extra_info), and the reward
        # components of an act call (read by tool_reward)
        self.command_ok = True
        self.pending: dict[str, float] = {}

    def clone(self) -> Episode:
        other = Episode()
        other.world = self.world.clone() if self.world is not None else None
        other.layout, other.optimal, other.reached, other.look = (
            self.layout,
            self.optimal,
            self.reached,
            self.look,
        )
        other.command_ok, other.pending = self.command_ok, dict(self.pending)
        return other


def _task_types(value: list[str] | tuple[str, ...] | str | None) -> tuple[str, ...]:
    if value is None:
        return TASK_TYPES
    names = [value] if isinstance(value, str) else list(value)
    out = []
    for name in names:
        full = ALIASES.get(name, name)
        if full not in TASK_TYPES:
            known = ", ".join([*TASK_TYPES, *ALIASES])
            raise ConfigError(f"unknown task type {name!r}; known: {known}")
        if full not in out:
            out.append(full)
    if not out:
        raise ConfigError("task_types must name at least one task type")
    return tuple(out)


__all__ = ["LAYOUTS", "HouseholdEnv"]
