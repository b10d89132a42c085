"""Seeded math problems where exact computation matters, at three difficulty levels.

Kinds: ``arithmetic`` (large products, powers), ``modular`` (powers, inverses, Chinese remainders),
``combinatorics`` (binomials, multisets, derangements, Catalan numbers, anagrams), ``primes`` (n-th prime,
prime counts and sums, largest prime factor), ``fractions`` (exact sums of fractions), ``linear_system``
(integer systems of 2 to 4 unknowns), ``series`` (power sums, exact partial sums, divisor sums). Level 1 can
be done by hand with care; level 3 needs a program. Each problem carries its gold answer (an integer, or a
reduced fraction ``p/q``) computed here, and a short program that computes it (the expert runs it in the
sandbox).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from toolgym.errors import ConfigError

KINDS = ("arithmetic", "modular", "combinatorics", "primes", "fractions", "linear_system", "series")
LEVELS = (1, 2, 3)
FRACTION_NOTE = " Give the answer as a reduced fraction p/q (or an integer)."


@dataclass(frozen=True)
class MathProblem:
    kind: str
    level: int
    question: str
    answer: str
    code: str


def _int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A uniform integer in [lo, hi] (numpy's bounds are int64; Python ints beyond are split)."""
    if hi - lo < 2**62:
        return lo + int(rng.integers(0, hi - lo + 1))
    digits = len(str(hi))
    while True:
        value = int("".join(str(int(d)) for d in rng.integers(0, 10, size=digits)))
        if lo <= value <= hi:
            return value


def _digits(rng: np.random.Generator, n: int) -> int:
    return _int(rng, 10 ** (n - 1), 10**n - 1)


def _sieve(limit: int) -> list[int]:
    flags = bytearray([1]) * (limit + 1)
    flags[0:2] = b"\x00\x00"
    for i in range(2, math.isqrt(limit) + 1):
        if flags[i]:
            flags[i * i :: i] = bytearray(len(range(i * i, limit + 1, i)))
    return [i for i, f in enumerate(flags) if f]


_PRIMES = _sieve(300_000)  # enough for the 25,000th prime (287,117) and prime factors up to 3e5

SIEVE_CODE = (
    "def primes_upto(n):\n"
    "    flags = bytearray([1]) * (n + 1)\n"
    "    flags[0:2] = b'\\x00\\x00'\n"
    "    for i in range(2, int(n ** 0.5) + 1):\n"
    "        if flags[i]:\n"
    "            flags[i * i :: i] = bytearray(len(range(i * i, n + 1, i)))\n"
    "    return [i for i, f in enumerate(flags) if f]\n"
)


def _fraction_text(value: Fraction | int) -> str:
    return str(value)  # "p/q", or "n" when the denominator is 1


# ----- the kinds ---------------------------------------------------------------------------------------------
def arithmetic(rng: np.random.Generator, level: int) -> MathProblem:
    if level == 1:
        a, b, c = _digits(rng, 4), _digits(rng, 3), _digits(rng, 4)
        value, expr, text = a * b - c, f"{a} * {b} - {c}", f"Compute {a} × {b} − {c}."
    elif level == 2:
        a, b, c, d = _digits(rng, 9), _digits(rng, 8), _digits(rng, 7), _digits(rng, 6)
        value, expr = a * b - c * d, f"{a} * {b} - {c} * {d}"
        text = f"Compute {a} × {b} − {c} × {d}."
    else:
        a, b = _int(rng, 13, 97), _int(rng, 20, 40)
        c, d = _int(rng, 3, 11), _int(rng, 30, 60)
        e = _digits(rng, 12)
        value, expr = a**b - c**d + e, f"{a} ** {b} - {c} ** {d} + {e}"
        text = f"Compute the exact value of {a}^{{{b}}} − {c}^{{{d}}} + {e}."
    return MathProblem("arithmetic", level, text, str(value), f"print({expr})")


