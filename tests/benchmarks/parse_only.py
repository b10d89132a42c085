"""Runs scripts' real argument parsers without running the scripts (tests/benchmarks/test_job_files.py starts it
in a subprocess: the scripts import torch and mutate global state, which the test process should not share).

stdin: a JSON list of requests, each ``{"mode": M, "script": S, "argv": [...]}`` with S a script path (relative
to the working directory) or ``"toolgym"`` (the CLI, ``toolgym.cli.main``), and M one of
  parse    the parser accepts argv; for ``toolgym train|sft|dpo`` the config (``--config`` YAML, then the
           flags) also resolves, as the command would resolve it before training;
  options  every option string of the script's parser and its subparsers (argv is not parsed but names the
           subcommand whose options are wanted, e.g. ``["train"]``);
  execute  run the script for real (cheap generators only, e.g. ``papers/run.py configs``).
stdout: a JSON list of ``{"ok": bool, "error": str, "options": [...]}``, one per request, in order.

``ArgumentParser.parse_args`` / ``parse_known_args`` are patched: the outermost call parses for real (so the
script's own parser, types and choices judge argv) and then raises ``Parsed``, a BaseException that no
``except Exception`` of the script swallows, before any work starts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from collections.abc import Callable, Iterator
from typing import Any


class Parsed(BaseException):
    def __init__(self, parser: argparse.ArgumentParser, result: Any) -> None:
        super().__init__("parsed")
        self.parser = parser
        self.result = result


def subparser(parser: argparse.ArgumentParser, names: list[str]) -> argparse.ArgumentParser:
    """The parser of the subcommand path ``names`` (e.g. ``["train"]``)."""
    for name in names:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or name not in subs[0].choices:
            raise KeyError(f"no subcommand {name!r}")
        parser = subs[0].choices[name]
    return parser


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands' parsers."""
    out = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= option_strings(sub)
    return out


@contextlib.contextmanager
def stop_after_parse(mode: str) -> Iterator[None]:
    originals = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    depth = [0]  # parse_args calls parse_known_args, and so does every subparser: only the outermost stops

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def patched(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
            if mode == "options" and depth[0] == 0:
                raise Parsed(self, None)
            depth[0] += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise Parsed(self, result)
            return result

        return patched

    for name, original in originals.items():
        setattr(argparse.ArgumentParser, name, wrap(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)


def resolve_toolgym(namespace: argparse.Namespace) -> None:
    """What ``toolgym train|sft|dpo`` resolves before training: the YAML's keys, then the flags."""
    command = getattr(namespace, "command", None)
    config = getattr(namespace, "config", None)
    if config and not os.path.isfile(config):
        raise FileNotFoundError(f"--config {config}: no such file")
    if command == "train":
        from toolgym.cli.train import resolve

        resolve(namespace)
    elif command in ("sft", "dpo"):
        module = __import__(f"toolgym.cli.{command}", fromlist=["resolve"])
        module.resolve(namespace)


def entry(script: str, argv: list[str]) -> Callable[[], Any]:
    if script == "toolgym":
        from toolgym.cli import main

        return lambda: main(argv)

    def run() -> Any:
        sys.argv = [script, *argv]  # (options mode stops before parsing: argv names a subcommand there)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` would
        try:
            return runpy.run_path(script, run_name="__main__")
        finally:
            sys.path.pop(0)

    return run


def one(request: dict[str, Any]) -> dict[str, Any]:
    mode, script, argv = request["mode"], request["script"], request["argv"]
    if script != "toolgym" and not os.path.isfile(script):
        return {"ok": False, "error": f"{script}: no such script"}
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            if mode == "execute":
                entry(script, argv)()
                return {"ok": True, "error": ""}
            with stop_after_parse(mode):
                entry(script, argv)()
        return {"ok": False, "error": "the script returned without parsing its arguments"}
    except Parsed as done:
        if mode == "options":
            try:
                options = option_strings(subparser(done.parser, argv))
            except KeyError as exc:
                return {"ok": False, "error": str(exc)}
            return {"ok": True, "error": "", "options": sorted(options)}
        if script == "toolgym":
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                    resolve_toolgym(done.result)
            except Exception as exc:  # a config that does not load or validate
                return {"ok": False, "error": f"config: {type(exc).__name__}: {exc}"}
        return {"ok": True, "error": ""}
    except SystemExit as exc:
        if mode == "execute" and exc.code in (0, None):
            return {"ok": True, "error": ""}
        return {"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip()[-1500:]}"}
    except BaseException as exc:  # an import error, a crash before parsing
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}


def main() -> None:
    requests = json.load(sys.stdin)
    out = [one(r) for r in requests]
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
