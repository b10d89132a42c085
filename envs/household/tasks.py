"""Seeded households: layouts (which receptacles stand in which rooms), goals, and object placements.

Splits, as ALFWorld's: ``train`` and ``seen`` share layouts but never a goal (a goal is its type, object type
and receptacle type in a layout: one in eight is held out for ``seen``); ``unseen`` uses held-out layouts.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from toolgym.envs.household.catalog import (
    GOAL_TEXT,
    LAMPS,
    NEEDS,
    OBJECTS,
    ROOMS,
    STACKABLE,
    TASK_TYPES,
    object_rooms,
)
from toolgym.envs.household.world import Goal, Scene
from toolgym.errors import ConfigError

LAYOUTS = 120  # per (rooms, receptacles) setting
UNSEEN_FROM = 100  # layouts 100..119 are held out for the "unseen" split
SEEN_BUCKETS = 8  # one goal in eight (by hash) is held out for the "seen" split
SPLITS = ("train", "seen", "unseen")
ROOM_TYPES = tuple(ROOMS)


@dataclass(frozen=True)
class Layout:
    """Rooms and their receptacles, with every goal the layout supports, grouped by split and task type."""

    index: int
    room_names: tuple[str, ...]
    rec_types: tuple[str, ...]
    rec_rooms: tuple[int, ...]
    goals: dict[str, dict[str, tuple[tuple[str, str], ...]]]  # split -> task type -> (object, target)
    fits: tuple[tuple[str, ...], ...]  # per room: the object types that belong there
    spots: dict[tuple[int, str], list[int]]  # (room, object type) -> receptacles it may start in


def _room_receptacles(rng: np.random.Generator, room: str, count: int | None) -> list[str]:
    spec = ROOMS[room]
    if count is None:
        counts = {t: int(rng.integers(nat, most + 1)) for t, _, nat, most in spec}
    else:
        counts = {t: fewest for t, fewest, _, _ in spec}
        room_for = [t for t, _, _, most in spec]
        while sum(counts.values()) < count:
            t = room_for[int(rng.integers(len(room_for)))]
            most = next(m for name, _, _, m in spec if name == t)
            if counts[t] < most or t in STACKABLE:
                counts[t] += 1
    return [t for t, _, _, _ in spec for _ in range(counts[t])]


def min_receptacles(rooms: int) -> int:
    """The fewest receptacles a room can have (the ``receptacles`` knob may not go below it)."""
    return max(sum(f for _, f, _, _ in spec) for spec in ROOMS.values())


def _spot_types(names: tuple[str, ...], rec_types: list[str], rec_rooms: list[int], obj: str) -> set[str]:
    """Receptacle types the object may start in: of its places, those standing in a room it belongs in."""
    rooms = object_rooms(obj)
    return {t for t, k in zip(rec_types, rec_rooms, strict=True) if names[k] in rooms}


def _goal_split(index: int, kind: str, obj: str, target: str) -> str:
    h = zlib.crc32(f"{index}|{kind}|{obj}|{target}".encode()) % SEEN_BUCKETS
    return "seen" if h == 0 else "train"


@lru_cache(maxsize=4096)
def layout(index: int, rooms: int, receptacles: int | None) -> Layout:
    """Layout ``index`` of a setting (cached: a layout is the same every time it is asked for)."""
    rng = np.random.default_rng([7919, rooms, receptacles if receptacles is not None else 0, index])
    if rooms == 1:
        names: tuple[str, ...] = (ROOM_TYPES[index % len(ROOM_TYPES)],)
    else:
        order = rng.permutation(len(ROOM_TYPES))[:rooms]
        names = tuple(ROOM_TYPES[int(i)] for i in order)
    rec_types: list[str] = []
    rec_rooms: list[int] = []
    for k, room in enumerate(names):
        for t in _room_receptacles(rng, room, receptacles):
            rec_types.append(t)
            rec_rooms.append(k)
    present = set(rec_types)
    goals: dict[str, dict[str, list[tuple[str, str]]]] = {s: {k: [] for k in TASK_TYPES} for s in SPLITS}
    split_of_layout = "unseen" if index >= UNSEEN_FROM else None
    lamp_types = [lamp for lamp, hosts in LAMPS.items() if present & set(hosts)]
    for obj, (caps, places) in OBJECTS.items():
        starts = {t for t in _spot_types(names, rec_types, rec_rooms, obj) if t in places}
        if not starts:
            continue
        for kind in TASK_TYPES:
            need, tools = NEEDS[kind]
            if caps & need != need or (tools and not present & set(tools)):
                continue
            if kind == "look_at_obj_in_light":
                targets = lamp_types
            else:
                # a target is a receptacle type the object may be in, other than the tool of the task, and
                # the object must have somewhere else to start
                targets = [t for t in sorted(starts) if t not in tools and starts - {t}]
            for target in targets:
                split = split_of_layout or _goal_split(index, kind, obj, target)
                goals[split][kind].append((obj, target))
    frozen = {s: {k: tuple(v) for k, v in d.items()} for s, d in goals.items()}
    fits: list[tuple[str, ...]] = []
    spots: dict[tuple[int, str], list[int]] = {}
    for k, room in enumerate(names):
        here: list[str] = []
        for obj, (_, places) in OBJECTS.items():
            found = [i for i, t in enumerate(rec_types) if rec_rooms[i] == k and t in places]
            if found and room in object_rooms(obj):
                here.append(obj)
                spots[k, obj] = found
        fits.append(tuple(here))
    return Layout(index, names, tuple(rec_types), tuple(rec_rooms), frozen, tuple(fits), spots)


def _layout_range(split: str) -> range:
    return range(UNSEEN_FROM, LAYOUTS) if split == "unseen" else range(UNSEEN_FROM)


class _Draws:
    """Uniform draws taken from ``rng`` a block at a time (one numpy call per reset instead of dozens)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.block: list[float] = []

    def below(self, n: int) -> int:
        """A uniform integer in [0, n)."""
        if not self.block:
            self.block = self.rng.random(64).tolist()
        return min(int(self.block.pop() * n), n - 1)


