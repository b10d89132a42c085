"""``toolgym list``, ``toolgym play ID``, ``toolgym check [ID…]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toolgym.cli.arguments import json_object
from toolgym.cli.ids import require_ids
from toolgym.cli.table import format_table


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("list", help="list the registered environments")
    p.set_defaults(func=cmd_list)
    p = subparsers.add_parser("play", help="play an environment in the terminal")
    p.add_argument("env_id")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kwargs", type=json_object, default={}, help="JSON of keyword arguments for gym.make")
    p.set_defaults(func=cmd_play)
    p = subparsers.add_parser("check", help="run the env checks (gymnasium, determinism, garbage, expert)")
    p.add_argument("env_ids", nargs="*", help="ids to check (default: all)")
    p.add_argument("--garbage", type=int, default=200, help="random garbage actions per env")
    p.add_argument("--expert-episodes", type=int, default=20)
    p.set_defaults(func=cmd_check)


def cmd_list(args: argparse.Namespace) -> int:
    import toolgym  # noqa: F401  (registers the ids)
    from toolgym.envs import list_envs

    rows = [[e.id, e.family, ", ".join(e.tools), e.origin, e.description] for e in list_envs()]
    print(format_table(["id", "family", "tools", "origin", "description"], rows))
    return 0


def _show(messages: list[dict[str, Any]]) -> None:
    for m in messages:
        header = f"[{m['role']}" + (f" {m['name']}" if m.get("name") else "") + "]"
        print(f"{header} {m.get('content') or ''}")


def cmd_play(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import toolgym  # noqa: F401
    from toolgym.envs.base import tool_env
    from toolgym.errors import ConfigError

    require_ids([args.env_id])
    kwargs = args.kwargs
    try:
        env = gym.make(args.env_id, **kwargs)
    except gym.error.DependencyNotInstalled:
        raise
    except gym.error.Error as exc:
        raise ConfigError(f"{exc} (see `toolgym list`)") from exc
    obs, info = env.reset(seed=args.seed)
    print("Tools:")
    for spec in info["tools"]:
        fn = spec["function"]
        print(f"  {fn['name']}: {fn['description']}\n    parameters: {json.dumps(fn['parameters'])}")
    print("Type your reply as the model would (one line; ':expert' shows the expert's move, ':quit' ends).\n")
    _show(obs)
    total = 0.0
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            break
        if line.strip() == ":quit":
            break
        if line.strip() == ":expert":
            print(tool_env(env).expert_action())
            continue
        obs, reward, terminated, truncated, info = env.step(line)
        total += float(reward)
        _show(obs)
        parts = ", ".join(f"{k}={v:g}" for k, v in info["reward_components"].items() if v)
        print(
            f"  (reward {reward:g}{'; ' + parts if parts else ''}{'; invalid action' if info['invalid_action'] else ''})"
        )
        if terminated or truncated:
            why = "solved" if info.get("success") else info.get("truncation", "ended")
            print(f"Episode over: {why}. Total reward {total:g}.")
            break
    env.close()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import toolgym  # noqa: F401
    from toolgym.envs import ENVS
    from toolgym.envs.checks import check

    ids = args.env_ids or list(ENVS)
    require_ids(ids)
    rows = []
    failed = False
    skipped = 0
    for env_id in ids:
        report = check(env_id, args.garbage, args.expert_episodes)
        if report.skipped and not args.env_ids:  # every id: one missing extra must not fail the rest
            print(f"{env_id}: skipped, {report.skipped}", file=sys.stderr)
            skipped += 1
            continue
        failed |= not report.ok
        marks = [
            "ok" if report.passed.get(k) else "-" if report.skipped else "FAIL"
            for k in ("gymnasium", "determinism", "garbage", "fork", "expert")
        ]
        if report.skipped:  # named on the command line: a missing package fails it, in one column
            marks[0] = "NOT INSTALLED"
        rows.append(
            [
                env_id,
                *marks,
                f"{report.expert_success:.2f} (≥{report.declared_success:.2f})",
                f"{report.seconds:.1f}s",
            ]
        )
        for name, err in report.errors.items():
            print(f"{env_id} {name}: {err}", file=sys.stderr)
    print(
        format_table(
            ["id", "gymnasium", "determinism", "garbage", "fork", "expert", "expert success", "time"], rows
        )
    )
    if skipped:
        print(f"{skipped} id(s) skipped: an optional package they need is not installed (see above)")
    return 1 if failed else 0