def modular(rng: np.random.Generator, level: int) -> MathProblem:
    variant = ("power", "inverse", "crt")[int(rng.integers(3))]
    if variant == "power":
        a = _int(rng, 2, (50, 10**6, 10**12)[level - 1])
        b = _int(rng, 10, (200, 10**9, 10**18)[level - 1])
        m = _int(rng, 7, (1000, 10**7, 10**12)[level - 1])
        text = f"What is the remainder when {a}^{{{b}}} is divided by {m}?"
        return MathProblem("modular", level, text, str(pow(a, b, m)), f"print(pow({a}, {b}, {m}))")
    if variant == "inverse":
        m = _PRIMES[_int(rng, 100, (400, 5000, 25000)[level - 1])] if level < 3 else _int(rng, 10**9, 10**12)
        while True:
            a = _int(rng, 2, m - 1)
            if math.gcd(a, m) == 1:
                break
        text = f"Find the integer x with 0 ≤ x < {m} such that {a}·x ≡ 1 (mod {m})."
        return MathProblem("modular", level, text, str(pow(a, -1, m)), f"print(pow({a}, -1, {m}))")
    count = level + 1
    moduli: list[int] = []
    while len(moduli) < count:
        m = _int(rng, 3, (20, 200, 5000)[level - 1])
        if all(math.gcd(m, other) == 1 for other in moduli):
            moduli.append(m)
    residues = [_int(rng, 0, m - 1) for m in moduli]
    x, step = 0, 1
    for m, r in zip(moduli, residues, strict=True):
        while x % m != r:
            x += step
        step *= m
    conditions = ", ".join(f"x ≡ {r} (mod {m})" for r, m in zip(residues, moduli, strict=True))
    text = f"Find the smallest non-negative integer x such that {conditions}."
    code = (
        f"mods, rems = {moduli}, {residues}\n"
        "x, step = 0, 1\n"
        "for m, r in zip(mods, rems):\n"
        "    while x % m != r:\n"
        "        x += step\n"
        "    step *= m\n"
        "print(x)"
    )
    return MathProblem("modular", level, text, str(x), code)


