"""Write ``catalog.tsv`` and the reasoning-gym table of docs/peers.md: run toolgym's env checks over every
dataset in the installed reasoning-gym's registry (a short check: fewer garbage actions and expert
episodes than ``toolgym check``), and record what passed and what failed, with the first error.

    python -m toolgym.envs.reasoning_gym.catalog              # all datasets; writes both files
    python -m toolgym.envs.reasoning_gym.catalog chain_sum gcd --dry-run

Each task gets ``--timeout`` seconds (SIGALRM, so one process; a generator that hangs is a failure).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from toolgym.envs.reasoning_gym import CATALOG_COLUMNS, CATALOG_FILE, WORKING, env_id, read_catalog

DOCS = Path(__file__).resolve().parents[2] / "docs" / "peers.md"
START, END = "<!-- reasoning-gym-table:start -->", "<!-- reasoning-gym-table:end -->"
CHECKS = ("gymnasium", "determinism", "garbage", "fork", "expert")


class _Timeout(BaseException):  # not Exception: the checks catch those as failures
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def _has_gold(task: str, items: int = 5) -> bool:
    """Whether the dataset's items carry a gold answer (some have several valid ones and give none)."""
    from toolgym.envs.reasoning_gym.tasks import dataset

    data = dataset(task)
    return any(data[i].get("answer") is not None for i in range(min(items, len(data))))


def check_task(task: str, garbage: int, expert_episodes: int, timeout: int) -> dict[str, str]:
    """One catalog row: the task's checks under the id it gets (registered here if not yet)."""
    import gymnasium as gym

    from toolgym.envs.checks import check
    from toolgym.envs.reasoning_gym.env import task_class
    from toolgym.envs.reasoning_gym.tasks import describe

    category, description = describe(task)
    name = env_id(task)
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    has_gold = True
    try:
        has_gold = _has_gold(task)
        gym.registry.pop(name, None)  # the shipped catalog's class may declare another expert rate
        gym.register(name, task_class(task, has_gold=has_gold), disable_env_checker=True)
        report = check(name, garbage_actions=garbage, expert_episodes=expert_episodes)
        failed = [c for c in CHECKS if not report.passed.get(c)]
        status = ("ok" if has_gold else "ok-no-gold") if not failed else "fail:" + ",".join(failed)
        note = "; ".join(f"{k}: {v}" for k, v in report.errors.items())
    except _Timeout:
        status, note = "fail:timeout", f"the checks took over {timeout} s"
    except Exception as exc:  # a row to record, not a crash of the whole run
        status, note = "fail:error", f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
    seconds = time.perf_counter() - start
    note = re.sub(r"\s+", " ", note)[:200]
    return {
        "task": task,
        "category": category,
        "status": status,
        "seconds": f"{seconds:.1f}",
        "description": re.sub(r"\s+", " ", description),
        "note": note,
        "full": "",
    }


def write_catalog(rows: list[dict[str, str]], version: str) -> None:
    lines = [
        f"# reasoning-gym {version}: toolgym's env checks per dataset "
        "(written by python -m toolgym.envs.reasoning_gym.catalog)",
        "\t".join(CATALOG_COLUMNS),
    ]
    lines += ["\t".join(row[c] for c in CATALOG_COLUMNS) for row in rows]
    CATALOG_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")


def table(rows: list[dict[str, str]], version: str) -> str:
    ok = sum(r["status"] in WORKING for r in rows)
    no_gold = sum(r["status"] == "ok-no-gold" for r in rows)
    out = [
        f"reasoning-gym {version}: **{ok} of {len(rows)}** datasets pass the checks and have an id "
        f"`toolgym/ReasoningGym-<task>-v0` ({no_gold} of them give no gold answer, so they have no expert "
        "and declare an expert success of 0); every dataset (and a newer version's) also plays through "
        "`toolgym/ReasoningGym-v0` with `task=NAME` (and `config=` where it needs one). "
        f"{sum(r.get('full') == 'pass' for r in rows)} pass `toolgym check`'s own settings (last column).",
        "",
        "| task | category | short check | seconds | what | why it fails | `toolgym check` (200/20) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = {"ok": "pass", "ok-no-gold": "pass (no gold: no expert)"}.get(
            r["status"], r["status"].replace("fail:", "FAIL: ")
        )
        note = r["note"].replace("|", "\\|")
        full = (r.get("full") or "not run").replace("|", "\\|").replace("fail:", "FAIL: ")
        out.append(
            f"| `{r['task']}` | {r['category']} | {mark} | {r['seconds']} | {r['description']} | {note} "
            f"| {full} |"
        )
    return "\n".join(out)


def write_docs(rows: list[dict[str, str]], version: str) -> None:
    text = DOCS.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{DOCS} has no {START} … {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(f"{head}{START}\n{table(rows, version)}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tasks", nargs="*", help="datasets to check (default: the whole registry)")
    parser.add_argument("--garbage", type=int, default=30)
    parser.add_argument("--expert-episodes", type=int, default=10)
    parser.add_argument("--timeout", type=int, default=120, help="seconds per task")
    parser.add_argument("--dry-run", action="store_true", help="print the rows, write nothing")
    parser.add_argument(
        "--full",
        action="store_true",
        help="run toolgym check's settings (200 garbage actions, 20 expert episodes, 300 s) and record the "
        "result in the 'full' column only (the ids follow the short check's status)",
    )
    args = parser.parse_args(argv)
    if args.full:
        args.garbage, args.expert_episodes, args.timeout = 200, 20, max(args.timeout, 300)

    from importlib.metadata import version as dist_version

    import toolgym  # noqa: F401  (registers the ids)
    from toolgym.envs.reasoning_gym.tasks import registry_names

    version = dist_version("reasoning-gym")  # the module's __version__ lags behind the release
    names = args.tasks or registry_names()
    previous = {r["task"]: r for r in read_catalog()}
    rows = []
    for task in names:
        row = check_task(task, args.garbage, args.expert_episodes, args.timeout)
        print("\t".join(row[c] for c in CATALOG_COLUMNS), flush=True)
        if args.full:  # keep the short check's row; note the full check's outcome
            full = "pass" if row["status"] in WORKING else f"{row['status']} ({row['note'][:80]})"
            row = {**previous.get(task, row), "full": full}
        else:
            row["full"] = previous.get(task, {}).get("full", "")
        rows.append(row)
    if args.dry_run:
        return 0
    if args.tasks:  # a partial run updates those rows and keeps the others
        previous.update({r["task"]: r for r in rows})
        rows = [previous[t] for t in sorted(previous)]
    write_catalog(rows, version)
    write_docs(rows, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
