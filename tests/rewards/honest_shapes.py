"""Honest solutions in the shapes real code datasets use, each with the row's tests and (for some) a wrong
version: HumanEval ``check(candidate)`` rows (with a prelude), MBPP assert lists, APPS/LeetCode
``class Solution`` and design problems (a prelude's ``ListNode``/``TreeNode``), stdin/stdout programs, and
tests that build the candidate's classes, compare its dataclasses, use its numpy arrays and its ``np``,
pass it callbacks or take its functions, or ``import solution``. Every honest one must score 1.0, every
wrong one 0.0. Shared by tests/rewards/test_rewards_code_shapes.py and the batch acceptance test.

``SHAPES[name] = (solution, tests, wrong solution or None)``; ``tests`` is any value ``code_tests`` takes.
"""

from __future__ import annotations

from typing import Any

LISTNODE = "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val = val\n        self.next = next\n"
TREENODE = (
    "class TreeNode:\n    def __init__(self, val=0, left=None, right=None):\n"
    "        self.val = val\n        self.left = left\n        self.right = right\n"
)
LEETCODE_HELPERS = (
    LISTNODE + "\ndef list_node(values):\n    head = None\n    for v in reversed(values):\n"
    "        head = ListNode(v, head)\n    return head\n\ndef to_list(node):\n    out = []\n"
    "    while node:\n        out.append(node.val)\n        node = node.next\n    return out\n"
)
STACK = (
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
    "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
    "    def peek(self):\n        return self.items[-1]\n    def is_empty(self):\n        return not self.items\n"
    "    def __len__(self):\n        return len(self.items)\n    def __iter__(self):\n"
    "        return iter(reversed(self.items))\n    def __contains__(self, x):\n        return x in self.items\n"
)

