"""Write the README's env table from the env cards (``toolgym.envs.cards``), between the markers
``<!-- env-table:start -->`` and ``<!-- env-table:end -->``. ``--check`` only compares (exit 1 if stale).

    python scripts/env_table.py          # rewrite the table
    python scripts/env_table.py --check  # what tests/toolgym/test_info.py runs

Static card data only (nothing is played): the class, one instance, the declared expert success. Ids of one
family that differ only by task (``toolgym/MiniWoB-<task>-v0``) share one row, built from one instance.
Only toolgym's own ids are listed (an installed plugin's are not the README's).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- env-table:start -->", "<!-- env-table:end -->"
GROUP_MIN = 3  # this many ids named PREFIX-<task>-vN make one row
_ID = re.compile(r"^toolgym/(?P<prefix>[A-Za-z0-9]+)-(?P<task>.+)-v(?P<version>\d+)$")


def _rate(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if low == high else f"{low:.2f}–{high:.2f}"


def _tools(card_tools: list[tuple[str, str]]) -> str:
    return ", ".join(f"`{name}`" for name, _ in card_tools) or "none (commands)"


def _knobs(knobs: list[tuple[str, str]]) -> str:
    return ", ".join(f"`{name}`" for name, _ in knobs) or "—"


def rows() -> list[list[str]]:
    import toolgym  # noqa: F401  (registers the ids)
    from toolgym.envs import ENVS, ORIGINS, _load
    from toolgym.envs.cards import build_card

    ids = [i for i in ENVS if ORIGINS.get(i) == "toolgym"]
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for env_id in ids:
        match = _ID.match(env_id)
        if match:
            groups[(match["prefix"], match["version"])].append(env_id)
    grouped = {i: key for key, members in groups.items() if len(members) >= GROUP_MIN for i in members}
    out: list[list[str]] = []
    done: set[tuple[str, str]] = set()
    for env_id in ids:
        key = grouped.get(env_id)
        if key is None:
            card = build_card(env_id)
            out.append(
                [
                    f"`{env_id}`",
                    card.family,
                    _tools(card.tools),
                    card.summary,
                    _knobs(card.knobs),
                    f"{card.expert_success:.2f}",
                ]
            )
            continue
        if key in done:
            continue
        done.add(key)
        members = groups[key]
        card = build_card(members[0])  # one instance: the members differ only by their task
        base = _load(ENVS[members[0]]).__mro__[1]  # the family's class; its docstring says what all share
        rates = [float(_load(ENVS[m]).expert_success_rate) for m in members]
        summary = (base.__doc__ or "").strip().splitlines()[0].strip()
        out.append(
            [
                f"`toolgym/{key[0]}-<task>-v{key[1]}`",
                card.family,
                _tools(card.tools),
                f"{summary} One id per task ({len(members)}).",
                _knobs(card.knobs),
                _rate(rates),
            ]
        )
    return out


def table() -> str:
    header = ["id", "family", "tools", "what", "knobs (own)", "expert success"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows()]
    lines += [
        "",
        "Generated from the env cards by `python scripts/env_table.py`; `toolgym info ID` prints one card "
        "(tools, reward components, action formats, knobs with defaults, expert success, an example episode). "
        "reasoning-gym's and GEM's envs, and `toolgym new NAME` for an env package of your own: "
        "`docs/peers.md`.",
    ]
    return "\n".join(lines)


def render(readme: str, new_table: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md has no {START} … {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{new_table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the README's table is not current")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    wanted = render(current, table())
    if args.check:
        if wanted != current:
            print("README.md's env table is stale: run python scripts/env_table.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
