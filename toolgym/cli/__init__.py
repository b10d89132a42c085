"""The ``toolgym`` command. Each group of subcommands lives in its own module with ``register(subparsers)``;
a module whose optional dependencies are missing still registers, and says what to install when run."""

from __future__ import annotations

import argparse
import importlib
import sys

from toolgym.errors import ToolgymError

COMMAND_MODULES = (
    "toolgym.cli.env_commands",  # list, play, check
    "toolgym.cli.sandbox",  # sandbox build | doctor
    "toolgym.cli.reward_commands",  # serve-reward
    "toolgym.cli.agent_commands",  # eval, serve
    "toolgym.cli.train",  # train
    "toolgym.cli.sft",  # sft
    "toolgym.cli.dpo",  # dpo
    "toolgym.cli.search",  # serve-retriever, search-index
    "toolgym.cli.interop",  # serve-env, view
    "toolgym.cli.hub",  # new, info
    "toolgym.cli.judge_commands",  # judge-calibrate
    "toolgym.cli.reverify",  # reverify
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolgym",
        description="Environments, sandboxes, rewards and a trainer for multi-turn, tool-using LLM agents.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command group is not part of this build
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    from toolgym.cli.train import bind_word_switches

    args = parser.parse_args(bind_word_switches(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ToolgymError as exc:
        print(f"toolgym {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
