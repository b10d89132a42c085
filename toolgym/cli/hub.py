"""``toolgym new NAME`` (scaffold a third-party env package) and ``toolgym info ID`` (an env's card)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "new", help="scaffold an env package that plugs into toolgym (entry point, env, tests, card)"
    )
    p.add_argument("name", help="package name, e.g. letter-count (id: letter_count/LetterCount-v0)")
    p.add_argument("--dir", default=None, help="where to write it (default: ./NAME); must be new or empty")
    p.set_defaults(func=cmd_new)
    p = subparsers.add_parser("info", help="print an env's card (tools, rewards, knobs, expert, example)")
    p.add_argument("env_id")
    p.add_argument("--markdown", action="store_true", help="print the card as markdown (a README section)")
    p.add_argument("--no-example", action="store_true", help="skip the example episode (plays nothing)")
    p.add_argument(
        "--measure",
        type=int,
        default=0,
        metavar="N",
        help="measure the expert's success over N episodes instead of showing the declared rate",
    )
    p.set_defaults(func=cmd_info)


def cmd_new(args: argparse.Namespace) -> int:
    from toolgym.scaffold import names, scaffold

    root = scaffold(args.name, args.dir)
    n = names(args.name)
    print(f"wrote {root}/ with {n['id']} ({n['module']}.env:{n['cls']})")
    print(f"next: pip install -e {root} && toolgym list && (cd {root} && pytest)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import toolgym  # noqa: F401  (registers the ids, plugins' too)
    from toolgym.cli.ids import require_ids
    from toolgym.envs.cards import build_card, render_markdown, render_text

    require_ids([args.env_id])
    card = build_card(args.env_id, example=not args.no_example, measure=args.measure)
    print(render_markdown(card) if args.markdown else render_text(card))
    return 0
