"""``toolgym train``: GRPO or PPO on toolgym envs, from flags or a YAML config (flags win).

Every field of ``GRPOConfig`` / ``PPOConfig`` (toolgym.trainers) is a flag: ``--env-ids``, ``--model``,
``--branching``, ``--estimator``, ``--budget``, ``--steps``, … (``toolgym train --help`` lists them with
their help). ``--init RUN_DIR`` starts from the model a ``toolgym sft`` run wrote (docs/sft.md). Torch and
transformers load only when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from toolgym.errors import ConfigError

ALGORITHMS = ("grpo", "ppo")


def _config_classes() -> dict[str, Any]:
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.ppo import PPOConfig

    return {"grpo": GRPOConfig, "ppo": PPOConfig}


def _fields() -> dict[str, tuple[str, Any, str, Any]]:
    """Flags over both configs (GRPO's default where both have one)."""
    classes = _config_classes()
    return config_fields(classes["grpo"], classes["ppo"])


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a model on toolgym envs (GRPO or PPO, rollout trees with branching)",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", help="YAML file of config keys (flags given here override it)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=None, help="grpo (default) or ppo")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument(
        "--init",
        metavar="RUN_DIR",
        default=argparse.SUPPRESS,
        help="start from the model a `toolgym sft` run wrote (RUN_DIR/model); also a YAML key",
    )
    try:
        fields = _fields()
    except ImportError:  # torch missing: the command still registers and says what to install when run
        fields = {}
    add_config_flags(p, fields)
    p.set_defaults(func=cmd_train)


def add_config_flags(p: argparse.ArgumentParser, fields: dict[str, tuple[str, Any, str, Any]]) -> None:
    """One flag per config field (name -> (type string, default, help, choices)); unset flags stay absent."""
    for name, (typ, default, help_, choices) in fields.items():
        flag = "--" + name.replace("_", "-")
        kw: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": f"{help_} (default: {default})",
        }
        if typ == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif typ.startswith("list"):
            p.add_argument(flag, nargs="+", metavar="X", **kw)
        elif typ.startswith("dict"):
            p.add_argument(flag, type=_json_object, metavar="JSON", **kw)
        else:
            p.add_argument(flag, type={"int": int, "float": float}.get(typ, str), choices=choices, **kw)


def config_fields(*classes: Any) -> dict[str, tuple[str, Any, str, Any]]:
    """name -> (type string, default, help, choices) over config dataclasses (the first class's wins)."""
    out: dict[str, tuple[str, Any, str, Any]] = {}
    for cls in reversed(classes):
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = (str(f.type), default, f.metadata.get("help", ""), f.metadata.get("choices"))
    return out


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, e.g. \'{"prompt_format": "text"}\'')
    return value


def resolve(args: argparse.Namespace) -> Any:
    """The config object: YAML keys, then flags; `algorithm` from the flag, the YAML, or grpo."""
    from toolgym.trainers.config import load_yaml

    data: dict[str, Any] = load_yaml(args.config) if args.config else {}
    algorithm = args.algorithm or data.pop("algorithm", "grpo")
    data.pop("algorithm", None)
    init = getattr(args, "init", None) or data.pop("init", None)
    data.pop("init", None)
    if init:  # a warm start: the SFT run's model replaces `model`
        from toolgym.trainers.sft import model_dir

        data["model"] = str(model_dir(init))
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    flags = {
        k: v
        for k, v in vars(args).items()
        if k not in ("config", "algorithm", "print_config", "func", "command", "init")
    }
    if init and "model" in flags:
        raise ConfigError("give --init RUN_DIR or --model, not both")
    data.update(flags)
    cls = _config_classes()[algorithm]
    known = {f.name for f in dataclasses.fields(cls)}
    foreign = sorted(k for k in flags if k not in known)
    if foreign:
        raise ConfigError(
            f"flags that do not apply to {algorithm}: {', '.join('--' + k.replace('_', '-') for k in foreign)}"
        )
    return algorithm, cls.from_dict(data)


def cmd_train(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ConfigError("toolgym train needs torch and transformers: pip install 'toolgym[train]'") from exc
    algorithm, cfg = resolve(args)
    if args.print_config:
        print(json.dumps({"algorithm": algorithm, **cfg.to_dict()}, indent=2))
        return 0
    if algorithm == "grpo":
        from toolgym.trainers.grpo import train
    else:
        from toolgym.trainers.ppo import train  # type: ignore[assignment]
    metrics = train(cfg)
    keys = (
        "charts/episode_reward",
        "charts/success",
        "eval/episode_reward",
        "eval/success",
        "losses/approx_kl",
    )
    print(" ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics))
    print(f"run folder: {cfg.output_dir} (metrics.jsonl, *.png, tensorboard/, checkpoint/)")
    return 0
