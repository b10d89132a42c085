"""``toolgym sft``: supervised warm start on the scripted experts' episodes or a JSONL of chat messages.

Every field of ``SFTConfig`` (toolgym.trainers.sft) is a flag (``--env-ids``, ``--episodes``, ``--data``,
``--lora-r``, ``--steps``, ``--eval-env-kwargs``, …); a YAML file (``--config``) gives the same keys and
flags win. The run folder's ``model/`` is what ``toolgym train --init RUN_DIR`` starts from.
``--save-every N`` writes ``RUN_DIR/checkpoint`` every N steps and ``--resume`` continues from it; SIGTERM or
Ctrl-C saves it at the next step boundary and exits with 143 (130 for Ctrl-C): docs/sft.md.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from toolgym.cli.train import add_config_command

    add_config_command(
        subparsers,
        "sft",
        help="supervised warm start on expert episodes or chat JSONL (then: toolgym train --init RUN_DIR)",
        description=__doc__.splitlines()[0] if __doc__ else None,
        config_class=_config_class,
        func=cmd_sft,
    )


def _config_class() -> type:
    from toolgym.trainers.sft import SFTConfig

    return SFTConfig


def resolve(args: argparse.Namespace) -> Any:
    """The SFTConfig: YAML keys, then flags."""
    from toolgym.cli.train import config_from_args

    return config_from_args(args, _config_class())


def cmd_sft(args: argparse.Namespace) -> int:
    from toolgym.cli.train import config_or_print

    cfg = config_or_print(args, "sft", resolve)
    if cfg is None:
        return 0
    from toolgym.trainers.preemption import Preempted
    from toolgym.trainers.sft import train

    try:
        summary = train(cfg)
    except Preempted as stop:  # SIGTERM/SIGINT: the checkpoint is saved (the loop printed where)
        return stop.exit_code
    before, after = summary.get("success_before"), summary.get("success_after")
    shown = " -> ".join(f"{x:.2f}" for x in (before, after) if x is not None)
    print(f"held-out success: {shown} ({summary['conversations']} conversations, {summary['steps']} steps)")
    print(
        f"run folder: {cfg.output_dir} (model/, metrics.jsonl, *.png); next: toolgym train --init {cfg.output_dir}"
    )
    return 0
