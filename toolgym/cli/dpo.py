"""``toolgym dpo``: preference optimisation (DPO) on a JSONL of {messages, tools, chosen, rejected} pairs.

Every field of ``DPOConfig`` (toolgym.trainers.dpo) is a flag (``--data``, ``--beta``, ``--model``, ``--steps``,
…); a YAML file (``--config``) gives the same keys (``algorithm: dpo`` is accepted) and flags win. The
reference is the model as loaded. The run folder's ``model/`` is a plain transformers folder.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from toolgym.cli.train import add_config_command

    add_config_command(
        subparsers,
        "dpo",
        help="DPO on preference pairs (a frozen reference, beta, the sigmoid loss)",
        description=__doc__.splitlines()[0] if __doc__ else None,
        config_class=_config_class,
        func=cmd_dpo,
    )


def _config_class() -> type:
    from toolgym.trainers.dpo import DPOConfig

    return DPOConfig


def resolve(args: argparse.Namespace) -> Any:
    from toolgym.cli.train import config_from_args

    return config_from_args(args, _config_class(), algorithm="dpo")


def cmd_dpo(args: argparse.Namespace) -> int:
    from toolgym.cli.train import config_or_print

    cfg = config_or_print(args, "dpo", resolve)
    if cfg is None:
        return 0
    from toolgym.trainers.dpo import train

    summary = train(cfg)
    last = summary["last"]
    print(
        f"DPO: {summary['pairs']} pairs, {summary['steps']} steps; last loss {last['dpo/loss']:.4f}, "
        f"margin {last['dpo/margin']:.3f}, accuracy {last['dpo/accuracy']:.2f}; model: {cfg.output_dir}/model"
    )
    return 0
