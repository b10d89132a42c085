"""The shop: MCP-v0's catalog, and the MCP server that serves it (the SDK's ``MCPServer``, FastMCP's heir).

Run it as ``python -m toolgym.envs.mcp.shop`` (stdio) or ``python -m toolgym.envs.mcp.shop --http --port
8765`` (streamable HTTP at ``http://127.0.0.1:8765/mcp``). The catalog is fixed data, so the env's tasks and
answers are computed from this module without asking the server.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Product:
    name: str
    category: str
    price_cents: int
    stock: int


_ROWS = """\
apple,fruit,45,120
banana,fruit,30,200
cherry,fruit,610,14
mango,fruit,185,33
pear,fruit,70,0
kiwi,fruit,55,64
bread,bakery,320,25
bagel,bakery,125,40
croissant,bakery,190,18
muffin,bakery,240,0
milk,dairy,135,80
butter,dairy,410,22
yogurt,dairy,95,57
cheese,dairy,735,9
eggs,dairy,390,30
pasta,pantry,210,75
rice,pantry,280,60
flour,pantry,165,44
sugar,pantry,150,38
olive oil,pantry,899,12
coffee,drinks,1050,16
tea,drinks,475,27
juice,drinks,350,0
water,drinks,60,300
soap,household,225,50
sponge,household,80,90
candle,household,560,11
batteries,household,799,20
"""
CATALOG: dict[str, Product] = {}
for _row in _ROWS.splitlines():
    _name, _cat, _price, _stock = _row.split(",")
    CATALOG[_name] = Product(_name, _cat, int(_price), int(_stock))
CATEGORIES = tuple(sorted({p.category for p in CATALOG.values()}))


def dollars(cents: int) -> str:
    """>>> dollars(1050), dollars(45)
    ('10.50', '0.45')"""
    return f"{cents // 100}.{cents % 100:02d}"


def _find(product: str) -> Product:
    key = product.strip().lower()
    if key not in CATALOG:
        raise ValueError(f"no product named {product!r}; search_products lists the products")
    return CATALOG[key]


def search_products(query: str) -> str:
    """Products whose name or category contains the query, one per line as "name (category)"."""
    q = query.strip().lower()
    found = [f"{p.name} ({p.category})" for p in CATALOG.values() if q in p.name or q in p.category]
    return "\n".join(found) if found else "no products match"


def get_price(product: str) -> str:
    """The unit price of a product in dollars."""
    return dollars(_find(product).price_cents)


def get_stock(product: str) -> int:
    """How many units of a product are in stock."""
    return _find(product).stock


def build_server() -> object:
    """The shop as an MCP server (tool errors become ``is_error`` results)."""
    import functools
    from collections.abc import Callable
    from typing import Any

    from toolgym.optional import require

    MCPServer = require("mcp.server.mcpserver", why="the shop runs as an MCP server").MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    def reported(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def tool(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ValueError as exc:  # the SDK shows a ToolError's message to the client, hides others
                raise ToolError(str(exc)) from exc

        return tool

    server = MCPServer("toolgym-shop", instructions="A small grocery shop: search, prices, stock.")
    for fn in (search_products, get_price, get_stock):
        server.tool()(reported(fn))
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the toolgym shop MCP server")
    parser.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = build_server()
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)  # type: ignore[attr-defined]
    else:
        server.run("stdio")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
