"""Seeded arithmetic word problems. Difficulty: ``digits`` per operand and ``num_ops`` operations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NAMES = ("Ada", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena", "Mo", "Nia")
ITEMS = ("pens", "apples", "stamps", "marbles", "books", "coins", "shells", "cards", "bolts", "beads")
CONTAINERS = ("crate", "box", "bag", "shelf", "drawer", "basket")

SINGLE = {
    "+": (
        "{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?",
        "A {box} holds {a} {item}. Another {box} holds {b}. How many {item} are there in all?",
    ),
    "-": (
        "{name} had {a} {item} and gave away {b}. How many {item} are left?",
        "A {box} holds {a} {item}; {b} of them are taken out. How many {item} remain in the {box}?",
    ),
    "*": (
        "A {box} holds {a} packs of {b} {item}. How many {item} are in the {box}?",
        "{name} buys {a} bags with {b} {item} in each. How many {item} is that?",
    ),
    "/": (
        "{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
        "{a} {item} are packed {b} to a {box}. How many {box}s are filled?",
    ),
}
CHAIN = {
    "+": "Then {name} gets {b} more.",
    "-": "Then {name} gives away {b}.",
    "*": "Then {name}'s pile grows to {b} times its size.",
    "/": "Then {name} splits the pile into {b} equal parts and keeps one part.",
}


@dataclass(frozen=True)
class Problem:
    text: str
    expression: str
    answer: int


def _operand(rng: np.random.Generator, digits: int, low: int = 2) -> int:
    lo = max(low, 10 ** (digits - 1))
    return int(rng.integers(lo, 10**digits))


def make_problem(rng: np.random.Generator, digits: int = 2, num_ops: int = 1) -> Problem:
    """A word problem whose answer is a whole number >= 0, with the expression that solves it."""
    name = NAMES[int(rng.integers(len(NAMES)))]
    item = ITEMS[int(rng.integers(len(ITEMS)))]
    box = CONTAINERS[int(rng.integers(len(CONTAINERS)))]
    ops = [("+", "-", "*", "/")[int(rng.integers(4))] for _ in range(num_ops)]
    value = _operand(rng, digits)
    expression = str(value)
    sentences: list[str] = []
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
        if i == 0 and num_ops == 1:
            template = SINGLE[op][int(rng.integers(len(SINGLE[op])))]
            sentences.append(template.format(name=name, item=item, box=box, a=value, b=b))
        elif i == 0:
            sentences.append(f"{name} has {value} {item}.")
            sentences.append(CHAIN[op].format(name=name, b=b))
        else:
            sentences.append(CHAIN[op].format(name=name, b=b))
        value = new
    if num_ops > 1:
        sentences.append(f"How many {item} does {name} have now?")
    return Problem(text=" ".join(sentences), expression=expression, answer=int(value))