def combinatorics(rng: np.random.Generator, level: int) -> MathProblem:
    variant = ("binomial", "multiset", "derangement", "catalan", "anagram")[int(rng.integers(5))]
    scale = (1, 3, 8)[level - 1]
    if variant == "binomial":
        n = _int(rng, 10 * scale, 20 * scale)
        k = _int(rng, 2, n // 2)
        text = f"How many ways are there to choose {k} items from {n} distinct items?"
        return MathProblem(
            "combinatorics", level, text, str(math.comb(n, k)), f"import math\nprint(math.comb({n}, {k}))"
        )
    if variant == "multiset":
        n, k = _int(rng, 5 * scale, 12 * scale), _int(rng, 3, 4 + 2 * level)
        text = f"In how many ways can {n} identical balls be placed into {k} distinct boxes (boxes may be empty)?"
        value = math.comb(n + k - 1, k - 1)
        return MathProblem(
            "combinatorics", level, text, str(value), f"import math\nprint(math.comb({n + k - 1}, {k - 1}))"
        )
    if variant == "derangement":
        n = _int(rng, 5 + 3 * (level - 1), 8 + 8 * (level - 1))
        d = [1, 0]
        for i in range(2, n + 1):
            d.append((i - 1) * (d[-1] + d[-2]))
        text = f"How many permutations of {n} distinct letters leave no letter in its original position?"
        code = (
            f"d = [1, 0]\nfor i in range(2, {n} + 1):\n    d.append((i - 1) * (d[-1] + d[-2]))\nprint(d[{n}])"
        )
        return MathProblem("combinatorics", level, text, str(d[n]), code)
    if variant == "catalan":
        n = _int(rng, 5 * scale, 10 * scale)
        text = (
            f"How many sequences of {n} opening and {n} closing parentheses are balanced "
            "(every prefix has at least as many opening as closing ones)?"
        )
        value = math.comb(2 * n, n) // (n + 1)
        return MathProblem(
            "combinatorics",
            level,
            text,
            str(value),
            f"import math\nprint(math.comb({2 * n}, {n}) // {n + 1})",
        )
    letters = "ABCDEFGHIJ"[: 2 + level]
    counts = [_int(rng, 1, 2 + 2 * level) for _ in letters]
    word = "".join(ch * c for ch, c in zip(letters, counts, strict=True))
    shuffled = "".join(word[i] for i in rng.permutation(len(word)))
    value = math.factorial(len(word))
    for c in counts:
        value //= math.factorial(c)
    text = f"How many distinct strings can be made by rearranging all the letters of {shuffled}?"
    code = (
        "import math\nfrom collections import Counter\n"
        f"w = {shuffled!r}\nv = math.factorial(len(w))\n"
        "for c in Counter(w).values():\n    v //= math.factorial(c)\nprint(v)"
    )
    return MathProblem("combinatorics", level, text, str(value), code)


def primes(rng: np.random.Generator, level: int) -> MathProblem:
    variant = ("nth", "count", "sum", "factor")[int(rng.integers(4))]
    if variant == "nth":
        n = _int(rng, 20, (100, 3000, 25000)[level - 1])
        text = f"What is the {n}th prime number (the 1st is 2)?"
        code = SIEVE_CODE + f"print(primes_upto(300000)[{n - 1}])"
        return MathProblem("primes", level, text, str(_PRIMES[n - 1]), code)
    if variant in ("count", "sum"):
        limit = _int(rng, 50, (200, 20000, 300000)[level - 1])
        below = [p for p in _PRIMES if p < limit]
        if variant == "count":
            text = f"How many prime numbers are less than {limit}?"
            return MathProblem(
                "primes", level, text, str(len(below)), SIEVE_CODE + f"print(len(primes_upto({limit - 1})))"
            )
        text = f"What is the sum of all prime numbers less than {limit}?"
        return MathProblem(
            "primes", level, text, str(sum(below)), SIEVE_CODE + f"print(sum(primes_upto({limit - 1})))"
        )
    top = (50, 2000, 300000)[level - 1]
    pool = [p for p in _PRIMES if p <= top]
    factors = sorted(pool[int(i)] for i in rng.integers(0, len(pool), size=level + 1))
    n = math.prod(factors)
    text = f"What is the largest prime factor of {n}?"
    code = (
        f"n, f, best = {n}, 2, 1\n"
        "while f * f <= n:\n"
        "    while n % f == 0:\n"
        "        n //= f\n"
        "        best = f\n"
        "    f += 1\n"
        "print(max(best, n) if n > 1 else best)"
    )
    return MathProblem("primes", level, text, str(factors[-1]), code)


def fractions(rng: np.random.Generator, level: int) -> MathProblem:
    if level == 3 and rng.random() < 0.5:
        n = _int(rng, 15, 30)
        value = sum(Fraction(1, k) for k in range(1, n + 1))
        text = f"Compute 1 + 1/2 + 1/3 + … + 1/{n} exactly." + FRACTION_NOTE
        code = f"from fractions import Fraction\nprint(sum(Fraction(1, k) for k in range(1, {n} + 1)))"
        return MathProblem("fractions", level, text, _fraction_text(value), code)
    terms = [
        (int(rng.choice([-1, 1])), _int(rng, 1, 9 * level), _int(rng, 2, (12, 40, 200)[level - 1]))
        for _ in range(2 + level)
    ]
    value = sum(Fraction(s * p, q) for s, p, q in terms)
    shown = "".join(
        (f"{'−' if s < 0 else ''}{p}/{q}" if i == 0 else f" {'−' if s < 0 else '+'} {p}/{q}")
        for i, (s, p, q) in enumerate(terms)
    )
    text = f"Compute {shown} exactly." + FRACTION_NOTE
    parts = " + ".join(f"Fraction({s * p}, {q})" for s, p, q in terms)
    code = f"from fractions import Fraction\nprint({parts})"
    return MathProblem("fractions", level, text, _fraction_text(value), code)


def _solve(matrix: list[list[int]], rhs: list[int]) -> list[Fraction] | None:
    """Gauss-Jordan over fractions; None when singular."""
    n = len(matrix)
    rows = [[Fraction(v) for v in row] + [Fraction(b)] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if rows[r][col] != 0), None)
        if pivot is None:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col and rows[r][col] != 0:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n] / rows[i][i] for i in range(n)]


SOLVE_CODE = (
    "from fractions import Fraction as F\n"
    "def solve(a, b):\n"
    "    n = len(a)\n"
    "    m = [[F(v) for v in row] + [F(c)] for row, c in zip(a, b)]\n"
    "    for c in range(n):\n"
    "        p = next(r for r in range(c, n) if m[r][c] != 0)\n"
    "        m[c], m[p] = m[p], m[c]\n"
    "        for r in range(n):\n"
    "            if r != c and m[r][c] != 0:\n"
    "                f = m[r][c] / m[c][c]\n"
    "                m[r] = [x - f * y for x, y in zip(m[r], m[c])]\n"
    "    return [m[i][n] / m[i][i] for i in range(n)]\n"
)


