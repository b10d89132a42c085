"""What a household is made of: room types, receptacle types, object types and their properties.

The names and groupings follow ALFWorld's (ALFRED's) vocabulary, so a model that learnt there reads the
same words here: lowercase types without spaces (``sinkbasin``, ``desklamp``), numbered instances
(``cabinet 3``), and the same six task types.
"""

from __future__ import annotations

# Object capabilities (bits).
CLEANABLE = 1
HEATABLE = 2
COOLABLE = 4
LOOKABLE = 8  # a task may ask to examine it under a lamp

# Object state (bits).
IS_CLEAN = 1
IS_HOT = 2
IS_COOL = 4
IS_ON = 8  # a lamp that is switched on

# Receptacle roles: what a receptacle can do to an object held in front of it.
CLEAN_WITH = ("sinkbasin", "bathtubbasin")
HEAT_WITH = ("microwave",)
COOL_WITH = ("fridge",)

OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})
# Receptacles you put things "in" (the rest you put things "on").
INSIDE = frozenset(
    {"cabinet", "drawer", "fridge", "microwave", "safe", "sinkbasin", "bathtubbasin", "garbagecan"}
    | {"laundryhamper", "coffeemachine", "toaster"}
)

# room type -> (receptacle type, fewest, natural low, most) ; "fewest" is what a room cannot lack.
ROOMS: dict[str, tuple[tuple[str, int, int, int], ...]] = {
    "kitchen": (
        ("cabinet", 1, 4, 12),
        ("drawer", 1, 2, 8),
        ("countertop", 1, 1, 3),
        ("diningtable", 0, 0, 1),
        ("fridge", 1, 1, 1),
        ("microwave", 1, 1, 1),
        ("sinkbasin", 1, 1, 1),
        ("stoveburner", 1, 2, 4),
        ("coffeemachine", 0, 1, 1),
        ("toaster", 0, 0, 1),
        ("garbagecan", 1, 1, 1),
        ("shelf", 0, 0, 3),
    ),
    "livingroom": (
        ("sofa", 1, 1, 1),
        ("armchair", 0, 1, 2),
        ("coffeetable", 1, 1, 1),
        ("sidetable", 1, 1, 2),
        ("shelf", 0, 2, 6),
        ("drawer", 0, 2, 6),
        ("cabinet", 0, 1, 4),
        ("tvstand", 0, 0, 1),
        ("diningtable", 0, 0, 1),
        ("dresser", 0, 0, 1),
        ("ottoman", 0, 0, 1),
        ("garbagecan", 1, 1, 1),
    ),
    "bedroom": (
        ("bed", 1, 1, 1),
        ("desk", 0, 1, 1),
        ("sidetable", 1, 1, 2),
        ("dresser", 0, 1, 1),
        ("drawer", 1, 3, 10),
        ("shelf", 0, 2, 6),
        ("safe", 0, 0, 1),
        ("armchair", 0, 0, 1),
        ("laundryhamper", 0, 0, 1),
        ("garbagecan", 1, 1, 1),
    ),
    "bathroom": (
        ("toilet", 1, 1, 1),
        ("sinkbasin", 1, 1, 2),
        ("bathtubbasin", 0, 1, 1),
        ("countertop", 1, 1, 1),
        ("cabinet", 1, 2, 6),
        ("drawer", 0, 1, 4),
        ("shelf", 0, 1, 3),
        ("towelholder", 0, 1, 1),
        ("handtowelholder", 0, 1, 1),
        ("toiletpaperhanger", 1, 1, 1),
        ("garbagecan", 1, 1, 1),
    ),
}
# Receptacle types whose count a knob may raise beyond "most".
STACKABLE = ("cabinet", "drawer", "shelf")

_FOOD_AT = ("countertop", "diningtable", "fridge", "microwave", "sinkbasin", "garbagecan")
_DISH_AT = ("cabinet", "countertop", "diningtable", "shelf", "sinkbasin")
_UTENSIL_AT = ("drawer", "countertop", "diningtable", "sinkbasin")
_SMALL_AT = ("desk", "sidetable", "dresser", "drawer", "shelf", "coffeetable", "diningtable")
_C, _H, _K, _L = CLEANABLE, HEATABLE, COOLABLE, LOOKABLE

