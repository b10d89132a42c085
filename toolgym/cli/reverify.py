"""``toolgym reverify RUN_DIR --reward NAME``: rescore a run's saved rollouts with another reward function
(or another version of one) and print what changed; no model is loaded (``toolgym.trainers.reverify``)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    from toolgym.cli.judge_commands import add_judge_flags

    p = subparsers.add_parser(
        "reverify",
        help="rescore a run's saved rollouts (save_rollouts) with another reward and print the flips",
        description="Each --reward is NAME[=WEIGHT]: a function of toolgym.rewards (numeric_match, "
        "exact_match, math_match, …), module:attribute, or `judge` (a judge model: --judge-url). Several "
        "make a Rubric. Episodes that ended with an answer are rescored; the stored value is the env's "
        "reward for that answer (--stored episode: the whole episode's reward).",
    )
    p.add_argument("run_dir", help="a training run folder (holding rollouts/) or a rollouts folder")
    p.add_argument("--reward", action="append", required=True, metavar="NAME[=WEIGHT]", help="repeatable")
    p.add_argument("--stored", choices=("final_step", "episode"), default="final_step")
    p.add_argument("--threshold", type=float, default=0.5, help="pass/fail boundary of a flip")
    p.add_argument("--steps", type=int, nargs="+", default=None, help="only these saved steps")
    p.add_argument("--folder", default="rollouts", help="rollouts (training) or evals (held-out)")
    p.add_argument("--limit", type=int, default=20, help="rows of each table")
    p.add_argument("--json", dest="json_out", default=None, help="also write the report to this file")
    add_judge_flags(p)
    p.set_defaults(func=cmd_reverify)


def cmd_reverify(args: argparse.Namespace) -> int:
    from toolgym.cli.judge_commands import build_judge
    from toolgym.cli.reward_commands import load_reward, reward_specs
    from toolgym.rewards.rubric import Rubric
    from toolgym.trainers.reverify import format_report, reverify

    funcs, weights = reward_specs(
        args.reward, lambda n: build_judge(args) if n == "judge" else load_reward(n)
    )
    reward = next(iter(funcs.values())) if len(funcs) == 1 and weights == [1.0] else Rubric(funcs, weights)
    steps = set(args.steps) if args.steps else None
    report = reverify(
        args.run_dir, reward, stored=args.stored, threshold=args.threshold, folder=args.folder, steps=steps
    )
    print(format_report(report, args.threshold, args.limit))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(report.as_dict(), fh, indent=2, default=str)
    return 0
