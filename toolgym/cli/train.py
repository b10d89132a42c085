"""``toolgym train grpo|ppo``: GRPO or PPO on toolgym envs, from flags or a YAML config (flags win).

Each algorithm is a subcommand with its own flags and defaults: every field of ``GRPOConfig`` /
``PPOConfig`` (toolgym/trainers/grpo_config.py, ppo_config.py) is a flag (``--env-ids``, ``--model``,
``--estimator``, ``--budget``, ``--steps``, …); ``toolgym train ppo --help`` lists PPO's with PPO's
defaults.
``toolgym train --config X.yaml`` takes the algorithm from the file (``algorithm: ppo``; grpo when absent).
``--init RUN_DIR`` starts from the model a ``toolgym sft`` run wrote (docs/sft.md). Torch and transformers
load only when a run starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from typing import Any

from toolgym.cli.arguments import json_object
from toolgym.errors import ConfigError

ALGORITHMS = ("grpo", "ppo")
# keys of the namespace that are not config fields
_NOT_FIELDS = ("config", "algorithm", "algorithm_cmd", "print_config", "func", "command", "init")


def _config_classes() -> dict[str, Any]:
    from toolgym.trainers.grpo_config import GRPOConfig
    from toolgym.trainers.ppo_config import PPOConfig

    return {"grpo": GRPOConfig, "ppo": PPOConfig}


def _add_run_flags(p: argparse.ArgumentParser, top: bool) -> None:
    """--config, --print-config, --init: on `train` and on each subcommand (either place works)."""
    unset = None if top else argparse.SUPPRESS
    p.add_argument("--config", default=unset, help="YAML file of config keys (flags given here override it)")
    p.add_argument(
        "--print-config",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print the resolved config as JSON and exit",
    )
    p.add_argument(
        "--init",
        metavar="RUN_DIR",
        default=argparse.SUPPRESS,
        help="start from the model a `toolgym sft` run wrote (RUN_DIR/model); also a YAML key",
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a model on toolgym envs: `toolgym train grpo|ppo` (rollout trees with branching)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_flags(p, top=True)
    p.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=None,
        help="deprecated: write `toolgym train grpo|ppo` (or `algorithm:` in the YAML)",
    )
    classes = _config_classes()
    # without a subcommand every flag of either algorithm is accepted (hidden here: the subcommands'
    # --help lists each algorithm's flags with its own defaults)
    add_config_flags(p, config_fields(*classes.values()), hidden=True)
    for cls in classes.values():
        _add_renamed_flags(p, cls)
    p.set_defaults(func=cmd_train)
    algos = p.add_subparsers(dest="algorithm_cmd", metavar="{grpo,ppo}")
    helps = {"grpo": "critic-free GRPO on rollout trees", "ppo": "PPO with a value head and GAE"}
    for name, cls in classes.items():
        sp = algos.add_parser(
            name,
            help=helps[name],
            description=f"{helps[name]}: every flag is a field of {cls.__name__} (also a YAML key).",
        )
        _add_run_flags(sp, top=False)
        add_config_flags(sp, config_fields(cls))
        _add_renamed_flags(sp, cls)
        sp.set_defaults(func=cmd_train)


WORDS = ("auto", "true", "false")
# flags such as --resume that take an optional word (filled as the parsers are built)
WORD_SWITCHES: set[str] = set()


def bind_word_switches(argv: list[str]) -> list[str]:
    """``--resume grpo …`` as ``--resume=true grpo …``: a switch that takes an optional word would otherwise eat
    the next token (a subcommand, a value of the next flag) and fail on it as an invalid choice."""
    out = list(argv)
    for i, tok in enumerate(out[:-1]):
        if tok in WORD_SWITCHES and out[i + 1] not in WORDS:
            out[i] = f"{tok}=true"
    return out


def add_config_flags(
    p: argparse.ArgumentParser, fields: dict[str, tuple[str, Any, str, Any]], hidden: bool = False
) -> None:
    """One flag per config field (name -> (type string, default, help, choices)); unset flags stay absent."""
    for name, (typ, default, help_, choices) in fields.items():
        flag = "--" + name.replace("_", "-")
        kw: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": argparse.SUPPRESS if hidden else f"{help_} (default: {default})",
        }
        if typ == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif typ.startswith("bool |"):  # a switch that takes a word too: --resume [auto], --no-resume
            p.add_argument(flag, nargs="?", const=True, choices=WORDS, **kw)
            WORD_SWITCHES.add(flag)
            p.add_argument(
                "--no-" + flag[2:], dest=name, action="store_false", default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )  # fmt: skip
        elif typ.startswith("list"):
            p.add_argument(flag, nargs="+", metavar="X", **kw)
        elif typ.startswith("dict"):
            p.add_argument(flag, type=json_object, metavar="JSON", **kw)
        else:
            p.add_argument(flag, type={"int": int, "float": float}.get(typ, str), choices=choices, **kw)


def add_config_command(
    subparsers: Any, name: str, help: str, description: str | None, config_class: Any, func: Any
) -> argparse.ArgumentParser:
    """A trainer's subcommand (``toolgym sft``, ``toolgym dpo``): ``--config``, ``--print-config`` and one flag
    per field of the config dataclass ``config_class()`` returns (it imports the trainer: a part of it missing
    leaves the command without flags, and running it says what is missing)."""
    p = subparsers.add_parser(name, help=help, description=description)
    p.add_argument("--config", help="YAML file of config keys (flags given here override it)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    try:
        fields = config_fields(config_class())
    except ImportError:
        fields = {}
    add_config_flags(p, fields)
    p.set_defaults(func=func)
    return p


def config_from_args(args: argparse.Namespace, cls: Any, algorithm: str | None = None) -> Any:
    """A trainer command's config: the YAML's keys (``--config``), then the flags. The YAML's ``algorithm``
    key is dropped; with ``algorithm`` given it must name that one when present."""
    from toolgym.trainers.config import load_yaml

    data: dict[str, Any] = load_yaml(args.config) if args.config else {}
    named = data.pop("algorithm", algorithm)
    if algorithm is not None and named != algorithm:
        raise ConfigError(f"this config is not for {algorithm.upper()} (algorithm is not {algorithm})")
    data.update(
        {k: v for k, v in vars(args).items() if k not in ("config", "print_config", "func", "command")}
    )
    return cls.from_dict(data)


def config_or_print(args: argparse.Namespace, name: str, resolve: Any) -> Any:
    """The config of ``toolgym NAME`` (torch and transformers checked first), or None once ``--print-config``
    has printed it."""
    from toolgym.optional import require

    require("torch", why=f"toolgym {name} needs torch and transformers")
    require("transformers", why=f"toolgym {name} needs torch and transformers")
    cfg = resolve(args)
    if args.print_config:
        print(json.dumps({"algorithm": name, **cfg.to_dict()}, indent=2))
        return None
    return cfg


def _add_renamed_flags(p: argparse.ArgumentParser, cls: Any) -> None:
    """Hidden flags under the old names of renamed fields (`RENAMED`): from_dict maps them, with a warning."""
    fields = config_fields(cls)
    for old, new in cls.RENAMED.items():
        if "--" + old.replace("_", "-") not in p._option_string_actions:
            add_config_flags(p, {old: fields[new]}, hidden=True)


def config_fields(*classes: Any) -> dict[str, tuple[str, Any, str, Any]]:
    """name -> (type string, default, help, choices) over config dataclasses (the first class's wins)."""
    out: dict[str, tuple[str, Any, str, Any]] = {}
    for cls in reversed(classes):
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = (str(f.type), default, f.metadata.get("help", ""), f.metadata.get("choices"))
    return out


def _algorithm(args: argparse.Namespace, data: dict[str, Any]) -> str:
    """The algorithm: the subcommand, else the deprecated --algorithm, else the YAML's, else grpo; a
    disagreement between them is a ConfigError."""
    named = {
        "the subcommand": getattr(args, "algorithm_cmd", None),
        "--algorithm": getattr(args, "algorithm", None),
        "the config file": data.pop("algorithm", None),
    }
    if named["--algorithm"] is not None:
        warnings.warn(
            f"--algorithm is deprecated: write `toolgym train {named['--algorithm']} ...`",
            FutureWarning,
            stacklevel=3,
        )
    given = {k: v for k, v in named.items() if v is not None}
    for source, value in given.items():
        if value not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {ALGORITHMS}; {source} gives {value!r}")
    if len(set(given.values())) > 1:
        raise ConfigError(
            "the algorithm is named twice, differently: "
            + ", ".join(f"{k} says {v}" for k, v in given.items())
        )
    return next(iter(given.values()), "grpo")


def resolve(args: argparse.Namespace) -> Any:
    """(algorithm, config): YAML keys, then flags."""
    from toolgym.trainers.config import load_yaml

    data: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    algorithm = _algorithm(args, data)
    init = getattr(args, "init", None) or data.pop("init", None)
    data.pop("init", None)
    if init:  # a warm start: the SFT run's model replaces `model`
        from toolgym.trainers.sft import model_dir

        data["model"] = str(model_dir(init))
    flags = {k: v for k, v in vars(args).items() if k not in _NOT_FIELDS}
    if init and "model" in flags:
        raise ConfigError("give --init RUN_DIR or --model, not both")
    cls = _config_classes()[algorithm]
    known = {f.name for f in dataclasses.fields(cls)} | set(cls.RENAMED)
    foreign = sorted(k for k in flags if k not in known)
    if foreign:
        raise ConfigError(
            f"flags that do not apply to {algorithm}: {', '.join('--' + k.replace('_', '-') for k in foreign)}"
        )
    data.update(flags)
    with warnings.catch_warnings():
        warnings.simplefilter("always", DeprecationWarning)  # a renamed key is shown to CLI users too
        return algorithm, cls.from_dict(data)


def cmd_train(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        algorithm, cfg = resolve(args)
    for w in caught:  # deprecations (old flags, renamed keys) as one plain line each, no traceback
        print(f"toolgym train: {w.message}", file=sys.stderr)
    if getattr(args, "print_config", False):
        print(json.dumps({"algorithm": algorithm, **cfg.to_dict()}, indent=2))
        return 0
    from toolgym.optional import require

    require("torch", why="toolgym train needs torch and transformers")
    require("transformers", why="toolgym train needs torch and transformers")
    from toolgym.trainers.preemption import Preempted, exit_status

    try:
        if algorithm == "grpo":
            from toolgym.trainers.grpo import train as train_grpo

            metrics = train_grpo(cfg)
        else:
            from toolgym.trainers.ppo import train as train_ppo

            metrics = train_ppo(cfg)
    except Preempted as stop:  # SIGTERM/SIGINT: the loop saved its checkpoint and printed where
        return exit_status(stop)  # (under torchrun: exits here, every rank with this code)
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
