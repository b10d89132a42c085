"""``toolgym serve-reward``: serve a rubric over HTTP (FastAPI + uvicorn) in OpenRLHF's remote reward-model
shape (``toolgym.serving.reward_server``)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-reward",
        help="serve reward functions over HTTP (POST /get_reward, OpenRLHF remote RM shape)",
        description="Each --reward is NAME[=WEIGHT]: a function of toolgym.rewards (math_match, exact_match, "
        "token_f1, single_answer, …) or module:attribute. Weight 0 logs the part without adding it.",
    )
    p.add_argument("--reward", action="append", required=True, metavar="NAME[=WEIGHT]", help="repeatable")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument(
        "--gold-key", default="answer", help="column the request's labels become (default: answer)"
    )
    p.add_argument("--none-value", type=float, default=0.0, help="reward sent for a not-applicable sample")
    p.set_defaults(func=cmd_serve_reward)


def load_reward(name: str) -> Any:
    """A reward function by name (``exact_match``) or import path (``my.module:my_reward``)."""
    import importlib

    import toolgym.rewards as rewards
    from toolgym.errors import ConfigError

    if ":" in name:
        module_name, attr = name.split(":", 1)
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load reward '{name}': {exc}") from exc
    if name not in rewards.REWARD_FUNCTIONS:
        raise ConfigError(
            f"unknown reward '{name}'; known: {', '.join(sorted(rewards.REWARD_FUNCTIONS))} (or module:attr)"
        )
    return rewards.REWARD_FUNCTIONS[name]


def reward_specs(specs: list[str], load: Any = None) -> tuple[dict[str, Any], list[float]]:
    """The functions and weights of repeated ``--reward NAME[=WEIGHT]`` flags (`load` maps a name to its
    function; default :func:`load_reward`).

    >>> funcs, weights = reward_specs(["exact_match", "token_f1=0.5"])
    >>> list(funcs), weights
    (['exact_match', 'token_f1'], [1.0, 0.5])
    """
    from toolgym.errors import ConfigError

    funcs: dict[str, Any] = {}
    weights: list[float] = []
    for spec in specs:
        name, _, weight = spec.partition("=")
        try:
            weights.append(float(weight) if weight else 1.0)
        except ValueError as exc:
            raise ConfigError(f"--reward {spec}: the weight must be a number") from exc
        funcs[name] = (load or load_reward)(name)
    return funcs, weights


def cmd_serve_reward(args: argparse.Namespace) -> int:
    from toolgym.rewards.rubric import Rubric
    from toolgym.serving.reward_server import RewardServer

    funcs, weights = reward_specs(args.reward)
    rubric = Rubric(funcs, weights)
    server = RewardServer(rubric, args.host, args.port, gold_key=args.gold_key, none_value=args.none_value)
    parts = ", ".join(f"{n}×{w:g}" for n, w in zip(rubric.names, weights, strict=True))
    print(f"serving {parts} on {server.url}/get_reward (OpenAPI: /docs; Ctrl-C stops)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0