# object type -> (capabilities, receptacle types it may start in)
OBJECTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "apple": (_C | _H | _K, _FOOD_AT),
    "bread": (_H | _K, (*_FOOD_AT, "cabinet")),
    "egg": (_C | _H | _K, _FOOD_AT),
    "lettuce": (_C | _K, _FOOD_AT),
    "potato": (_C | _H | _K, _FOOD_AT),
    "tomato": (_C | _H | _K, _FOOD_AT),
    "mug": (_C | _H | _K | _L, (*_DISH_AT, "microwave", "coffeemachine", "fridge", "desk", "sidetable")),
    "cup": (_C | _H | _K, (*_DISH_AT, "microwave", "coffeemachine", "fridge")),
    "bowl": (_C | _K | _L, (*_DISH_AT, "microwave", "fridge", "desk", "coffeetable")),
    "plate": (_C | _H | _K, (*_DISH_AT, "microwave", "fridge", "coffeetable")),
    "pan": (_C | _K, ("stoveburner", "countertop", "cabinet", "sinkbasin", "fridge", "diningtable")),
    "pot": (_C | _K, ("stoveburner", "countertop", "cabinet", "sinkbasin", "fridge", "shelf")),
    "kettle": (_C, ("stoveburner", "countertop", "cabinet", "shelf", "diningtable")),
    "fork": (_C, _UTENSIL_AT),
    "knife": (_C, _UTENSIL_AT),
    "spoon": (_C, _UTENSIL_AT),
    "spatula": (_C, _UTENSIL_AT),
    "ladle": (_C, _UTENSIL_AT),
    "butterknife": (_C, _UTENSIL_AT),
    "dishsponge": (_C, ("sinkbasin", "countertop", "cabinet", "drawer", "diningtable", "bathtubbasin")),
    "saltshaker": (0, ("cabinet", "countertop", "diningtable", "shelf", "drawer")),
    "peppershaker": (0, ("cabinet", "countertop", "diningtable", "shelf", "drawer")),
    "soapbottle": (0, ("cabinet", "countertop", "shelf", "toilet", "garbagecan", "diningtable")),
    "spraybottle": (0, ("cabinet", "countertop", "shelf", "toilet", "garbagecan")),
    "winebottle": (_K, ("countertop", "diningtable", "fridge", "cabinet", "shelf", "garbagecan")),
    "book": (_L, (*_SMALL_AT, "bed", "sofa", "armchair")),
    "cellphone": (_L, (*_SMALL_AT, "bed", "sofa", "armchair")),
    "creditcard": (_L, (*_SMALL_AT, "sofa", "armchair", "countertop")),
    "keychain": (_L, (*_SMALL_AT, "sofa", "armchair", "safe")),
    "laptop": (_L, ("bed", "desk", "sofa", "armchair", "coffeetable", "diningtable", "dresser")),
    "pen": (_L, (*_SMALL_AT, "countertop")),
    "pencil": (_L, (*_SMALL_AT, "countertop")),
    "pillow": (_L, ("bed", "sofa", "armchair")),
    "remotecontrol": (_L, ("sofa", "armchair", "coffeetable", "sidetable", "dresser", "tvstand", "ottoman")),
    "statue": (_L, ("shelf", "coffeetable", "sidetable", "dresser", "diningtable", "desk", "tvstand")),
    "vase": (_L, ("shelf", "coffeetable", "sidetable", "dresser", "diningtable", "cabinet", "safe")),
    "watch": (_L, ("sidetable", "dresser", "desk", "coffeetable", "drawer", "shelf", "safe")),
    "alarmclock": (_L, ("desk", "sidetable", "dresser", "shelf")),
    "cd": (_L, ("desk", "drawer", "shelf", "sidetable", "dresser", "safe", "garbagecan")),
    "newspaper": (_L, ("sofa", "armchair", "coffeetable", "sidetable", "ottoman", "diningtable")),
    "box": (0, ("sofa", "coffeetable", "shelf", "dresser", "tvstand", "diningtable")),
    "tissuebox": (0, ("coffeetable", "sidetable", "shelf", "dresser", "toilet", "countertop")),
    "teddybear": (0, ("bed", "armchair", "shelf", "dresser")),
    "cloth": (_C, ("countertop", "cabinet", "drawer", "bathtubbasin", "sinkbasin", "shelf", "dresser")),
    "soapbar": (_C, ("sinkbasin", "bathtubbasin", "countertop", "cabinet", "toilet", "shelf")),
    "toiletpaper": (0, ("toiletpaperhanger", "toilet", "cabinet", "countertop", "shelf", "drawer")),
    "towel": (0, ("towelholder", "bathtubbasin", "cabinet", "countertop", "shelf")),
    "handtowel": (0, ("handtowelholder", "countertop", "cabinet", "drawer")),
    "candle": (0, ("cabinet", "countertop", "shelf", "toilet", "drawer", "bathtubbasin")),
}
LAMPS: dict[str, tuple[str, ...]] = {"desklamp": ("desk", "sidetable", "dresser")}

