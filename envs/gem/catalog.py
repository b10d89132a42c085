"""Run toolgym's env checks over every GEM id (where gem-llm is installed) and write the GEM table of
docs/peers.md between its markers. A short check (``--garbage``, ``--expert-episodes``) with a time limit per
id (SIGALRM): Sokoban's puzzle generator takes seconds per reset.

    python -m toolgym.envs.gem.catalog                # every id; rewrites the docs table
    python -m toolgym.envs.gem.catalog --dry-run toolgym/GEM-Sudoku-easy-v0
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from toolgym.envs.gem import ENVS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "peers.md"
START, END = "<!-- gem-table:start -->", "<!-- gem-table:end -->"
CHECKS = ("gymnasium", "determinism", "garbage", "fork", "expert")


class _Timeout(BaseException):  # not Exception: the checks catch those as failures
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def check_id(env_id: str, garbage: int, expert_episodes: int, timeout: int) -> list[str]:
    from toolgym.envs.checks import check

    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        report = check(env_id, garbage_actions=garbage, expert_episodes=expert_episodes)
        failed = [c for c in CHECKS if not report.passed.get(c)]
        status = "pass" if not failed else "FAIL: " + ",".join(failed)
        expert = f"{report.expert_success:.2f} (≥{report.declared_success:.2f})"
        note = next(iter(report.errors.values()), "")
    except _Timeout:
        status, expert, note = "FAIL: timeout", "—", f"the checks took over {timeout} s"
    finally:
        signal.alarm(0)
    note = re.sub(r"\s+", " ", note)[:160].replace("|", "/")
    return [f"`{env_id}`", status, expert, f"{time.perf_counter() - start:.1f}", note]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--garbage", type=int, default=50)
    parser.add_argument("--expert-episodes", type=int, default=10)
    parser.add_argument("--timeout", type=int, default=120)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    import toolgym  # noqa: F401

    rows = []
    for env_id in args.ids or list(ENVS):
        rows.append(check_id(env_id, args.garbage, args.expert_episodes, args.timeout))
        print(" | ".join(rows[-1]), flush=True)
    if args.dry_run:
        return 0
    ok = sum(r[1] == "pass" for r in rows)
    lines = [
        f"gem-llm {version('gem-llm')}: **{ok} of {len(rows)}** ids pass toolgym's checks "
        f"({args.garbage} garbage actions, {args.expert_episodes} expert episodes each).",
        "",
        "| id | checks | expert success (≥ declared) | seconds | first error |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    text = DOCS.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + tail, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
