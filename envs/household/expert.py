"""The scripted expert, a planner: the shortest command sequence that reaches the goal from the current world
state.

It sees the whole world (closed receptacles included), so from the start of an episode its plan length is
the optimal plan length the env reports. It enumerates the few ways to reach each goal (which instance of
the object, which appliance, which target receptacle, in which order for two objects) and keeps the
shortest, simulating only what the cost depends on: the room, the place and which receptacles are open.
"""

from __future__ import annotations

from itertools import permutations

from toolgym.envs.household.catalog import IS_CLEAN, IS_COOL, IS_HOT, IS_ON
from toolgym.envs.household.world import CLEAN, COOL, HEAT, HELD, NOWHERE, PUT, TAKE, Scene, World

_TREAT = {
    "pick_clean_then_place_in_recep": (CLEAN, IS_CLEAN),
    "pick_heat_then_place_in_recep": (HEAT, IS_HOT),
    "pick_cool_then_place_in_recep": (COOL, IS_COOL),
}


class _Walk:
    """A plan being written: the commands so far and the position and open receptacles they lead to."""

    __slots__ = ("at", "cmds", "opened", "room", "scene")

    def __init__(self, scene: Scene, room: int, at: int, opened: int) -> None:
        self.scene, self.room, self.at, self.opened = scene, room, at, opened
        self.cmds: list[str] = []

    def copy(self) -> _Walk:
        w = _Walk(self.scene, self.room, self.at, self.opened)
        w.cmds = list(self.cmds)
        return w

    def go(self, rec: int) -> None:
        if self.at == rec:
            return
        s = self.scene
        if s.rec_rooms[rec] != self.room:
            self.room = s.rec_rooms[rec]
            self.cmds.append(f"go to {s.room_names[self.room]}")
        self.at = rec
        self.cmds.append(s.goto_cmd[rec])

    def reach(self, rec: int) -> None:
        """Stand at ``rec`` with it open (when it opens)."""
        self.go(rec)
        if self.scene.rec_openable[rec] and not self.opened >> rec & 1:
            self.opened |= 1 << rec
            self.cmds.append(f"open {self.scene.rec_names[rec]}")

    def take(self, obj: int, rec: int) -> None:
        self.reach(rec)
        self.cmds.append(self.scene.pair(TAKE, obj, rec))

    def put(self, obj: int, rec: int) -> None:
        self.reach(rec)
        self.cmds.append(self.scene.pair(PUT, obj, rec))


def _start(world: World) -> tuple[_Walk, int]:
    """A walk from the world's state; a held object that the goal does not want is put down first."""
    s = world.scene
    walk = _Walk(s, world.room, world.at, world.opened)
    hold = world.hold
    if hold >= 0 and hold not in s.candidates:
        spot = world.at
        if spot == NOWHERE:
            spot = next(i for i, r in enumerate(s.rec_rooms) if r == world.room and not s.rec_openable[i])
        walk.put(hold, spot)
        hold = -1
    return walk, hold


def plan(world: World) -> list[str]:
    """The shortest command list that solves the task from here (empty when already solved)."""
    if world.solved():
        return []
    s = world.scene
    kind = s.goal.kind
    base, hold = _start(world)
    best: list[str] | None = None

    def keep(walk: _Walk) -> None:
        nonlocal best
        if best is None or len(walk.cmds) < len(best):
            best = walk.cmds

    def fetch(walk: _Walk, obj: int) -> None:
        if hold != obj:
            walk.take(obj, world.where[obj])

    cands = [o for o in s.candidates if hold in (-1, o)]
    if kind == "look_at_obj_in_light":
        for o in cands:
            for lamp in s.lamps:
                walk = base.copy()
                fetch(walk, o)
                walk.go(world.where[lamp])
                if not world.flags[lamp] & IS_ON:
                    walk.cmds.append(f"use {s.obj_names[lamp]}")
                keep(walk)
    elif kind == "pick_two_obj_and_place":
        for r in sorted(s.targets):
            inside = [o for o in s.candidates if world.where[o] == r]
            need = 2 - len(inside)
            movable = [o for o in s.candidates if world.where[o] != r]
            for order in permutations(movable, need):
                if hold in s.candidates and hold not in order[:1]:
                    continue  # the object in hand goes first
                walk = base.copy()
                for o in order:
                    if o != hold:
                        walk.take(o, world.where[o])
                    walk.put(o, r)
                keep(walk)
    else:
        verb, bit = _TREAT.get(kind, (0, 0))
        tools = [i for i, role in enumerate(s.rec_role) if role == verb] if verb else []
        for o in cands:
            treated = world.flags[o] & bit == bit
            for tool in tools if not treated else [-1]:
                for r in sorted(s.targets):
                    walk = base.copy()
                    fetch(walk, o)
                    if tool >= 0:
                        walk.go(tool)
                        walk.cmds.append(s.pair(verb, o, tool))
                    walk.put(o, r)
                    keep(walk)
    if best is None:  # cannot happen for a generated scene; stay defined for hand-made ones
        return ["look"]
    return best


def next_command(world: World) -> str:
    """The planner's next command ("look" once the goal is reached)."""
    steps = plan(world)
    return steps[0] if steps else "look"


def expert_action(world: World, action_format: str) -> str:
    """The next action as model text: the planner's command as is (``command`` format), else an ``act``
    call, or the answer once the goal is reached."""
    if action_format == "command":
        return next_command(world)
    if world.solved():
        return "<answer>done</answer>"
    command = next_command(world)
    if action_format == "tags":
        return f"<act>{command}</act>"
    return f'<tool_call>{{"name": "act", "arguments": {{"command": "{command}"}}}}</tool_call>'


__all__ = ["HELD", "expert_action", "next_command", "plan"]
