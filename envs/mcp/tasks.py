"""MCP-v0's tasks: shopping questions answered with the shop server's tools.

Each task carries its answer and the expert's plan (turns of tool calls), computed from the catalog in
``shop.py``, the same data the server serves.
"""

from __future__ import annotations

import hashlib
from typing import Any

from toolgym.envs.base import Task
from toolgym.envs.mcp.shop import CATALOG, CATEGORIES, dollars

KINDS = ("total", "cheapest", "stock", "category")
_NAMES = sorted(CATALOG)


def _pick(rng: Any, items: list[str], k: int) -> list[str]:
    return [items[int(i)] for i in rng.choice(len(items), size=k, replace=False)]


def _price_calls(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": "get_price", "arguments": {"product": n}} for n in names]


def make_task(rng: Any, kinds: tuple[str, ...]) -> Task:
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "total":
        a, b = _pick(rng, _NAMES, 2)
        qa, qb = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        cents = qa * CATALOG[a].price_cents + qb * CATALOG[b].price_cents
        prompt = f"What do {qa} × {a} and {qb} × {b} cost together, in dollars?"
        answer, plan = dollars(cents), [_price_calls([a, b])]
    elif kind == "cheapest":
        category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        names = _pick(rng, [n for n in _NAMES if CATALOG[n].category == category], 3)
        prompt = (
            f"Which of these costs the least per unit: {', '.join(names)}? Answer with the product's name."
        )
        answer = min(names, key=lambda n: (CATALOG[n].price_cents, n))
        plan = [_price_calls(names)]
    elif kind == "stock":
        (name,) = _pick(rng, _NAMES, 1)
        want = int(rng.integers(1, 40))
        prompt = f"Could I buy {want} × {name} from the shop's stock right now? Answer yes or no."
        answer = "yes" if CATALOG[name].stock >= want else "no"
        plan = [[{"name": "get_stock", "arguments": {"product": name}}]]
    elif kind == "category":
        category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        limit = int(rng.choice([100, 200, 300, 500]))
        names = [n for n in _NAMES if CATALOG[n].category == category]
        prompt = (
            f"How many products of the shop's {category} category cost less than ${dollars(limit)} each? "
            "Answer with a number."
        )
        answer = str(sum(CATALOG[n].price_cents < limit for n in names))
        plan = [[{"name": "search_products", "arguments": {"query": category}}], _price_calls(names)]
    else:  # pragma: no cover (kinds are checked by the env)
        raise ValueError(kind)
    digest = hashlib.sha1(prompt.encode()).hexdigest()[:10]
    return Task(f"mcp-{kind}-{digest}", prompt, answer, {"kind": kind, "plan": plan})
