"""The household world: a static ``Scene`` (rooms, receptacles, objects, goal) and the ``World`` that plays
commands on it.

The dynamic state is a handful of ints and two short lists (where each object is, what state it is in), so a
snapshot is one tuple and restoring it is a few assignments; the scene is immutable and shared by every copy
(``__deepcopy__`` returns it unchanged), which keeps forking an episode cheap.

Text follows ALFWorld's conventions ("You arrive at cabinet 1. The cabinet 1 is closed.", "Nothing
happens.") and its command grammar: ``go to R``, ``open R``, ``close R``, ``take O from R``,
``put O in/on R``, ``clean/heat/cool O with R``, ``use L``, ``examine X``, ``look``, ``inventory``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from toolgym.envs.household.catalog import (
    CLEAN_WITH,
    CLEANABLE,
    COOL_WITH,
    COOLABLE,
    HEAT_WITH,
    HEATABLE,
    INSIDE,
    IS_CLEAN,
    IS_COOL,
    IS_HOT,
    IS_ON,
    OPENABLE,
)

# Verbs of parsed actions.
GO, GO_ROOM, OPEN, CLOSE, TAKE, PUT, CLEAN, HEAT, COOL, USE, EXAMINE, EXAMINE_HELD, LOOK, INVENTORY = range(
    14
)
HELD = 255  # ``where`` of the object in hand (a byte, so the state key is ``bytes(where)``)
NOWHERE = -1  # ``at`` in the middle of a room


@dataclass(frozen=True)
class Goal:
    """What the task asks: its type, the object type, and the receptacle type (or lamp type for "look")."""

    kind: str
    obj_type: str
    target_type: str
    text: str


@dataclass(eq=False)
class Scene:
    """The static part of an episode. Never mutated after ``__post_init__``; shared by world copies."""

    room_names: tuple[str, ...]
    rec_types: tuple[str, ...]
    rec_rooms: tuple[int, ...]
    obj_types: tuple[str, ...]
    obj_names: tuple[str, ...]
    obj_caps: tuple[int, ...]
    obj_is_lamp: tuple[bool, ...]
    goal: Goal
    rec_names: tuple[str, ...] = field(init=False)
    rec_openable: tuple[bool, ...] = field(init=False)
    rec_role: tuple[int, ...] = field(init=False)  # 0, CLEAN, HEAT or COOL (the verbs)
    targets: frozenset[int] = field(init=False)  # receptacles of the goal's receptacle type
    candidates: tuple[int, ...] = field(init=False)  # objects of the goal's object type
    lamps: tuple[int, ...] = field(init=False)  # lamps of the goal's lamp type

    def __post_init__(self) -> None:
        tables = _receptacle_tables(self.room_names, self.rec_types, self.rec_rooms)
        self.rec_names, self.rec_openable, self.rec_role = tables.names, tables.openable, tables.role
        self.rec_index, self.room_index, self.goto = tables.index, tables.room_index, tables.goto
        self.goto_cmd, self.prep, self._goto_lists = tables.goto_cmd, tables.prep, tables.goto_lists
        g = self.goal
        self.targets = frozenset(i for i, t in enumerate(self.rec_types) if t == g.target_type)
        self.candidates = tuple(i for i, t in enumerate(self.obj_types) if t == g.obj_type)
        self.lamps = tuple(
            i for i, t in enumerate(self.obj_types) if t == g.target_type and self.obj_is_lamp[i]
        )
        self.obj_index = {n: i for i, n in enumerate(self.obj_names)}
        self._pair_cache: dict[tuple[int, int, int], str] = {}

    def goto_list(self, room: int, at: int) -> tuple[str, ...]:
        """The "go to" commands admissible in a room from a place (cached)."""
        key = (room, at)
        found = self._goto_lists.get(key)
        if found is None:
            found = tuple(c for c, a in self.goto[room].items() if a[0] == GO_ROOM or a[1] != at)
            self._goto_lists[key] = found
        return found

    def __deepcopy__(self, memo: dict[int, Any]) -> Scene:
        return self  # immutable: every copy of a world shares it

    def pair(self, verb: int, obj: int, rec: int) -> str:
        """The command text of a verb with an object and a receptacle (cached)."""
        key = (verb, obj, rec)
        text = self._pair_cache.get(key)
        if text is None:
            o, r = self.obj_names[obj], self.rec_names[rec]
            word = {TAKE: "take {o} from {r}", PUT: "put {o} in/on {r}", CLEAN: "clean {o} with {r}"}
            word |= {HEAT: "heat {o} with {r}", COOL: "cool {o} with {r}"}
            text = word[verb].format(o=o, r=r)
            self._pair_cache[key] = text
        return text

    def overview(self, room: int) -> str:
        """What you see from the middle of a room."""
        seen = see_list([self.rec_names[i] for i in range(len(self.rec_names)) if self.rec_rooms[i] == room])
        if len(self.room_names) == 1:
            return f"You are in the middle of a room. Looking quickly around you, you see {seen}."
        exits = " and ".join(f"the {n}" for j, n in enumerate(self.room_names) if j != room)
        name = self.room_names[room]
        return f"You are in the middle of the {name}. Looking quickly around you, you see {seen}. From here you can go to {exits}."


class _Tables:
    """Names and command tables of a set of receptacles: the same for every episode of a layout."""

    def __init__(self, room_names: tuple[str, ...], rec_types: tuple[str, ...], rec_rooms: tuple[int, ...]):
        counts: dict[str, int] = {}
        names = []
        for t in rec_types:
            counts[t] = counts.get(t, 0) + 1
            names.append(f"{t} {counts[t]}")
        self.names = tuple(names)
        self.openable = tuple(t in OPENABLE for t in rec_types)
        role = {
            **dict.fromkeys(CLEAN_WITH, CLEAN),
            **dict.fromkeys(HEAT_WITH, HEAT),
            **dict.fromkeys(COOL_WITH, COOL),
        }
        self.role = tuple(role.get(t, 0) for t in rec_types)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.room_index = {n: i for i, n in enumerate(room_names)}
        self.goto: list[dict[str, tuple[int, int]]] = []
        for k in range(len(room_names)):
            cmds: dict[str, tuple[int, int]] = {}
            for i, n in enumerate(self.names):
                if rec_rooms[i] == k:
                    cmds[f"go to {n}"] = (GO, i)
            for j, other in enumerate(room_names):
                if j != k:
                    cmds[f"go to {other}"] = (GO_ROOM, j)
            self.goto.append(cmds)
        self.goto_cmd = tuple(f"go to {n}" for n in self.names)
        self.prep = tuple("in" if t in INSIDE else "on" for t in rec_types)
        self.goto_lists: dict[tuple[int, int], tuple[str, ...]] = {}


@lru_cache(maxsize=1024)
def _receptacle_tables(
    room_names: tuple[str, ...], rec_types: tuple[str, ...], rec_rooms: tuple[int, ...]
) -> _Tables:
    return _Tables(room_names, rec_types, rec_rooms)


def see_list(names: list[str]) -> str:
    """ALFWorld's listing: "a X", "a X, and a Y", "a X, a Y, and a Z"; "nothing" when empty."""
    if not names:
        return "nothing"
    if len(names) == 1:
        return f"a {names[0]}"
    return ", ".join(f"a {n}" for n in names[:-1]) + f", and a {names[-1]}"


