"""``toolgym serve-env ID`` (an env over OpenEnv's WebSocket protocol and HTTP) and ``toolgym view RUN_DIR``
(rollout trees as one HTML page). See docs/interop.md."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from toolgym.cli.arguments import json_object


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-env",
        help="serve an env over WebSocket (OpenEnv's protocol) and HTTP, one session per connection",
        description="Serve a registered toolgym env: ws://HOST:PORT/ws speaks OpenEnv's protocol (openenv-core's "
        "EnvClient drives it); HTTP sessions at POST /reset, /step; OpenAPI docs at /docs.",
    )
    p.add_argument("env_id", metavar="ENV", help="a registered id, e.g. toolgym/Calculator-v0")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--env-kwargs", type=json_object, default={}, help="JSON of keyword arguments for gym.make"
    )
    p.add_argument("--max-sessions", type=int, default=64, help="sessions open at once (one env each)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="close a session after this many seconds without a message (0: never)",
    )
    p.add_argument(
        "--call-timeout",
        type=float,
        default=1800.0,
        help="a reset or step running longer is ENV_TIMEOUT (504) and its session is closed (0: never)",
    )
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest HTTP request body (413 past it)")
    p.add_argument(
        "--expert",
        action="store_true",
        help="answer {'type': 'expert'} with the scripted expert's next action (reveals answers: for checks)",
    )
    p.add_argument(
        "--special-text",
        choices=("escape", "keep"),
        default="escape",
        help="special-token text in observations (a client's trainer tokenizes them with special tokens on): "
        "escape it with a zero-width space (default) or keep it",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="the client model's tokenizer (a hub id, a folder or smollm2-135m): escape exactly its special "
        "tokens (default: a known list of chat markers)",
    )
    p.set_defaults(func=cmd_serve_env)

    p = subparsers.add_parser(
        "view",
        help="write one HTML page of a training run's rollout trees (filter by task and reward)",
        description="Reads RUN_DIR/rollouts/step_*.jsonl (written by `toolgym train --save-rollouts`) and writes "
        "a self-contained page: branch points, each turn's text, tool calls and observations, rewards "
        "and per-turn advantages.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--steps", default=None, help="which steps: 3 | 1,5,9 | 10-20 | last (default: all, ≤ 20)")
    p.add_argument("-o", "--out", default=None, help="output file (default RUN_DIR/rollouts.html)")
    p.set_defaults(func=cmd_view)


def cmd_serve_env(args: argparse.Namespace) -> int:
    from toolgym.serving.base import Limits
    from toolgym.serving.env_server import EnvServer

    env_kwargs = args.env_kwargs
    server = EnvServer(
        args.env_id,
        env_kwargs,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout or None,
        expert=args.expert,
        call_timeout_s=args.call_timeout or None,
        limits=Limits(max_body_bytes=max(1, int(args.max_body_mb * 2**20))),
        special_text=args.special_text,
        tokenizer=args.tokenizer,
    )
    print(
        f"serving {args.env_id} at {server.ws_url}/ws (OpenEnv) and {server.url} (HTTP; docs at /docs); "
        "Ctrl-C stops",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from toolgym.viewer import write_view

    out = write_view(args.run_dir, steps=args.steps, out=args.out)
    print(f"rollout viewer: {out}")
    return 0
