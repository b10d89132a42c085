"""``toolgym dpo``: preference optimisation (DPO) on a JSONL of {messages, tools, chosen, rejected} pairs.

Every field of ``DPOConfig`` (toolgym.trainers.dpo) is a flag (``--data``, ``--beta``, ``--model``, ``--steps``,
…); a YAML file (``--config``) gives the same keys (``algorithm: dpo`` is accepted) and flags win. The
reference is the model as loaded. The run folder's ``model/`` is a plain transformers folder.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolgym.optional import require


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dpo",
        help="DPO on preference pairs (a frozen reference, beta, the sigmoid loss)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--config", help="YAML file of config keys (flags given here override it)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    from toolgym.cli.train import add_config_flags, config_fields

    try:
        from toolgym.trainers.dpo import DPOConfig

        fields = config_fields(DPOConfig)
    except ImportError:  # a part of the trainer missing: the command still registers and says so when run
        fields = {}
    add_config_flags(p, fields)
    p.set_defaults(func=cmd_dpo)


def resolve(args: argparse.Namespace) -> Any:
    from toolgym.errors import ConfigError
    from toolgym.trainers.config import load_yaml
    from toolgym.trainers.dpo import DPOConfig

    data: dict[str, Any] = load_yaml(args.config) if args.config else {}
    if data.pop("algorithm", "dpo") != "dpo":
        raise ConfigError("this config is not for DPO (algorithm is not dpo)")
    data.update(
        {k: v for k, v in vars(args).items() if k not in ("config", "print_config", "func", "command")}
    )
    return DPOConfig.from_dict(data)


def cmd_dpo(args: argparse.Namespace) -> int:
    require("torch", why="toolgym dpo needs torch and transformers")
    require("transformers", why="toolgym dpo needs torch and transformers")
    cfg = resolve(args)
    if args.print_config:
        print(json.dumps({"algorithm": "dpo", **cfg.to_dict()}, indent=2))
        return 0
    from toolgym.trainers.dpo import train

    summary = train(cfg)
    last = summary["last"]
    print(
        f"DPO: {summary['pairs']} pairs, {summary['steps']} steps; last loss {last['dpo/loss']:.4f}, "
        f"margin {last['dpo/margin']:.3f}, accuracy {last['dpo/accuracy']:.2f}; model: {cfg.output_dir}/model"
    )
    return 0