_SPACES = re.compile(r"\s+")
_PUT = re.compile(r"^(?:put|place|move) (.+?) (?:in/on|in|on|into|onto|inside|to) (?:the )?(.+)$")
_TAKE = re.compile(r"^(?:take|pick up|get|grab) (?:the )?(.+?)(?: from (?:the )?(.+))?$")
_WITH = re.compile(r"^(clean|heat|cool) (?:the )?(.+?)(?: (?:with|using|in) (?:the )?(.+))?$")
_ONE_ARG = re.compile(
    r"^(go to|goto|go|walk to|open|close|use|examine|x|toggle|turn on|turn off) (?:the )?(.+)$"
)
_SHORT = {
    "l": "look",
    "look around": "look",
    "i": "inventory",
    "inv": "inventory",
    "look at inventory": "inventory",
}
_ONE_VERB = {"goto": "go to", "go": "go to", "walk to": "go to", "x": "examine"}
_ONE_VERB |= {"toggle": "use", "turn on": "use", "turn off": "use"}


class World:
    """One household episode: commands in, ALFWorld-style text out.

    State: ``room`` (index), ``at`` (receptacle index or ``NOWHERE``), ``hold`` (object index or -1),
    ``opened`` (bit mask over receptacles), ``where`` (receptacle of each object, ``HELD`` in hand) and
    ``flags`` (IS_CLEAN | IS_HOT | IS_COOL | IS_ON per object).
    """

    __slots__ = ("_adm", "at", "flags", "hold", "opened", "room", "scene", "where")

    def __init__(self, scene: Scene, where: list[int], room: int = 0) -> None:
        self.scene = scene
        self.room = room
        self.at = NOWHERE
        self.hold = -1
        self.opened = 0
        self.where = bytearray(where)  # bytes: copied, compared and keyed at C speed
        self.flags = bytearray(len(where))
        self._adm: dict[str, tuple[int, ...]] | None = None

    # ----- state -------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[Any, ...]:
        """The whole dynamic state as one immutable tuple (exact; usable as a key)."""
        return (self.room, self.at, self.hold, self.opened, bytes(self.where), bytes(self.flags))

    def clone(self) -> World:
        """A copy that shares the (immutable) scene."""
        other = World.__new__(World)
        other.scene, other.room, other.at, other.hold, other.opened = (
            self.scene,
            self.room,
            self.at,
            self.hold,
            self.opened,
        )
        other.where, other.flags, other._adm = bytearray(self.where), bytearray(self.flags), self._adm
        return other

    def restore(self, snap: tuple[Any, ...]) -> None:
        self.room, self.at, self.hold, self.opened = snap[0], snap[1], snap[2], snap[3]
        self.where = bytearray(snap[4])
        self.flags = bytearray(snap[5])
        self._adm = None

    def key(self) -> str:
        """A short exact text key of the state (GiGPO anchor)."""
        return f"{self.room}.{self.at}.{self.hold}.{self.opened:x}.{self.where.hex()}.{self.flags.hex()}"

    def visible(self, rec: int) -> bool:
        return not self.scene.rec_openable[rec] or bool(self.opened >> rec & 1)

    def contents(self, rec: int) -> list[int]:
        return [i for i, w in enumerate(self.where) if w == rec]

    # ----- commands ----------------------------------------------------------------------------------------
    def admissible(self) -> dict[str, tuple[int, ...]]:
        """Every command that does something here, mapped to its parsed action."""
        cmds: dict[str, tuple[int, ...]] = {
            c: a for c, a in self.scene.goto[self.room].items() if a[0] == GO_ROOM or a[1] != self.at
        }
        cmds.update(self._local())
        return cmds

    def commands(self) -> list[str]:
        """The admissible commands as a list: every "go to", then what can be done here."""
        return [*self.scene.goto_list(self.room, self.at), *self._local()]

    def lookup(self, command: str) -> tuple[int, ...] | None:
        """The action of an admissible command in its exact form, else None."""
        action = self.scene.goto[self.room].get(command)
        if action is not None:
            return None if action[0] == GO and action[1] == self.at else action
        return self._local().get(command)

    def _local(self) -> dict[str, tuple[int, ...]]:
        """The admissible commands other than "go to" (cached until the next move)."""
        if self._adm is not None:
            return self._adm
        s = self.scene
        cmds: dict[str, tuple[int, ...]] = {}
        at, hold = self.at, self.hold
        if at >= 0:
            name = s.rec_names[at]
            cmds[f"examine {name}"] = (EXAMINE, at)
            is_open = self.opened >> at & 1
            if s.rec_openable[at]:
                if is_open:
                    cmds[f"close {name}"] = (CLOSE, at)
                else:
                    cmds[f"open {name}"] = (OPEN, at)
            if not s.rec_openable[at] or is_open:
                for o in self.contents(at):
                    if s.obj_is_lamp[o]:
                        cmds[f"use {s.obj_names[o]}"] = (USE, o)
                    elif hold < 0:
                        cmds[s.pair(TAKE, o, at)] = (TAKE, o, at)
                if hold >= 0:
                    cmds[s.pair(PUT, hold, at)] = (PUT, hold, at)
            role = s.rec_role[at]
            if hold >= 0 and role:
                need = {CLEAN: CLEANABLE, HEAT: HEATABLE, COOL: COOLABLE}[role]
                if s.obj_caps[hold] & need:
                    cmds[s.pair(role, hold, at)] = (role, hold, at)
        if hold >= 0:
            cmds[f"examine {s.obj_names[hold]}"] = (EXAMINE_HELD, hold)
        cmds["inventory"] = (INVENTORY,)
        cmds["look"] = (LOOK,)
        self._adm = cmds
        return cmds

    def parse(self, command: str) -> tuple[int, ...] | None:
        """The action a command names when it is admissible now, else None. Accepts ALFWorld's exact form and
        a few human variants (case, a trailing period, "the", "move X to Y", "take X", "put X on Y")."""
        action = self.lookup(command)
        if action is not None:
            return action
        text = _SPACES.sub(" ", command.lower()).strip().rstrip(".!")
        get = self.lookup
        action = get(text)
        if action is not None:
            return action
        text = _SHORT.get(text, text)
        m = _PUT.match(text)
        if m:
            obj, rec = self.scene.obj_index.get(m.group(1)), self.scene.rec_index.get(m.group(2))
            if obj is not None and rec is not None:
                return get(self.scene.pair(PUT, obj, rec))
        m = _TAKE.match(text)
        if m and self.at >= 0:
            obj = self.scene.obj_index.get(m.group(1))
            rec = self.scene.rec_index.get(m.group(2)) if m.group(2) else self.at
            if obj is not None and rec is not None:
                return get(self.scene.pair(TAKE, obj, rec))
        m = _WITH.match(text)
        if m and self.at >= 0:
            obj = self.scene.obj_index.get(m.group(2))
            rec = self.scene.rec_index.get(m.group(3)) if m.group(3) else self.at
            verb = {"clean": CLEAN, "heat": HEAT, "cool": COOL}[m.group(1)]
            if obj is not None and rec is not None:
                return get(self.scene.pair(verb, obj, rec))
        m = _ONE_ARG.match(text)
        if m:
            word = _ONE_VERB.get(m.group(1), m.group(1))
            return get(f"{word} {m.group(2)}")
        return get(text)

    def execute(self, action: tuple[int, ...]) -> str:
        """Apply an admissible action and return the observation text."""
        s = self.scene
        verb = action[0]
        self._adm = None
        if verb == GO:
            r = action[1]
            self.at = r
            return f"You arrive at {s.rec_names[r]}. {self.describe(r)}"
        if verb == GO_ROOM:
            self.room, self.at = action[1], NOWHERE
            return f"You go to the {s.room_names[self.room]}. {s.overview(self.room)}"
        if verb == OPEN:
            r = action[1]
            self.opened |= 1 << r
            return f"You open the {s.rec_names[r]}. {self.describe(r)}"
        if verb == CLOSE:
            r = action[1]
            self.opened &= ~(1 << r)
            return f"You close the {s.rec_names[r]}."
        if verb == TAKE:
            o, r = action[1], action[2]
            self.where[o] = HELD
            self.hold = o
            return f"You pick up the {s.obj_names[o]} from the {s.rec_names[r]}."
        if verb == PUT:
            o, r = action[1], action[2]
            self.where[o] = r
            self.hold = -1
            return f"You put the {s.obj_names[o]} {s.prep[r]} the {s.rec_names[r]}."
        if verb == CLEAN:
            o = action[1]
            self.flags[o] |= IS_CLEAN
            return f"You clean the {s.obj_names[o]} using the {s.rec_names[action[2]]}."
        if verb == HEAT:
            o = action[1]
            self.flags[o] = (self.flags[o] | IS_HOT) & ~IS_COOL
            return f"You heat the {s.obj_names[o]} using the {s.rec_names[action[2]]}."
        if verb == COOL:
            o = action[1]
            self.flags[o] = (self.flags[o] | IS_COOL) & ~IS_HOT
            return f"You cool the {s.obj_names[o]} using the {s.rec_names[action[2]]}."
        if verb == USE:
            o = action[1]
            self.flags[o] ^= IS_ON
            return f"You turn {'on' if self.flags[o] & IS_ON else 'off'} the {s.obj_names[o]}."
        if verb == EXAMINE:
            return self.describe(action[1])
        if verb == EXAMINE_HELD:
            o = action[1]
            states = [
                w
                for bit, w in ((IS_CLEAN, "clean"), (IS_HOT, "hot"), (IS_COOL, "cool"))
                if self.flags[o] & bit
            ]
            if not states:
                return f"There's nothing special about {s.obj_names[o]}."
            return f"The {s.obj_names[o]} is {' and '.join(states)}."
        if verb == LOOK:
            if self.at < 0:
                return s.overview(self.room)
            return f"You are facing the {s.rec_names[self.at]}. Next to it, you see nothing."
        if self.hold < 0:
            return "You are not carrying anything."
        return f"You are carrying: a {s.obj_names[self.hold]}."

    def describe(self, rec: int) -> str:
        s = self.scene
        name = s.rec_names[rec]
        if s.rec_openable[rec]:
            if not self.opened >> rec & 1:
                return f"The {name} is closed."
            return f"The {name} is open. In it, you see {see_list([s.obj_names[o] for o in self.contents(rec)])}."
        return f"On the {name}, you see {see_list([s.obj_names[o] for o in self.contents(rec)])}."

    # ----- the goal ----------------------------------------------------------------------------------------
    def progress(self) -> tuple[bool, ...]:
        """The goal's subgoals in order, each reached or not; the last is the goal itself."""
        s, g = self.scene, self.scene.goal
        kind = g.kind
        holding = self.hold >= 0 and self.hold in s.candidates
        if kind == "look_at_obj_in_light":
            lit = any(self.where[lamp] == self.at and self.flags[lamp] & IS_ON for lamp in s.lamps)
            return (holding, holding and self.at >= 0 and lit)
        if kind == "pick_two_obj_and_place":
            best = 0
            for r in s.targets:
                best = max(best, sum(1 for o in s.candidates if self.where[o] == r))
            return (holding or best >= 1, best >= 1, best >= 2)
        bit = {"pick_clean_then_place_in_recep": IS_CLEAN, "pick_heat_then_place_in_recep": IS_HOT}
        bit |= {"pick_cool_then_place_in_recep": IS_COOL}
        need = bit.get(kind, 0)
        done = any(self.where[o] in s.targets and self.flags[o] & need == need for o in s.candidates)
        if not need:
            return (holding or done, done)
        treated = any(self.flags[o] & need for o in s.candidates)
        return (holding or done, treated or done, done)

    def solved(self) -> bool:
        return self.progress()[-1]
