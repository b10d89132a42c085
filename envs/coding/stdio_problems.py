"""Built-in stdin/stdout problems (competitive-programming style), with generated tests.

Each problem has a statement, a reference ``solve(data: str) -> str`` (kept as source: it is both the
canonical program the expert submits and, run here once, the oracle for the expected outputs), and an input
generator. Tests come from a fixed seed per problem: the first two are visible, all ten grade.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from toolgym.envs.coding.tasks import CodingProblem

TESTS_PER_PROBLEM = 10
VISIBLE = 2
RUNNER = "\n\nimport sys\n\nsys.stdout.write(solve(sys.stdin.read()))\n"


@dataclass(frozen=True)
class StdioSpec:
    name: str
    statement: str
    solution: str
    make_input: Callable[[np.random.Generator, int], str]


def _ints(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[int]:
    return [int(v) for v in rng.integers(lo, hi + 1, size=n)]


def _line(values: list[Any]) -> str:
    return " ".join(str(v) for v in values)


def _sum_pairs(rng: np.random.Generator, size: int) -> str:
    n = 1 + size
    rows = [_line(_ints(rng, 2, -(10**12), 10**12)) for _ in range(n)]
    return f"{n}\n" + "\n".join(rows) + "\n"


def _array(rng: np.random.Generator, size: int, lo: int = -100, hi: int = 100) -> str:
    n = 1 + 3 * size
    return f"{n}\n{_line(_ints(rng, n, lo, hi))}\n"


def _words(rng: np.random.Generator, size: int) -> str:
    vocab = ["apple", "Banana", "cherry", "date", "Elder", "fig", "grape", "apple", "fig", "kiwi"]
    lines = []
    for _ in range(1 + size // 2):
        lines.append(" ".join(vocab[int(i)] for i in rng.integers(0, len(vocab), size=2 + size)))
    return "\n".join(lines) + "\n"


def _range(rng: np.random.Generator, size: int) -> str:
    lo = int(rng.integers(1, 10 ** (1 + size // 2)))
    return f"{lo} {lo + int(rng.integers(0, 50 * (size + 1)))}\n"


def _brackets(rng: np.random.Generator, size: int) -> str:
    lines = []
    for _ in range(2 + size):
        if rng.random() < 0.5:  # a balanced one, built from nested pairs
            out = ""
            for _ in range(1 + size):
                o, c = ("()", "[]", "{}")[int(rng.integers(3))]
                out = o + out + c if rng.random() < 0.5 else out + o + c
            lines.append(out)
        else:
            lines.append("".join("()[]{}"[int(i)] for i in rng.integers(0, 6, size=2 + 2 * size)))
    return f"{len(lines)}\n" + "\n".join(lines) + "\n"


def _matrix(rng: np.random.Generator, size: int) -> str:
    n = 1 + size % 5
    rows = [_line(_ints(rng, n, 0, 99)) for _ in range(n)]
    return f"{n}\n" + "\n".join(rows) + "\n"


def _pairs(rng: np.random.Generator, size: int) -> str:
    n = 1 + size
    rows = [_line(_ints(rng, 2, 1, 10 ** (2 + size % 8))) for _ in range(n)]
    return f"{n}\n" + "\n".join(rows) + "\n"


def _strings(rng: np.random.Generator, size: int) -> str:
    rows = [
        "".join("abc"[int(i)] for i in rng.integers(0, 3, size=1 + 2 * size)) for _ in range(1 + size // 3)
    ]
    return f"{len(rows)}\n" + "\n".join(rows) + "\n"


def _grid(rng: np.random.Generator, size: int) -> str:
    h, w = 2 + size // 2, 2 + size
    cells = [["#" if rng.random() < 0.3 else "." for _ in range(w)] for _ in range(h)]
    cells[0][0] = cells[h - 1][w - 1] = "."
    return f"{h} {w}\n" + "\n".join("".join(r) for r in cells) + "\n"


def _coins(rng: np.random.Generator, size: int) -> str:
    coins = sorted({int(v) for v in rng.integers(1, 20, size=1 + size % 5)})
    return f"{len(coins)} {int(rng.integers(0, 100 * (size + 1)))}\n{_line(coins)}\n"


def _runs(rng: np.random.Generator, size: int) -> str:
    rows = []
    for _ in range(1 + size // 3):
        rows.append("".join(ch * int(rng.integers(1, 5)) for ch in rng.choice(list("xyz"), size=1 + size)))
    return "\n".join(rows) + "\n"


def _two_sum(rng: np.random.Generator, size: int) -> str:
    n = 2 + 4 * size
    return f"{n} {int(rng.integers(-10, 30))}\n{_line(_ints(rng, n, -10, 20))}\n"


def _roman(rng: np.random.Generator, size: int) -> str:
    values = _ints(rng, 1 + size, 1, 3999)
    return f"{len(values)}\n" + "\n".join(map(str, values)) + "\n"


SPECS = (
    StdioSpec(
        "sum_pairs",
        "The first line holds n. Each of the next n lines holds two integers a and b (|a|, |b| ≤ 10^12). "
        "Print a + b for each line, one per line.",
        "def solve(data):\n"
        "    nums = list(map(int, data.split()))\n"
        "    n = nums[0]\n"
        "    return ''.join(f'{nums[1 + 2 * i] + nums[2 + 2 * i]}\\n' for i in range(n))\n",
        _sum_pairs,
    ),
    StdioSpec(
        "max_subarray",
        "The first line holds n, the second n integers. Print the largest sum of a non-empty contiguous "
        "subarray.",
        "def solve(data):\n"
        "    nums = list(map(int, data.split()))[1:]\n"
        "    best = cur = nums[0]\n"
        "    for x in nums[1:]:\n"
        "        cur = max(x, cur + x)\n"
        "        best = max(best, cur)\n"
        "    return f'{best}\\n'\n",
        _array,
    ),
    StdioSpec(
        "top_word",
        "Read a text of words separated by spaces and newlines. Ignoring case, print the most frequent word "
        "in lower case and its count, separated by a space; on a tie, the alphabetically smallest word.",
        "def solve(data):\n"
        "    counts = {}\n"
        "    for w in data.lower().split():\n"
        "        counts[w] = counts.get(w, 0) + 1\n"
        "    word = min(counts, key=lambda w: (-counts[w], w))\n"
        "    return f'{word} {counts[word]}\\n'\n",
        _words,
    ),
    StdioSpec(
        "primes_in_range",
        "The input holds two integers L and R (1 ≤ L ≤ R). Print how many primes p satisfy L ≤ p ≤ R.",
        "def solve(data):\n"
        "    lo, hi = map(int, data.split())\n"
        "    def prime(n):\n"
        "        if n < 2:\n"
        "            return False\n"
        "        f = 2\n"
        "        while f * f <= n:\n"
        "            if n % f == 0:\n"
        "                return False\n"
        "            f += 1\n"
        "        return True\n"
        "    return f'{sum(prime(n) for n in range(lo, hi + 1))}\\n'\n",
        _range,
    ),
    StdioSpec(
        "balanced",
        "The first line holds T; each of the next T lines is a string of the characters ()[]{}. For each, "
        "print YES if its brackets are balanced and properly nested, else NO.",
        "def solve(data):\n"
        "    lines = data.split('\\n')\n"
        "    t = int(lines[0])\n"
        "    pairs = {')': '(', ']': '[', '}': '{'}\n"
        "    out = []\n"
        "    for s in lines[1 : 1 + t]:\n"
        "        stack = []\n"
        "        ok = True\n"
        "        for ch in s.strip():\n"
        "            if ch in '([{':\n"
        "                stack.append(ch)\n"
        "            elif not stack or stack.pop() != pairs[ch]:\n"
        "                ok = False\n"
        "                break\n"
        "        out.append('YES' if ok and not stack else 'NO')\n"
        "    return '\\n'.join(out) + '\\n'\n",
        _brackets,
    ),
    StdioSpec(
        "longest_increasing",
        "The first line holds n, the second n integers. Print the length of the longest strictly increasing "
        "subsequence.",
        "def solve(data):\n"
        "    import bisect\n"
        "    nums = list(map(int, data.split()))[1:]\n"
        "    tails = []\n"
        "    for x in nums:\n"
        "        i = bisect.bisect_left(tails, x)\n"
        "        tails[i : i + 1] = [x]\n"
        "    return f'{len(tails)}\\n'\n",
        _array,
    ),
    StdioSpec(
        "rotate",
        "The first line holds n; the next n lines hold an n×n matrix of integers. Print the matrix rotated "
        "90 degrees clockwise, one row per line, values separated by single spaces.",
        "def solve(data):\n"
        "    lines = data.strip().split('\\n')\n"
        "    n = int(lines[0])\n"
        "    m = [line.split() for line in lines[1 : 1 + n]]\n"
        "    rows = [' '.join(m[n - 1 - r][c] for r in range(n)) for c in range(n)]\n"
        "    return '\\n'.join(rows) + '\\n'\n",
        _matrix,
    ),
    StdioSpec(
        "gcd_lcm",
        "The first line holds n; each of the next n lines holds two positive integers. For each line print "
        "their greatest common divisor and least common multiple, separated by a space.",
        "def solve(data):\n"
        "    import math\n"
        "    nums = list(map(int, data.split()))\n"
        "    out = []\n"
        "    for i in range(nums[0]):\n"
        "        a, b = nums[1 + 2 * i], nums[2 + 2 * i]\n"
        "        g = math.gcd(a, b)\n"
        "        out.append(f'{g} {a // g * b}')\n"
        "    return '\\n'.join(out) + '\\n'\n",
        _pairs,
    ),
    StdioSpec(
        "longest_palindrome",
        "The first line holds T; each of the next T lines is a string of lowercase letters. For each, print "
        "the length of its longest palindromic substring.",
        "def solve(data):\n"
        "    lines = data.split()\n"
        "    out = []\n"
        "    for s in lines[1 : 1 + int(lines[0])]:\n"
        "        best = 0\n"
        "        for i in range(len(s)):\n"
        "            for j in range(i + 1, len(s) + 1):\n"
        "                if j - i > best and s[i:j] == s[i:j][::-1]:\n"
        "                    best = j - i\n"
        "        out.append(str(best))\n"
        "    return '\\n'.join(out) + '\\n'\n",
        _strings,
    ),
    StdioSpec(
        "grid_path",
        "The first line holds h and w; the next h lines hold a grid of '.' (free) and '#' (wall). Moving "
        "up, down, left or right through free cells, print the fewest moves from the top-left cell to the "
        "bottom-right cell, or -1 if it cannot be reached.",
        "def solve(data):\n"
        "    from collections import deque\n"
        "    lines = data.split()\n"
        "    h, w = int(lines[0]), int(lines[1])\n"
        "    g = lines[2 : 2 + h]\n"
        "    dist = {(0, 0): 0}\n"
        "    queue = deque([(0, 0)])\n"
        "    while queue:\n"
        "        r, c = queue.popleft()\n"
        "        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n"
        "            nr, nc = r + dr, c + dc\n"
        "            if 0 <= nr < h and 0 <= nc < w and g[nr][nc] == '.' and (nr, nc) not in dist:\n"
        "                dist[(nr, nc)] = dist[(r, c)] + 1\n"
        "                queue.append((nr, nc))\n"
        "    return f'{dist.get((h - 1, w - 1), -1)}\\n'\n",
        _grid,
    ),
    StdioSpec(
        "coin_ways",
        "The first line holds k and a target t; the second line k distinct coin values. Print the number of "
        "ways to make t as a sum of coins (unlimited coins of each value; order does not matter), modulo "
        "1000000007.",
        "def solve(data):\n"
        "    nums = list(map(int, data.split()))\n"
        "    k, t, coins = nums[0], nums[1], nums[2 : 2 + nums[0]]\n"
        "    ways = [1] + [0] * t\n"
        "    for c in coins:\n"
        "        for v in range(c, t + 1):\n"
        "            ways[v] = (ways[v] + ways[v - c]) % 1000000007\n"
        "    return f'{ways[t]}\\n'\n",
        _coins,
    ),
    StdioSpec(
        "run_length",
        "Each input line is a non-empty string of letters. Print its run-length encoding: each maximal run "
        "of a letter as the letter followed by the run's length (aaab -> a3b1), one line per input line.",
        "def solve(data):\n"
        "    out = []\n"
        "    for s in data.split():\n"
        "        enc, i = '', 0\n"
        "        while i < len(s):\n"
        "            j = i\n"
        "            while j < len(s) and s[j] == s[i]:\n"
        "                j += 1\n"
        "            enc += f'{s[i]}{j - i}'\n"
        "            i = j\n"
        "        out.append(enc)\n"
        "    return '\\n'.join(out) + '\\n'\n",
        _runs,
    ),
    StdioSpec(
        "pair_sums",
        "The first line holds n and K; the second n integers a_1..a_n. Print the number of index pairs "
        "i < j with a_i + a_j = K.",
        "def solve(data):\n"
        "    nums = list(map(int, data.split()))\n"
        "    n, k, a = nums[0], nums[1], nums[2 : 2 + nums[0]]\n"
        "    seen, count = {}, 0\n"
        "    for x in a:\n"
        "        count += seen.get(k - x, 0)\n"
        "        seen[x] = seen.get(x, 0) + 1\n"
        "    return f'{count}\\n'\n",
        _two_sum,
    ),
    StdioSpec(
        "roman",
        "The first line holds n; each of the next n lines holds an integer from 1 to 3999. Print each in "
        "Roman numerals (e.g. 1994 -> MCMXCIV), one per line.",
        "def solve(data):\n"
        "    nums = list(map(int, data.split()))[1:]\n"
        "    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'),\n"
        "             (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
        "    out = []\n"
        "    for n in nums:\n"
        "        s = ''\n"
        "        for v, sym in table:\n"
        "            while n >= v:\n"
        "                s += sym\n"
        "                n -= v\n"
        "        out.append(s)\n"
        "    return '\\n'.join(out) + '\\n'\n",
        _roman,
    ),
)


def _problem(index: int, spec: StdioSpec) -> CodingProblem:
    namespace: dict[str, Any] = {}
    exec(compile(spec.solution, f"<{spec.name}>", "exec"), namespace)  # our own reference solution
    solve = namespace["solve"]
    rng = np.random.default_rng(1000 + index)
    inputs = [spec.make_input(rng, size) for size in range(TESTS_PER_PROBLEM)]
    cases = [{"input": data, "output": solve(data)} for data in inputs]
    return CodingProblem(
        task_id=f"stdio/{spec.name}",
        kind="stdio",
        prompt=spec.statement,
        visible=cases[:VISIBLE],
        hidden=cases,
        canonical=spec.solution + RUNNER,
    )


@cache
def _all() -> tuple[CodingProblem, ...]:
    return tuple(_problem(i, spec) for i, spec in enumerate(SPECS))


def builtin_problems() -> list[CodingProblem]:
    """The built-in stdin/stdout problems with their tests.

    >>> problems = builtin_problems()
    >>> len(problems), problems[0].task_id, len(problems[0].hidden)
    (14, 'stdio/sum_pairs', 10)
    """
    return list(_all())
