"""Seeded arithmetic word problems. Difficulty: ``digits`` per operand and ``num_ops`` operations.

Each operation count has its own sentence templates, several per operation, split in two: ``train``
templates and held-out ``test`` templates (the last ones of each list, see ``TEST_SHARE``), so that an
evaluation on ``split="test"`` measures whether a model reads the problem, not whether it copies numbers
into a template it was trained on. ``split="all"`` draws from both.

>>> import numpy as np
>>> p = make_problem(np.random.default_rng(0), digits=3, num_ops=2, split="test")
>>> p.answer == int(eval(p.expression)), p.split
(True, 'test')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolgym.errors import ConfigError

NAMES = ("Ada", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena", "Mo", "Nia")
ITEMS = ("pens", "apples", "stamps", "marbles", "books", "coins", "shells", "cards", "bolts", "beads")
CONTAINERS = ("crate", "box", "bag", "shelf", "drawer", "basket")
SPLITS = ("train", "test", "all")

# One operation: the whole problem is one sentence pair. The last ones of each list are test templates.
SINGLE: dict[str, tuple[str, ...]] = {
    "+": (
        "{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?",
        "A {box} holds {a} {item}. Another {box} holds {b}. How many {item} are there in all?",
        "{name} collected {a} {item} on Monday and {b} on Tuesday. How many {item} is that altogether?",
        "There are {a} {item} on the {box} and {name} puts {b} more there. How many {item} are on the {box}?",
        "{name} owns {a} {item}; a friend gives {name} another {b}. What is the total number of {item}?",
        "What do you get when you add {b} {item} to a {box} of {a} {item}?",
        "{name} picks {a} {item}, then picks {b} more. How many {item} did {name} pick?",
        "{a} {item} were in the {box} before {b} more were delivered. How many {item} are in it now?",
        "A class has {a} {item} and another class has {b}. How many {item} do the two classes have?",
        "{name} saved {a} {item} last year and {b} this year. What is the total?",
        "The shop sold {a} {item} in the morning and {b} in the afternoon. How many {item} did it sell?",
        "Add {a} {item} and {b} {item}: how many {item} do you have?",
    ),
    "-": (
        "{name} had {a} {item} and gave away {b}. How many {item} are left?",
        "A {box} holds {a} {item}; {b} of them are taken out. How many {item} remain in the {box}?",
        "{name} needs {a} {item} and already has {b}. How many more {item} does {name} need?",
        "Of {a} {item} in the {box}, {b} were broken. How many {item} are not broken?",
        "{name} started with {a} {item} and lost {b} of them. How many {item} does {name} have left?",
        "How many {item} remain if {b} are removed from a {box} of {a} {item}?",
        "{name} had {a} {item}, and {b} of them were eaten. How many {item} are still there?",
        "A {box} with {a} {item} loses {b}. How many {item} are in the {box} afterwards?",
        "{name} owes {a} {item} and has paid back {b}. How many {item} are still owed?",
        "There were {a} {item}; {name} threw out {b}. How many {item} stayed?",
        "A store had {a} {item} and sold {b}. How many {item} does the store still have?",
        "Take {b} {item} away from {a} {item}. How many {item} are left?",
    ),
    "*": (
        "A {box} holds {a} packs of {b} {item}. How many {item} are in the {box}?",
        "{name} buys {a} bags with {b} {item} in each. How many {item} is that?",
        "There are {a} rows with {b} {item} in every row. How many {item} are there?",
        "Each of {a} students brings {b} {item}. How many {item} do the students bring in total?",
        "{name} fills {a} {box}es with {b} {item} each. How many {item} did {name} use?",
        "How many {item} are in {a} {box}es if every {box} holds {b} {item}?",
        "{name} stacks {b} {item} on each of {a} {box}es. How many {item} are stacked?",
        "Every one of {a} {box}es contains {b} {item}. How many {item} are there in total?",
        "{a} people each own {b} {item}. How many {item} do they own together?",
        "A printer makes {b} {item} per minute for {a} minutes. How many {item} is that?",
        "A factory makes {b} {item} an hour for {a} hours. How many {item} does it make?",
        "What is the number of {item} in {a} stacks of {b} {item} each?",
    ),
    "/": (
        "{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
        "{a} {item} are packed {b} to a {box}. How many {box}s are filled?",
        "{a} {item} are split evenly into {b} {box}es. How many {item} go in each {box}?",
        "{name} has {a} {item} and puts them in groups of {b}. How many groups are there?",
        "A team of {b} people picks {a} {item}, each person the same amount. How many {item} does each pick?",
        "How many {item} does each of {b} children get when {a} {item} are shared fairly?",
        "{a} {item} are packed equally into {b} {box}es. How many {item} does each {box} get?",
        "{name} divides {a} {item} into {b} equal piles. How many {item} are in a pile?",
        "{b} friends split {a} {item} evenly. How many {item} does one friend receive?",
        "{a} {item} make {b} equal bundles. How many {item} are in every bundle?",
        "If {a} {item} fill {b} equal rows, how many {item} are in one row?",
        "Divide {a} {item} among {b} {box}es equally: how many {item} per {box}?",
    ),
}
# Several operations: an opening sentence, one sentence per operation, a question.
OPENERS: tuple[str, ...] = (
    "{name} has {a} {item}.",
    "A {box} starts with {a} {item}.",
    "{name} begins the week with {a} {item}.",
    "There are {a} {item} in {name}'s {box}.",
    "{name} counts {a} {item} in the morning.",
    "{name} keeps {a} {item} in a {box}.",
    "It all starts with {a} {item}.",
    "{name} brings {a} {item} to school.",
    "On day one there are {a} {item}.",
    "At first {name} owns {a} {item}.",
)
CHAIN: dict[str, tuple[str, ...]] = {
    "+": (
        "Then {name} gets {b} more.",
        "Next, {b} more {item} are added.",
        "After that {name} finds another {b}.",
        "Later {name} receives {b} more {item}.",
        "Then a friend brings {b} extra {item}.",
        "Then {name} buys {b} more {item}.",
        "Next, {name} wins {b} {item} in a game.",
        "After that {b} {item} are found under the {box}.",
        "Then {name} is given {b} additional {item}.",
        "Then {b} {item} more arrive.",
    ),
    "-": (
        "Then {name} gives away {b}.",
        "Next, {b} {item} are taken away.",
        "After that {name} loses {b} of them.",
        "Later {name} sells {b} {item}.",
        "Then {b} {item} get broken and are thrown out.",
        "Then {name} hands {b} {item} to a friend.",
        "Next, {b} of the {item} go missing.",
        "After that {name} eats {b} of them.",
        "Then {name} donates {b} {item}.",
        "Then {name} uses up {b} {item}.",
    ),
    "*": (
        "Then {name}'s pile grows to {b} times its size.",
        "Next, the number of {item} is multiplied by {b}.",
        "After that {name} ends up with {b} times as many.",
        "Later the pile becomes {b} times larger.",
        "Then every {item} is replaced by {b} {item}.",
        "Then the number of {item} becomes {b} times bigger.",
        "Next, {name} multiplies the pile by {b}.",
        "After that the {item} are copied until there are {b} times as many.",
        "Then the amount of {item} is multiplied by {b}.",
        "Then {name} has {b} times as many {item} as before.",
    ),
    "/": (
        "Then {name} splits the pile into {b} equal parts and keeps one part.",
        "Next, the {item} are shared among {b} people and {name} keeps one share.",
        "After that only one of {b} equal parts is left.",
        "Later {name} divides the {item} into {b} equal groups and keeps one group.",
        "Then the pile is cut into {b} equal shares and one share stays.",
        "Then {name} divides the {item} into {b} equal shares and keeps one share.",
        "Next, the pile is split into {b} equal groups and only one group is kept.",
        "After that the {item} are divided by {b}.",
        "Then {name} keeps just one part after cutting the pile into {b} equal parts.",
        "Then {name} keeps one of {b} equal parts of the {item}.",
    ),
}
QUESTIONS: tuple[str, ...] = (
    "How many {item} does {name} have now?",
    "How many {item} are there at the end?",
    "What is the number of {item} now?",
    "How many {item} are left in the end?",
    "How many {item} are there now?",
    "What is the final number of {item}?",
    "How many {item} does {name} end up with?",
    "In the end, how many {item} are there?",
)
TEST_SHARE = 0.25  # the last quarter (at least one) of each template list is held out for split="test"


@dataclass(frozen=True)
class Problem:
    text: str
    expression: str
    answer: int
    digits: int = 2
    num_ops: int = 1
    split: str = "train"
    steps: tuple[str, ...] = ()  # one expression per operation, each on the previous step's result


def split_templates(templates: Sequence[str], split: str) -> tuple[str, ...]:
    """The templates of one split: ``train`` the first ones, ``test`` the held-out last ones, ``all`` both.

    >>> split_templates(["a", "b", "c", "d", "e"], "test")
    ('e',)
    """
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    n_test = max(1, int(len(templates) * TEST_SHARE))
    if split == "train":
        return tuple(templates[:-n_test])
    if split == "test":
        return tuple(templates[-n_test:])
    return tuple(templates)


def _operand(rng: np.random.Generator, digits: int, low: int = 2) -> int:
    lo = max(low, 10 ** (digits - 1))
    return int(rng.integers(lo, 10**digits))


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def make_problem(rng: np.random.Generator, digits: int = 2, num_ops: int = 1, split: str = "all") -> Problem:
    """A word problem whose answer is a whole number >= 0, with the expression that solves it."""
    name, item, box = _pick(rng, NAMES), _pick(rng, ITEMS), _pick(rng, CONTAINERS)
    ops = [("+", "-", "*", "/")[int(rng.integers(4))] for _ in range(num_ops)]
    value = _operand(rng, digits)
    expression = str(value)
    sentences: list[str] = []
    steps: list[str] = []
    first = 0  # the value the opening sentence names (the first operand, once known)
    for i, op in enumerate(ops):
        if op == "/":
            b = _operand(rng, max(1, digits - 1))
            if i == 0:
                value = value * b  # make the first division exact by choosing the dividend
                expression = str(value)
        else:
            b = _operand(rng, digits)
        if op == "-" and b > value:
            value, b = (b, value) if i == 0 else (value, value // 2 or 0)
            expression = str(value) if i == 0 else expression
        if op == "/" and value % b:
            op = "*"  # a later division that is not exact becomes a product; keeps answers whole
        new = {"+": value + b, "-": value - b, "*": value * b, "/": value // b if b else value}[op]
        expression = f"{expression} {op} {b}" if i == 0 else f"({expression}) {op} {b}"
        steps.append(f"{value} {op} {b}")
        if i == 0 and num_ops == 1:
            template = _pick(rng, split_templates(SINGLE[op], split))
            sentences.append(template.format(name=name, item=item, box=box, a=value, b=b))
        else:
            if i == 0:
                first = value
            chain = _pick(rng, split_templates(CHAIN[op], split))
            sentences.append(chain.format(name=name, item=item, box=box, b=b))
        value = new
    if num_ops > 1:
        opener = _pick(rng, split_templates(OPENERS, split)).format(name=name, item=item, box=box, a=first)
        question = _pick(rng, split_templates(QUESTIONS, split)).format(name=name, item=item)
        sentences = [opener, *sentences, question]
    return Problem(
        text=" ".join(sentences),
        expression=expression,
        answer=int(value),
        digits=digits,
        num_ops=num_ops,
        split=split,
        steps=tuple(steps),
    )


def as_choices(value: int | Sequence[int], name: str, low: int, high: int) -> tuple[int, ...]:
    """An int or a list of ints (each drawn with equal chance), checked against [low, high].

    >>> as_choices([2, 3], "digits", 1, 12), as_choices(2, "digits", 1, 12)
    ((2, 3), (2,))
    """
    choices = (value,) if isinstance(value, int) else tuple(value)
    if not choices or not all(isinstance(v, int) and low <= v <= high for v in choices):
        raise ConfigError(
            f"{name} must be an int (or a list of ints) between {low} and {high}, got {value!r}"
        )
    return choices
