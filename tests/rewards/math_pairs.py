"""A labelled pool of math answer pairs (gold, candidate, equivalent?) built from templates, for measuring
how often the math reward agrees with the label. Shared by the tests and benchmarks/reward_throughput.py."""

from __future__ import annotations

from fractions import Fraction


def _frac_forms(p: int, q: int) -> list[str]:
    return [
        f"\\frac{{{p}}}{{{q}}}",
        f"{p}/{q}",
        f"\\dfrac{{{p}}}{{{q}}}",
        f"{float(Fraction(p, q)):.6f}".rstrip("0"),
    ]


def math_pairs() -> list[tuple[str, str, bool]]:
    pairs: list[tuple[str, str, bool]] = []
    for n in (5, 1, 7, 12, 42, 99, 100, 256, 2024, 31415, -3, -58):
        pairs += [(str(n), str(n), True), (str(n), f"{n}.0", True), (str(n), f"${n}$", True)]
        pairs += [(str(n), str(n + 1), False), (str(n), str(-n), False), (str(n), f"{n}.5", False)]
    for n in (1000, 25000, 1234567):
        pairs += [
            (str(n), f"{n:,}", True),
            (str(n), f"{n:,}".replace(",", "{,}"), True),
            (str(n), str(n * 10), False),
        ]
    for p, q in ((1, 2), (3, 4), (2, 3), (5, 8), (7, 3), (-1, 6)):
        forms = _frac_forms(p, q)
        pairs += [(forms[0], f, True) for f in forms[1:]]
        pairs += [(forms[0], f"\\frac{{{q}}}{{{p}}}", False), (forms[0], f"\\frac{{{p + 1}}}{{{q}}}", False)]
    for k, (a, b) in enumerate(((8, 2), (12, 2), (18, 3), (50, 5), (27, 3))):
        root = {8: 2, 12: 3, 18: 2, 50: 2, 27: 3}[a]
        pairs += [
            (f"{b}\\sqrt{{{root}}}", f"\\sqrt{{{a}}}", True),
            (f"{b}\\sqrt{{{root}}}", f"{b + 1}\\sqrt{{{root}}}", False),
        ]
        pairs += [(f"\\sqrt{{{a}}}", f"\\sqrt{{{a + 1 + k}}}", False)]
    for r in (1, 2, 3, -4):
        s = "+" if r < 0 else "-"
        expanded = f"x^2 {s} {2 * abs(r)}x + {r * r}"
        pairs += [(f"(x {s} {abs(r)})^2", expanded, True), (f"(x {s} {abs(r)})^2", f"x^2 + {r * r}", False)]
    for c in (2, 3, 5):
        pairs += [(f"{c}\\pi", f"\\pi \\cdot {c}", True), (f"\\frac{{\\pi}}{{{c}}}", f"\\pi/{c}", True)]
        pairs += [
            (f"{c}\\pi", f"{c + 1}\\pi", False),
            (f"\\frac{{\\pi}}{{{c}}}", f"\\frac{{{c}}}{{\\pi}}", False),
        ]
    for a, b in ((1, 2), (0, 5), (-3, 4)):
        pairs += [(f"({a}, {b})", f"({a},{b})", True), (f"[{a}, {b}]", f"[{a},{b}]", True)]
        pairs += [(f"({a}, {b})", f"[{a}, {b}]", False), (f"[{a}, {b}]", f"[{a}, {b + 1}]", False)]
        pairs += [
            (f"\\{{{a}, {b}\\}}", f"\\{{{b}, {a}\\}}", True),
            (f"\\{{{a}, {b}\\}}", f"\\{{{a}, {b + 2}\\}}", False),
        ]
    for v in (3, 10, 45):
        pairs += [
            (f"{v}^\\circ", f"{v}", True),
            (f"{v}", f"{v}\\text{{ cm}}", True),
            (f"{v}", f"{v + 1}\\text{{ cm}}", False),
        ]
        pairs += [(f"x = {v}", f"{v}", True), (f"{v}", f"x={v + 2}", False)]
    for e in (2, 3, 10):
        pairs += [(f"2^{{{e}}}", str(2**e), True), (f"2^{{{e}}}", str(2**e + 2), False)]
        pairs += [(f"e^{{{e}}}", f"\\exp({e})", True), (f"e^{{{e}}}", f"e^{{{e + 1}}}", False)]
    pairs += [
        ("\\infty", "\\infty", True), ("\\infty", "-\\infty", False), ("0.25", "25\\%", True),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", False),
        ("\\sin(30^\\circ)", "\\frac{1}{2}", True), ("\\log_2 8", "3", True), ("\\log_2 8", "4", False),
        ("1+i", "i+1", True), ("1+i", "1-i", False), ("\\binom{5}{2}", "10", True), ("\\binom{5}{2}", "20", False),
        ("3!", "6", True), ("4!", "12", False), ("x^2-1", "(x-1)(x+1)", True), ("x^2-1", "(x-1)^2", False),
        ("\\frac{a}{b}", "a/b", True), ("2a+b", "b+2a", True), ("2a+b", "2b+a", False), ("0.\\overline{3}", "\\frac{1}{3}", True),
    ]  # fmt: skip
    return pairs
