"""Rewriting answers before Math-Verify sees them, and the shape checks it lacks. Every rule is a linear scan.

Rewrites (both the gold and the candidate): the currency sign ``\\$`` dropped; ``∞`` as ``\\infty``;
``\\varnothing`` as ``\\emptyset``; ``°`` as ``^{\\circ}``; "20 percent" as ``20\\%``; thin-space or ``{,}``
thousands separators between digit groups (``3\\,628\\,800``) removed; e-notation ``1.5e3`` as ``1500``
(``\\times10^{n}`` past 10¹⁰⁰, nothing past 10¹⁰⁰⁰⁰: ``1e999999999`` is no number to round to 1); a
repeating decimal ``0.\\overline{3}`` as the exact fraction. In free text (``fallback=True``) a number glued
to a letter (``5i``) is blanked (:func:`free_text`).

Shape checks (:func:`mismatch`), each a false positive Math-Verify lets through:
- a set ``\\{1,2\\}`` against an ordered pair or interval ``(1,2)``, and the other way round;
- a ``\\text{…}`` holding a digit or "or"/"and" (``3\\text{ or 4}``): a hedge, not a unit;
- an equation whose left side has no variable (``4 = 3``): every side must equal the gold, not just the last
  (:func:`sides`).
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

_CURRENCY = re.compile(r"\\\$")
_PERCENT_WORD = re.compile(r"(\d)\s*(?:percent|per\s+cent)\b", re.I)
_THIN_THOUSANDS = re.compile(r"(\d)(?:\\[,!: ]|\{,\})(?=\d{3}(?!\d))")
_E_NOTATION = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([+-]?\d{1,18})(?![\w.])")
_GLUED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[A-Za-z](?!\w)")
_OVERLINE = re.compile(r"(?<![\d.])(-?)(\d*)\.(\d*)\\overline\{(\d{1,50})\}")
_TEXT = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm)\s*\{([^{}]*)\}")
_HEDGE = re.compile(r"\d|\b(?:or|and)\b", re.I)
_SET_OPEN = re.compile(r"^(?:\\left\s*)?(?:\\\{|\\lbrace)")
_SEQ_OPEN = re.compile(r"^(?:\\left\s*)?[(\[]")
_LETTER = re.compile(r"[A-Za-z]")
_COMMANDS = re.compile(r"\\[A-Za-z]+")
MAX_SIDES = 8


def _e_notation(m: re.Match[str]) -> str:
    exponent = int(m.group(2))
    if abs(exponent) > 10_000:
        return "\\text{overflow}"  # 1e999999999 is no number Math-Verify should round to 1
    if abs(exponent) <= 100:  # as a plain decimal, which Math-Verify reads in free text too
        return format(Decimal(f"{m.group(1)}e{exponent}").normalize(), "f")
    return f"{m.group(1)}\\times10^{{{exponent}}}"


def _overline(m: re.Match[str]) -> str:
    sign, whole, fixed, repeat = m.group(1), m.group(2) or "0", m.group(3), m.group(4)
    value = int(whole) + Fraction(int(fixed or "0"), 10 ** len(fixed)) if fixed else Fraction(int(whole))
    value += Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(fixed))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def normalize(text: str) -> str:
    """The rewrites of the module docstring.

    >>> normalize(r"\\$32,\\!348"), normalize("1.5e3"), normalize(r"0.\\overline{3}"), normalize("20 percent")
    ('32,348', '1500', '\\\\frac{1}{3}', '20\\\\%')
    """
    text = _CURRENCY.sub("", text)
    text = text.replace("∞", "\\infty").replace("\\varnothing", "\\emptyset").replace("°", "^{\\circ}")
    text = _PERCENT_WORD.sub(r"\1\\%", text)
    text = _THIN_THOUSANDS.sub(r"\1", text)
    text = text.replace(",\\!", ",")
    if "\\overline" in text:
        text = _OVERLINE.sub(_overline, text)
    return _E_NOTATION.sub(_e_notation, text)


def free_text(text: str) -> str:
    """For free text (``fallback=True``): a number glued to one letter (``5i``, ``3x``, ``2m``) is no plain
    number, so it is blanked out instead of being read as its digits.

    >>> free_text("it is 5i"), free_text("so 12 apples")
    ('it is ?', 'so 12 apples')
    """
    return _GLUED.sub("?", text)


def _bare(text: str) -> str:
    return text.strip().strip("$").strip()


def _shape(text: str) -> str | None:
    t = _bare(text)
    if _SET_OPEN.match(t):
        return "set"
    if _SEQ_OPEN.match(t) and "," in t:
        return "sequence"
    return None


def _hedged(text: str) -> bool:
    return any(_HEDGE.search(m.group(1)) for m in _TEXT.finditer(text))


def mismatch(gold: str, pred: str) -> bool:
    """True when ``pred`` cannot be right whatever Math-Verify says (see the module docstring).

    >>> mismatch("(1,2)", r"\\{1,2\\}"), mismatch("3", r"3\\text{ or 4}"), mismatch("5", r"5\\text{ cm}")
    (True, True, False)
    """
    g, p = _shape(gold), _shape(pred)
    if g and p and g != p:
        return True
    return _hedged(pred) and not _hedged(gold)


def _top_level_equals(text: str) -> list[str]:
    """``text`` split at ``=`` signs outside braces and brackets (``\\leq``, ``\\neq`` are not ``=``)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        elif c == "=" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def sides(pred: str) -> list[str]:
    """The sides of ``pred`` that must all equal the gold: just ``pred``, unless it is an equation whose left
    sides are numbers (no variable), which would let ``4 = 3`` pass for 3; none (no answer) for a chain of
    more than ``MAX_SIDES`` sides.

    >>> sides("x = 3"), sides("4 = 3"), sides("2+2=4")
    (['x = 3'], ['4', '3'], ['2+2', '4'])
    """
    parts = _top_level_equals(_bare(pred))
    if len(parts) < 2 or any(not p.strip() for p in parts):
        return [pred]
    if len(parts) > MAX_SIDES:
        return []  # a chain of equations is no single answer
    if any(_LETTER.search(_COMMANDS.sub("", p)) for p in parts[:-1]):
        return [pred]  # x = 3, f(2) = 3: Math-Verify takes the right side
    return [p.strip() for p in parts]