# Which rooms an object belongs in (a bread in a bathroom cabinet would be odd); the rest default below.
_KITCHEN = ("kitchen",)
_HOME = ("livingroom", "bedroom")
OBJECT_ROOMS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("apple", "bread", "egg", "lettuce", "potato", "tomato", "cup", "plate"), _KITCHEN),
    **dict.fromkeys(("pan", "pot", "kettle", "fork", "knife", "spoon", "spatula", "ladle"), _KITCHEN),
    **dict.fromkeys(("butterknife", "saltshaker", "peppershaker", "winebottle"), _KITCHEN),
    **dict.fromkeys(("mug", "bowl"), ("kitchen", "bedroom", "livingroom")),
    **dict.fromkeys(("dishsponge", "soapbottle", "spraybottle"), ("kitchen", "bathroom")),
    **dict.fromkeys(("creditcard", "pen", "pencil", "cellphone"), ("livingroom", "bedroom", "kitchen")),
    **dict.fromkeys(("cloth",), ("bathroom", "kitchen")),
    **dict.fromkeys(("soapbar", "toiletpaper", "towel", "handtowel", "candle"), ("bathroom",)),
    **dict.fromkeys(("tissuebox",), ("livingroom", "bedroom", "bathroom")),
}


def object_rooms(obj: str) -> tuple[str, ...]:
    """The room types an object may start in (living and bedroom things by default)."""
    return OBJECT_ROOMS.get(obj, _HOME)


# The six ALFWorld task types; short aliases accepted by the ``task_types`` knob.
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
ALIASES = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick_two": "pick_two_obj_and_place",
    "two": "pick_two_obj_and_place",
}
# task type -> (capability the object needs, receptacle types that do the transformation)
NEEDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "pick_and_place_simple": (0, ()),
    "look_at_obj_in_light": (LOOKABLE, ()),
    "pick_clean_then_place_in_recep": (CLEANABLE, CLEAN_WITH),
    "pick_heat_then_place_in_recep": (HEATABLE, HEAT_WITH),
    "pick_cool_then_place_in_recep": (COOLABLE, COOL_WITH),
    "pick_two_obj_and_place": (0, ()),
}
# ALFWorld's phrasings of each goal ({o}: object type, {r}: receptacle type or lamp type).
GOAL_TEXT: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("put a {o} in {r}.", "put some {o} on {r}."),
    "look_at_obj_in_light": ("look at {o} under the {r}.", "examine the {o} with the {r}."),
    "pick_clean_then_place_in_recep": ("put a clean {o} in {r}.", "clean some {o} and put it in {r}."),
    "pick_heat_then_place_in_recep": ("put a hot {o} in {r}.", "heat some {o} and put it in {r}."),
    "pick_cool_then_place_in_recep": ("put a cool {o} in {r}.", "cool some {o} and put it in {r}."),
    "pick_two_obj_and_place": ("put two {o} in {r}.", "find two {o} and put them in {r}."),
}
