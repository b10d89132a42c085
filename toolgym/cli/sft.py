"""``toolgym sft``: supervised warm start on the scripted experts' episodes or a JSONL of chat messages.

Every field of ``SFTConfig`` (toolgym.trainers.sft) is a flag (``--env-ids``, ``--episodes``, ``--data``,
``--lora-r``, ``--steps``, ``--eval-env-kwargs``, …); a YAML file (``--config``) gives the same keys and
flags win. The run folder's ``model/`` is what ``toolgym train --init RUN_DIR`` starts from.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolgym.optional import require


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sft",
        help="supervised warm start on expert episodes or chat JSONL (then: toolgym train --init RUN_DIR)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--config", help="YAML file of config keys (flags given here override it)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    from toolgym.cli.train import add_config_flags, config_fields

    try:
        from toolgym.trainers.sft import SFTConfig

        fields = config_fields(SFTConfig)
    except ImportError:  # a part of the trainer missing: the command still registers and says so when run
        fields = {}
    add_config_flags(p, fields)
    p.set_defaults(func=cmd_sft)


def resolve(args: argparse.Namespace) -> Any:
    """The SFTConfig: YAML keys, then flags."""
    from toolgym.trainers.config import load_yaml
    from toolgym.trainers.sft import SFTConfig

    data: dict[str, Any] = load_yaml(args.config) if args.config else {}
    data.pop("algorithm", None)
    data.update(
        {k: v for k, v in vars(args).items() if k not in ("config", "print_config", "func", "command")}
    )
    return SFTConfig.from_dict(data)


def cmd_sft(args: argparse.Namespace) -> int:
    require("torch", why="toolgym sft needs torch and transformers")
    require("transformers", why="toolgym sft needs torch and transformers")
    cfg = resolve(args)
    if args.print_config:
        print(json.dumps({"algorithm": "sft", **cfg.to_dict()}, indent=2))
        return 0
    from toolgym.trainers.sft import train

    summary = train(cfg)
    before, after = summary.get("success_before"), summary.get("success_after")
    shown = " -> ".join(f"{x:.2f}" for x in (before, after) if x is not None)
    print(f"held-out success: {shown} ({summary['conversations']} conversations, {summary['steps']} steps)")
    print(
        f"run folder: {cfg.output_dir} (model/, metrics.jsonl, *.png); next: toolgym train --init {cfg.output_dir}"
    )
    return 0