SHAPES: dict[str, tuple[str, Any, str | None]] = {
    # --- HumanEval: check(candidate), the prompt as prelude -----------------------------------------
    "humaneval add": (
        "def add(x: int, y: int) -> int:\n    return x + y\n",
        {
            "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(7, 5) == 12\n",
            "entry_point": "add",
            "prelude": "def add(x: int, y: int) -> int:\n    '''Add two numbers.'''\n",
        },
        "def add(x, y):\n    return x - y\n",
    ),
    "humaneval float tolerance": (
        "def mean_absolute_deviation(numbers):\n    m = sum(numbers) / len(numbers)\n"
        "    return sum(abs(x - m) for x in numbers) / len(numbers)\n",
        {
            "test": "def check(candidate):\n    assert abs(candidate([1.0, 2.0, 3.0]) - 2.0/3.0) < 1e-6\n"
            "    assert abs(candidate([1.0, 2.0, 3.0, 4.0]) - 1.0) < 1e-6\n",
            "entry_point": "mean_absolute_deviation",
        },
        "def mean_absolute_deviation(numbers):\n    return 0.5\n",
    ),
    "humaneval prelude helper": (
        "def find_zero(xs):\n    lo, hi = -100.0, 100.0\n    for _ in range(200):\n        mid = (lo + hi) / 2\n"
        "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n        else:\n            lo = mid\n"
        "    return lo\n",
        {
            "test": "import math\ndef check(candidate):\n    for xs in ([1, 2], [-6, 11, -6, 1]):\n"
            "        assert math.fabs(poly(xs, candidate(xs))) < 1e-4\n",
            "entry_point": "find_zero",
            "prelude": "import math\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n",
        },
        None,
    ),
    "humaneval booleans": (
        "def below_zero(ops):\n    total = 0\n    for op in ops:\n        total += op\n        if total < 0:\n"
        "            return True\n    return False\n",
        {
            "test": "def check(candidate):\n    assert candidate([1, -2]) is True\n    assert not candidate([1, 2])\n",
            "entry_point": "below_zero",
        },
        "def below_zero(ops):\n    return True\n",
    ),
    "humaneval strings and lists": (
        "def filter_by_prefix(strings, prefix):\n    return [s for s in strings if s.startswith(prefix)]\n",
        {
            "test": "def check(candidate):\n    assert candidate([], 'a') == []\n"
            "    assert candidate(['abc', 'bcd', 'array'], 'a') == ['abc', 'array']\n",
            "entry_point": "filter_by_prefix",
        },
        "def filter_by_prefix(strings, prefix):\n    return strings\n",
    ),
    # --- MBPP: assert lists ----------------------------------------------------------------------------
    "mbpp tuple of set": (
        "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n",
        [
            "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
            "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
        ],
        "def similar_elements(a, b):\n    return (3, 4)\n",
    ),
    "mbpp math.isclose": (
        "import math\ndef circle_area(r):\n    return math.pi * r * r\n",
        [
            "assert math.isclose(circle_area(10), 314.15926535897927, rel_tol=0.001)",
            "assert math.isclose(circle_area(5), 78.53981633974483, rel_tol=0.001)",
        ],
        "def circle_area(r):\n    return 3 * r * r\n",
    ),
    "mbpp heapq": (
        "import heapq as hq\ndef heap_queue_largest(nums, n):\n    return hq.nlargest(n, nums)\n",
        ["assert heap_queue_largest([25, 35, 22, 85, 14, 65, 75, 22, 58], 3) == [85, 75, 65]"],
        "def heap_queue_largest(nums, n):\n    return sorted(nums)[:n]\n",
    ),
    "mbpp regex": (
        "import re\ndef text_match(text):\n    return 'Found a match!' if re.search('ab*?', text) else 'Not matched!'\n",
        ["assert text_match('ac') == 'Found a match!'", "assert text_match('dc') == 'Not matched!'"],
        None,
    ),
    # --- APPS / LeetCode ---------------------------------------------------------------------------------
    "leetcode class Solution": (
        "from typing import List\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n",
        [
            "assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]",
            "assert Solution().twoSum([3, 2, 4], 6) == [1, 2]",
        ],
        "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n",
    ),
    "leetcode ListNode prelude": (
        "class Solution:\n    def reverseList(self, head):\n        prev = None\n        while head:\n"
        "            head.next, prev, head = prev, head, head.next\n        return prev\n",
        {
            "test": "def check(candidate):\n    assert to_list(candidate(list_node([1, 2, 3]))) == [3, 2, 1]\n"
            "    assert candidate(None) is None\n",
            "entry_point": "reverse",
            "prelude": LEETCODE_HELPERS + "\ndef reverse(head):\n    return Solution().reverseList(head)\n",
        },
        "class Solution:\n    def reverseList(self, head):\n        return head\n",
    ),
    "leetcode TreeNode prelude": (
        "class Solution:\n    def maxDepth(self, root):\n        if root is None:\n            return 0\n"
        "        return 1 + max(self.maxDepth(root.left), self.maxDepth(root.right))\n",
        {
            "test": "def test_depth():\n    root = TreeNode(3, TreeNode(9), TreeNode(20, TreeNode(15), TreeNode(7)))\n"
            "    assert Solution().maxDepth(root) == 3\n    assert Solution().maxDepth(None) == 0\n",
            "prelude": TREENODE,
        },
        "class Solution:\n    def maxDepth(self, root):\n        return 2\n",
    ),
    "leetcode design MinStack": (
        "class MinStack:\n    def __init__(self):\n        self.s = []\n    def push(self, val):\n"
        "        self.s.append((val, min(val, self.s[-1][1]) if self.s else val))\n    def pop(self):\n"
        "        self.s.pop()\n    def top(self):\n        return self.s[-1][0]\n    def getMin(self):\n"
        "        return self.s[-1][1]\n",
        [
            "obj = MinStack()\nobj.push(-2)\nobj.push(0)\nobj.push(-3)\nassert obj.getMin() == -3\nobj.pop()\n"
            "assert obj.top() == 0\nassert obj.getMin() == -2"
        ],
        "class MinStack:\n    def __init__(self):\n        self.s = []\n    def push(self, val):\n        self.s.append(val)\n"
        "    def pop(self):\n        self.s.pop()\n    def top(self):\n        return self.s[-1]\n"
        "    def getMin(self):\n        return self.s[0]\n",
    ),
    "leetcode candidate ListNode": (
        LISTNODE + "def merge(a, b):\n    dummy = tail = ListNode()\n    while a and b:\n"
        "        if a.val <= b.val:\n            tail.next, a = a, a.next\n        else:\n            tail.next, b = b, b.next\n"
        "        tail = tail.next\n    tail.next = a or b\n    return dummy.next\n",
        [
            "a = ListNode(1, ListNode(4))\nb = ListNode(2, ListNode(3))\nnode = merge(a, b)\nout = []\n"
            "while node:\n    out.append(node.val)\n    node = node.next\nassert out == [1, 2, 3, 4]"
        ],
        None,
    ),
    # --- stdin/stdout programs (APPS, CodeContests) ---------------------------------------------------
    "stdio sum": (
        "a, b = map(int, input().split())\nprint(a + b)\n",
        [{"input": "1 2\n", "output": "3\n"}, {"input": "20 22\n", "output": "42\n"}],
        "print(3)\n",
    ),
    "stdio lines and sys.stdin": (
        "import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\nxs = list(map(int, data[1:1 + n]))\n"
        "print(max(xs))\nprint(*sorted(xs))\n",
        [{"input": "3\n5 1 4\n", "output": "5\n1 4 5\n"}, {"input": "1\n7\n", "output": "7\n7"}],
        "print(5)\nprint('1 4 5')\n",
    ),
    "stdio main guard": (
        "def solve(s):\n    return s[::-1]\n\nif __name__ == '__main__':\n    print(solve(input().strip()))\n",
        [{"input": "abc\n", "output": "cba\n"}],
        None,
    ),
    # --- the candidate's classes, built by the tests ------------------------------------------------
    "class Stack protocols": (
        STACK,
        [
            "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2\nassert len(s) == 1\nassert not s.is_empty()",
            "s = Stack()\nfor i in range(3):\n    s.push(i)\nassert list(s) == [2, 1, 0] and 1 in s and 5 not in s\n"
            "assert s.peek() == 2 and s.items == [0, 1, 2]",
            "s = Stack()\nassert s.is_empty() and len(s) == 0 and not s",
        ],
        STACK.replace("return self.items.pop()", "return self.items[0]"),
    ),
    "class isinstance and attributes": (
        "class BankAccount:\n    def __init__(self, owner, balance=0):\n        self.owner = owner\n"
        "        self.balance = balance\n    def deposit(self, x):\n        if x <= 0:\n"
        "            raise ValueError('positive only')\n        self.balance += x\n        return self.balance\n",
        [
            "acct = BankAccount('ann')\nassert isinstance(acct, BankAccount)\nassert acct.deposit(5) == 5\n"
            "assert acct.balance == 5 and acct.owner == 'ann'",
            "acct = BankAccount('bob', 3)\ntry:\n    acct.deposit(-1)\n    assert False\nexcept ValueError:\n    pass\n"
            "acct.balance = 10\nassert acct.deposit(1) == 11",
        ],
        "class BankAccount:\n    def __init__(self, owner, balance=0):\n        self.owner = owner\n"
        "        self.balance = balance\n    def deposit(self, x):\n        return x\n",
    ),
    "class properties, classmethods, str": (
        "class Temperature:\n    def __init__(self, c):\n        self._c = c\n    @property\n    def fahrenheit(self):\n"
        "        return self._c * 9 / 5 + 32\n    @classmethod\n    def from_f(cls, f):\n        return cls((f - 32) * 5 / 9)\n"
        "    @staticmethod\n    def unit():\n        return 'C'\n    def __str__(self):\n        return f'{self._c:.1f}C'\n",
        [
            "t = Temperature(100)\nassert t.fahrenheit == 212\nassert str(t) == '100.0C'",
            "assert Temperature.from_f(212).fahrenheit == 212 and Temperature.unit() == 'C'",
        ],
        None,
    ),
    "class operators (Vector)": (
        "class Vector:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n    def __add__(self, o):\n"
        "        return Vector(self.x + o.x, self.y + o.y)\n    def __eq__(self, o):\n"
        "        return isinstance(o, Vector) and (self.x, self.y) == (o.x, o.y)\n    def __abs__(self):\n"
        "        return (self.x ** 2 + self.y ** 2) ** 0.5\n    def __lt__(self, o):\n        return abs(self) < abs(o)\n",
        [
            "assert Vector(1, 2) + Vector(2, 2) == Vector(3, 4)",
            "assert abs(Vector(3, 4)) == 5.0",
            "assert Vector(1, 1) < Vector(3, 4) and Vector(1, 2) != Vector(2, 1)",
            "assert sorted([Vector(3, 4), Vector(1, 0)])[0] == Vector(1, 0)",
        ],
        "class Vector:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n    def __add__(self, o):\n"
        "        return Vector(self.x, self.y)\n    def __eq__(self, o):\n        return True\n"
        "    def __abs__(self):\n        return 5.0\n    def __lt__(self, o):\n        return True\n",
    ),
    "test module building classes": (
        "class Counter:\n    def __init__(self):\n        self.n = 0\n    def incr(self, by=1):\n        self.n += by\n"
        "        return self\n    def value(self):\n        return self.n\n",
        "def test_incr():\n    c = Counter()\n    c.incr()\n    c.incr(by=2)\n    assert c.value() == 3\n\n"
        "def test_fresh():\n    assert Counter().value() == 0\n",
        "class Counter:\n    def incr(self, by=1):\n        return self\n    def value(self):\n        return 3\n",
    ),
    # --- dataclasses, namedtuples -------------------------------------------------------------------
    "dataclass returned and compared": (
        "from dataclasses import dataclass\n@dataclass\nclass Point:\n    x: int\n    y: int\n"
        "def midpoint(a, b):\n    return Point((a.x + b.x) // 2, (a.y + b.y) // 2)\n",
        [
            "assert midpoint(Point(0, 0), Point(2, 4)) == Point(1, 2)",
            "assert midpoint(Point(0, 0), Point(2, 4)) != Point(1, 3)",
            "assert midpoint(Point(2, 2), Point(4, 4)).x == 3",
        ],
        "from dataclasses import dataclass\n@dataclass\nclass Point:\n    x: int\n    y: int\n"
        "def midpoint(a, b):\n    return Point(1, 2)\n",
    ),
    "frozen dataclass in a set, ordered": (
        "from dataclasses import dataclass\n@dataclass(frozen=True, order=True)\nclass Card:\n    rank: int\n"
        "    suit: str\ndef deck(n):\n    return [Card(r, s) for r in range(n) for s in 'hs']\n",
        [
            "assert len({Card(1, 'h'), Card(1, 'h'), Card(2, 's')}) == 2",
            "d = deck(2)\nassert d[0] == Card(0, 'h') and len(d) == 4 and Card(1, 's') in d",
            "assert Card(1, 'h') < Card(2, 'h')",
        ],
        None,
    ),
    "namedtuple fields": (
        "from collections import namedtuple\nPair = namedtuple('Pair', 'lo hi')\ndef bounds(xs):\n"
        "    return Pair(min(xs), max(xs))\n",
        ["r = bounds([3, 1, 2])\nassert r == (1, 3) and r.lo == 1 and r.hi == 3"],
        "from collections import namedtuple\nPair = namedtuple('Pair', 'lo hi')\ndef bounds(xs):\n    return Pair(xs[0], xs[-1])\n",
    ),
    "dataclass in prelude by value": (
        "def scale(p, k):\n    return Point(p.x * k, p.y * k)\n",
        {
            "test": "def check(candidate):\n    assert candidate(Point(1, 2), 3) == Point(3, 6)\n",
            "entry_point": "scale",
            "prelude": "from dataclasses import dataclass\n@dataclass\nclass Point:\n    x: int\n    y: int\n",
        },
        "def scale(p, k):\n    return Point(p.x, p.y)\n",
    ),
    # --- numpy ----------------------------------------------------------------------------------------
    "numpy arrays with the candidate's np": (
        "import numpy as np\ndef double(n):\n    return np.arange(n) * 2\n",
        [
            "assert np.array_equal(double(3), np.array([0, 2, 4]))",
            "assert double(4).shape == (4,)",
            "assert (double(2) == [0, 2]).all() and double(2).dtype == np.arange(1).dtype",
        ],
        "import numpy as np\ndef double(n):\n    return np.arange(n)\n",
    ),
    "numpy array arguments": (
        "import numpy as np\ndef normalize(v):\n    return v / np.linalg.norm(v)\n",
        [
            "import numpy as np\nassert np.allclose(normalize(np.array([3.0, 4.0])), [0.6, 0.8])",
            "import numpy as np\nm = normalize(np.ones((2, 2)))\nassert m.shape == (2, 2) and np.isclose(m.sum(), 2.0)",
        ],
        "import numpy as np\ndef normalize(v):\n    return v\n",
    ),
    # --- callables in both directions ------------------------------------------------------------------
    "test passes a lambda": (
        "def apply_n(f, n, x):\n    for _ in range(n):\n        x = f(x)\n    return x\n",
        ["assert apply_n(lambda v: v * 2, 3, 1) == 8", "assert apply_n(str.upper, 1, 'ab') == 'AB'"],
        "def apply_n(f, n, x):\n    return f(x)\n",
    ),
    "test passes key functions": (
        "def sort_by(items, key):\n    return sorted(items, key=key)\n",
        [
            "assert sort_by(['ccc', 'a', 'bb'], len) == ['a', 'bb', 'ccc']",
            "assert sort_by([(1, 'b'), (2, 'a')], key=lambda p: p[1]) == [(2, 'a'), (1, 'b')]",
        ],
        "def sort_by(items, key):\n    return sorted(items)\n",
    ),
    "candidate returns a closure": (
        "def make_adder(n):\n    def add(x):\n        return x + n\n    return add\n",
        ["add5 = make_adder(5)\nassert add5(3) == 8 and add5(-5) == 0", "assert callable(make_adder(1))"],
        "def make_adder(n):\n    return lambda x: x\n",
    ),
    "decorator around a test function": (
        "import functools\ndef memoize(f):\n    cache = {}\n    @functools.wraps(f)\n    def wrapper(*args):\n"
        "        if args not in cache:\n            cache[args] = f(*args)\n        return cache[args]\n    return wrapper\n",
        [
            "calls = []\ndef square(x):\n    calls.append(x)\n    return x * x\nsq = memoize(square)\n"
            "assert sq(3) == 9 and sq(3) == 9 and sq(4) == 16\nassert calls == [3, 4]"
        ],
        "def memoize(f):\n    return f\n",
    ),
    "callbacks stored and called later": (
        "class EventBus:\n    def __init__(self):\n        self.handlers = {}\n    def on(self, name, fn):\n"
        "        self.handlers.setdefault(name, []).append(fn)\n    def emit(self, name, *args):\n"
        "        return [fn(*args) for fn in self.handlers.get(name, [])]\n",
        [
            "seen = []\nbus = EventBus()\nbus.on('x', lambda v: seen.append(v) or v + 1)\nbus.on('x', lambda v: v * 10)\n"
            "assert bus.emit('x', 2) == [3, 20]\nassert seen == [2]\nassert bus.emit('y') == []"
        ],
        None,
    ),
    "compose both ways": (
        "def compose(*fs):\n    def run(x):\n        for f in reversed(fs):\n            x = f(x)\n        return x\n    return run\n",
        ["h = compose(lambda x: x + 1, lambda x: x * 2)\nassert h(5) == 11", "assert compose()(7) == 7"],
        "def compose(*fs):\n    return fs[0] if fs else (lambda x: x)\n",
    ),
    # --- import solution --------------------------------------------------------------------------------
    "import solution": (
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        "import solution\n\ndef test_gcd():\n    assert solution.gcd(12, 18) == 6\n\n"
        "def test_from_import():\n    from solution import gcd\n    assert gcd(7, 5) == 1\n",
        "def gcd(a, b):\n    return 6\n",
    ),
    "from solution import *": (
        "MOD = 10 ** 9 + 7\ndef power(b, e):\n    return pow(b, e, MOD)\nclass Box:\n    def __init__(self, v):\n"
        "        self.v = v\n",
        [
            "from solution import *\nassert power(2, 10) == 1024 and Box(3).v == 3",
            "import solution\nassert solution.MOD == 10 ** 9 + 7",
        ],
        None,
    ),
    # --- exceptions, iterators, in-place ------------------------------------------------------------------
    "custom exception and generator": (
        "class InsufficientFunds(Exception):\n    pass\ndef withdraw(balance, x):\n    if x > balance:\n"
        "        raise InsufficientFunds('no')\n    return balance - x\ndef countdown(n):\n    while n > 0:\n"
        "        yield n\n        n -= 1\n",
        [
            "assert withdraw(5, 3) == 2",
            "try:\n    withdraw(1, 3)\n    raise AssertionError('no error')\nexcept Exception as e:\n    assert 'InsufficientFunds' in str(e)",
            "assert list(countdown(3)) == [3, 2, 1]",
        ],
        None,
    ),
    "in-place on the tests' objects": (
        "def reverse_in_place(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n"
        "    return prev\n",
        {
            "test": "def check(candidate):\n    nodes = [ListNode(i) for i in range(3)]\n    nodes[0].next = nodes[1]\n"
            "    nodes[1].next = nodes[2]\n    new = candidate(nodes[0])\n    assert new is nodes[2]\n"
            "    assert nodes[2].next is nodes[1] and nodes[0].next is None\n",
            "entry_point": "reverse_in_place",
            "prelude": LISTNODE,
        },
        "def reverse_in_place(head):\n    return head\n",
    ),
}

SHAPES["callbacks with state before the call back"] = (
    "class Counter:\n    def __init__(self):\n        self.n = 0\n        self.log = []\n    def each(self, xs, fn):\n"
    "        for x in xs:\n            self.n += 1\n            self.log.append(fn(x))\n        return self.n\n",
    [
        "c = Counter()\nassert c.each([1, 2, 3], lambda v: v * v) == 3\nassert c.log == [1, 4, 9] and c.n == 3\n"
        "assert c.each([4], str) == 4 and c.log[-1] == '4'"
    ],
    "class Counter:\n    def __init__(self):\n        self.n = 0\n        self.log = []\n    def each(self, xs, fn):\n"
    "        self.log = [fn(x) for x in xs]\n        return len(xs)\n",
)