def make_scene(
    rng: np.random.Generator,
    *,
    rooms: int,
    receptacles: int | None,
    distractors: int | None,
    task_types: tuple[str, ...],
    split: str,
) -> tuple[Scene, list[int], int, int]:
    """Draw an episode: the scene, where each object starts, the starting room, and the layout index."""
    draw = _Draws(rng)
    span = _layout_range(split)
    for _ in range(200):
        index = span[draw.below(len(span))]
        lay = layout(index, rooms, receptacles)
        kinds = [k for k in task_types if lay.goals[split][k]]
        if kinds:
            break
    else:
        raise ConfigError(
            f"no layout of split {split!r} supports task types {list(task_types)} with rooms={rooms}; "
            "allow more task types or rooms"
        )
    kind = kinds[draw.below(len(kinds))]
    options = lay.goals[split][kind]
    obj_type, target_type = options[draw.below(len(options))]
    template = GOAL_TEXT[kind][draw.below(len(GOAL_TEXT[kind]))]
    goal = Goal(kind, obj_type, target_type, template.format(o=obj_type, r=target_type))

    by_type: dict[str, list[int]] = {}
    for i, t in enumerate(lay.rec_types):
        by_type.setdefault(t, []).append(i)
    obj_types: list[str] = []
    where: list[int] = []

    def place(t: str, spots: list[int]) -> None:
        obj_types.append(t)
        where.append(spots[draw.below(len(spots))])

    # the goal objects: never where the goal wants them
    avoid = () if kind == "look_at_obj_in_light" else (target_type,)
    home = object_rooms(obj_type)
    starts = [
        i
        for t in OBJECTS[obj_type][1]
        if t not in avoid
        for i in by_type.get(t, ())
        if lay.room_names[lay.rec_rooms[i]] in home
    ]
    low = 2 if kind == "pick_two_obj_and_place" else 1
    for _ in range(low + draw.below(4 - low)):
        place(obj_type, starts)
    # lamps: one on some host of the goal's lamp type (look tasks), else on a host by chance
    for lamp, hosts in LAMPS.items():
        spots = [i for t in hosts for i in by_type.get(t, ())]
        if spots and (target_type == lamp or draw.below(2) == 0):
            place(lamp, spots)
    # distractors: other object types that fit the room
    for k in range(len(lay.room_names)):
        fits = [t for t in lay.fits[k] if t != obj_type]
        n = 6 + draw.below(9) if distractors is None else distractors
        for _ in range(n):
            t = fits[draw.below(len(fits))]
            place(t, lay.spots[k, t])
    counts: dict[str, int] = {}
    names = []
    for t in obj_types:
        counts[t] = counts.get(t, 0) + 1
        names.append(f"{t} {counts[t]}")
    scene = Scene(
        room_names=lay.room_names,
        rec_types=lay.rec_types,
        rec_rooms=lay.rec_rooms,
        obj_types=tuple(obj_types),
        obj_names=tuple(names),
        obj_caps=tuple(OBJECTS[t][0] if t in OBJECTS else 0 for t in obj_types),
        obj_is_lamp=tuple(t in LAMPS for t in obj_types),
        goal=goal,
    )
    start_room = draw.below(len(lay.room_names))
    return scene, where, start_room, index
