"""``toolgym judge-calibrate``: score a labelled set with a judge model and print how far it agrees.

The judge is any OpenAI-compatible chat server: ``toolgym serve --agent hf:NAME``, vLLM, a hosted API."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_judge_flags(p: argparse.ArgumentParser) -> None:
    """The flags that build a judge (shared with ``toolgym reverify --reward judge``)."""
    p.add_argument("--judge-url", default=None, help="the judge's server (default: $TOOLGYM_JUDGE_URL)")
    p.add_argument("--judge-model", default=None, help="model name sent to the judge's server")
    p.add_argument("--rubric", default=None, help="a JSON or YAML file with criteria/scale/task")
    p.add_argument("--concurrency", type=int, default=8, help="judge requests in flight")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per judge request")
    p.add_argument("--retries", type=int, default=2, help="retries of a failed or unreadable request")
    p.add_argument("--cache", default=None, help="a JSONL file of verdicts, read back and appended to")


def build_judge(args: argparse.Namespace, check: Any = None) -> Any:
    from toolgym.rewards.judge import judge

    rubric = None
    if args.rubric:
        from toolgym.trainers.config import load_yaml  # YAML is a superset of JSON

        rubric = load_yaml(args.rubric)
    return judge(
        args.judge_url, model=args.judge_model, rubric=rubric, check=check, concurrency=args.concurrency,
        timeout_s=args.timeout, retries=args.retries, cache=args.cache or True,
    )  # fmt: skip


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "judge-calibrate",
        help="score a labelled set with a judge model and print its agreement with the labels",
        description="Rows are {question, reference, answer, label (1 correct, 0 not)}; the default set is "
        "the shipped one (toolgym/rewards/data/judge_labelled.jsonl, 48 rows). A row passes when the judge's "
        "score is >= --threshold; a failed verdict counts as a disagreement.",
    )
    add_judge_flags(p)
    p.add_argument("--data", default=None, help="a labelled JSONL file (default: the shipped set)")
    p.add_argument("--injection", action="store_true", help="use the shipped injection set instead")
    p.add_argument("--check", default=None, help="a reward capping the judge: NAME or module:attr")
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--json", dest="json_out", default=None, help="also write the numbers to this file")
    p.set_defaults(func=cmd_judge_calibrate)


def cmd_judge_calibrate(args: argparse.Namespace) -> int:
    from toolgym.cli.reward_commands import load_reward
    from toolgym.rewards import judge_calibration as cal

    check = None
    if args.check == "mentions_reference":
        check = cal.mentions_reference
    elif args.check:
        check = load_reward(args.check)
    j = build_judge(args, check)
    path = cal.INJECTION if args.injection else (args.data or cal.LABELLED)
    rows = cal.load_labelled(path)
    result = cal.agreement(rows, cal.grade_rows(j, rows), args.threshold)
    numbers = result.as_dict()
    print(f"{path}: {len(rows)} rows, judge {j.base_url} ({j.model or 'server default'})")
    print(
        f"agreement {numbers['agreement']:.3f}  coverage {numbers['coverage']:.3f}  kappa {numbers['kappa']:.3f}  "
        f"(TP {result.true_pos}, TN {result.true_neg}, FP {result.false_pos}, FN {result.false_neg})"
    )
    for f in result.flips[:20]:
        print(f"  {f['id']}: label {f['label']}, judge {f['value']}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({**numbers, "flips": result.flips}, fh, indent=2)
    return 0