def linear_system(rng: np.random.Generator, level: int) -> MathProblem:
    n = level + 1
    names = ("x", "y", "z", "w")[:n]
    span = (9, 20, 50)[level - 1]
    while True:
        matrix = [[_int(rng, -span, span) for _ in range(n)] for _ in range(n)]
        if level < 3:  # an integer solution
            solution = [_int(rng, -span, span) for _ in range(n)]
            rhs = [sum(a * s for a, s in zip(row, solution, strict=True)) for row in matrix]
        else:  # any right-hand side: the solution may be fractional
            rhs = [_int(rng, -10 * span, 10 * span) for _ in range(n)]
        solved = _solve(matrix, rhs)
        if solved is not None:
            break
    ask = int(rng.integers(n))
    equations = []
    for row, b in zip(matrix, rhs, strict=True):
        terms = ""
        for a, v in zip(row, names, strict=True):
            if a == 0:
                continue
            size = "" if abs(a) == 1 else str(abs(a))
            sign = ("-" if a < 0 else "") if not terms else (" - " if a < 0 else " + ")
            terms += f"{sign}{size}{v}"
        equations.append(f"{terms or '0'} = {b}")
    text = f"Solve the system of equations: {'; '.join(equations)}. What is the value of {names[ask]}?" + (
        FRACTION_NOTE if level == 3 else ""
    )
    code = SOLVE_CODE + f"print(solve({matrix}, {rhs})[{ask}])"
    return MathProblem("linear_system", level, text, _fraction_text(solved[ask]), code)


def series(rng: np.random.Generator, level: int) -> MathProblem:
    variant = ("powers", "telescoping", "partial", "divisors")[int(rng.integers(4))]
    if variant == "powers":
        p = _int(rng, 2, 1 + 2 * level)
        n = _int(rng, 10 ** (level + 1), 5 * 10 ** (level + 1))
        text = f"Compute the sum of k^{p} for k = 1 to {n}."
        value = sum(k**p for k in range(1, n + 1))
        return MathProblem(
            "series", level, text, str(value), f"print(sum(k ** {p} for k in range(1, {n} + 1)))"
        )
    if variant == "telescoping":
        n = _int(rng, 10 * level, 10 ** (level + 1))
        c = _int(rng, 1, 3 * level)
        value = sum(Fraction(1, k * (k + c)) for k in range(1, n + 1))
        text = f"Compute the exact sum of 1/(k(k+{c})) for k = 1 to {n}." + FRACTION_NOTE
        code = f"from fractions import Fraction\nprint(sum(Fraction(1, k * (k + {c})) for k in range(1, {n} + 1)))"
        return MathProblem("series", level, text, _fraction_text(value), code)
    if variant == "partial":
        p, q = _int(rng, 1, 4 * level), _int(rng, 2, 5 * level + 1)
        n = _int(rng, 5 * level, 15 * level)
        value = sum(Fraction(p, q) ** k for k in range(n + 1))
        text = f"Compute the exact value of the sum of ({p}/{q})^k for k = 0 to {n}." + FRACTION_NOTE
        code = (
            f"from fractions import Fraction\nprint(sum(Fraction({p}, {q}) ** k for k in range(0, {n} + 1)))"
        )
        return MathProblem("series", level, text, _fraction_text(value), code)
    n = _int(rng, 10 ** (level + 1), 5 * 10 ** (level + 1))
    value = sum(n // k for k in range(1, n + 1))
    text = f"Compute the sum of floor({n}/k) for k = 1 to {n}."
    return MathProblem("series", level, text, str(value), f"print(sum({n} // k for k in range(1, {n} + 1)))")


MAKERS: dict[str, Callable[[np.random.Generator, int], MathProblem]] = {
    "arithmetic": arithmetic,
    "modular": modular,
    "combinatorics": combinatorics,
    "primes": primes,
    "fractions": fractions,
    "linear_system": linear_system,
    "series": series,
}


def check_options(kinds: tuple[str, ...], level: int | None) -> None:
    unknown = [k for k in kinds if k not in MAKERS]
    if unknown or not kinds:
        raise ConfigError(f"unknown problem kind(s) {unknown or kinds}; choose from {KINDS}")
    if level is not None and level not in LEVELS:
        raise ConfigError(f"difficulty must be one of {LEVELS} (or None for a mix), got {level!r}")


def make_problem(
    rng: np.random.Generator, kinds: tuple[str, ...] = KINDS, level: int | None = None
) -> MathProblem:
    """One problem of a kind drawn from ``kinds`` at ``level`` (None: a level drawn too).

    >>> p = make_problem(np.random.default_rng(0), ("fractions",), 1)
    >>> p.kind, p.level, "Fraction" in p.code
    ('fractions', 1, True)
    """
    check_options(kinds, level)
    kind = kinds[int(rng.integers(len(kinds)))]
    lvl = level if level is not None else LEVELS[int(rng.integers(len(LEVELS)))]
    return MAKERS[kind](rng, lvl)
