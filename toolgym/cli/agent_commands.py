"""``toolgym eval ENV… --agent …`` and ``toolgym serve --agent …`` (see docs/agents.md)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from toolgym.agents.factory import AGENT_HELP
from toolgym.cli.arguments import json_object
from toolgym.cli.table import format_table


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate an agent on environments (scoreboard, JSONL, HTML report)"
    )
    p.add_argument("env_ids", nargs="+", metavar="ENV", help="env ids, e.g. toolgym/Calculator-v0")
    p.add_argument(
        "--agent", default="hf:smollm2-135m", help=f"{AGENT_HELP}; hf:RUN_DIR loads a sft/train run's model"
    )
    p.add_argument("--episodes", type=int, default=10, help="episodes per env (seeds 0…N-1 + --seed)")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--concurrency", type=int, default=64, help="episodes live at once (one batched call)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128, help="per model turn")
    p.add_argument(
        "--prompt-format",
        choices=["auto", "tools", "text"],
        default="auto",
        help="auto: text when the model's chat template cannot show tools",
    )
    p.add_argument(
        "--env-kwargs",
        type=json_object,
        default={},
        help="JSON of keyword arguments for gym.make (default with hf:RUN_DIR: the settings the run evaluated on)",
    )
    p.add_argument(
        "--env-workers",
        default="threads",
        metavar="WHERE",
        help="where envs run: threads (this process) | ray | ray://HOST:PORT | ray:ADDRESS (Ray actors)",
    )
    p.add_argument("--out", default=None, help="output folder (default runs/eval-TIMESTAMP)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    p = subparsers.add_parser("serve", help="serve an agent over the OpenAI chat-completions API")
    p.add_argument(
        "--agent",
        default="hf:smollm2-135m",
        help="hf:NAME, engine:NAME (our decode engine) or openai:URL (a proxy)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default=None, help="the name /v1/models reports")
    p.add_argument(
        "--max-batch", type=int, default=64, help="requests generated together (engine: its slots)"
    )
    p.add_argument(
        "--max-model-len", type=int, default=2048,
        help="engine:NAME: the tokens a sequence may hold (prompt + reply; its KV cache is allocated up front); "
        "/v1/models reports it, so a trainer's rollout_servers check it",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=0,
        help="torch CPU threads on a CPU (0: half the cores, at most 4; torch's default of every core is slow)",
    )  # fmt: skip
    p.add_argument(
        "--strict-model", action="store_true",
        help="answer a request that names another model with 404 (as vLLM does); default: serve it, named ours",
    )  # fmt: skip
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body (413 past it)")
    p.add_argument(
        "--max-tokens-limit", type=int, default=2**20,
        help="largest max_tokens a request may ask when the policy's context length is unknown",
    )  # fmt: skip
    p.add_argument(
        "--weight-updates", action="store_true",
        help="let a trainer replace the served weights (engine: vllm with weight_sync: disk; vLLM's /pause, "
        "/collective_rpc reload_weights, /reset_prefix_cache, /resume). Anyone who can reach the port can then "
        "do so: keep the server on a private network",
    )  # fmt: skip
    p.set_defaults(func=cmd_serve)


def _agent(spec: str) -> str:
    """``hf:RUN_DIR`` (or ``engine:RUN_DIR``) of a training run as the same kind with its model folder
    (``toolgym.cli.run_models``)."""
    kind, sep, rest = spec.partition(":")
    if kind not in ("hf", "engine") or not sep:
        return spec
    from toolgym.cli.run_models import run_model

    return f"{kind}:" + run_model(rest)


def _progress(total: int, quiet: bool) -> Any:
    """A tqdm bar when tqdm is installed, else a one-line counter on stderr."""
    if quiet:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="ep", desc="episodes", file=sys.stderr)
    except ImportError:

        class _Counter:
            n = 0

            def update(self, k: int) -> None:
                self.n += k
                print(f"\repisodes {self.n}/{total}", end="", file=sys.stderr, flush=True)

            def set_postfix_str(self, s: str) -> None:
                return None

            def close(self) -> None:
                print(file=sys.stderr)

        return _Counter()


def cmd_eval(args: argparse.Namespace) -> int:
    from toolgym.agents import SamplingParams, TokenPolicy, make_policy, save_trajectories
    from toolgym.agents.report import write_report
    from toolgym.agents.runner import EpisodeRunner, episode_specs
    from toolgym.agents.scoreboard import HEADERS, score
    from toolgym.errors import ConfigError

    if args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    env_kwargs = dict(args.env_kwargs)
    kind, _, rest = args.agent.partition(":")
    if kind in ("hf", "engine") and rest and not env_kwargs:  # a training run: the settings it evaluated on
        from toolgym.cli.run_models import run_env_kwargs

        env_kwargs = run_env_kwargs(rest) or {}
        if env_kwargs:
            print(
                f"env settings of the run (its env_kwargs + eval_env_kwargs): {env_kwargs}", file=sys.stderr
            )
    from toolgym.cli.ids import require_ids

    require_ids(args.env_ids)
    # hf: keep each episode's KV cache between its turns (only the new tokens run each turn)
    agent = _agent(args.agent)
    policy = make_policy(agent, reuse_kv=True) if agent.startswith("hf") else make_policy(agent)
    fmt = args.prompt_format
    if fmt == "auto":
        fmt = "text" if isinstance(policy, TokenPolicy) and not policy.renderer.renders_tools else None
    if fmt and "prompt_format" not in env_kwargs:
        env_kwargs["prompt_format"] = fmt
    sampling = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    specs = episode_specs(args.env_ids, args.episodes, first_seed=args.seed, **env_kwargs)
    out = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    bar = _progress(len(specs), args.quiet)
    solved = [0, 0]

    def on_episode(traj: Any) -> None:
        solved[0] += int(traj.success)
        solved[1] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"success {solved[0]}/{solved[1]}")

    def on_round(n: int, live: int) -> None:
        if bar is not None:
            bar.set_postfix_str(f"round {n}: {live} episodes generating; success {solved[0]}/{solved[1]}")

    remote: dict[str, Any] = {}
    if args.env_workers != "threads":  # envs as Ray actors; a thread per live episode waits on its actor
        from toolgym.ray_envs import RayEnvWorkers

        remote = {"make_env": RayEnvWorkers(args.env_workers).env_factory(), "env_workers": args.concurrency}
    t0 = time.perf_counter()
    try:
        with EpisodeRunner(
            policy, concurrency=args.concurrency, sampling=sampling, on_episode=on_episode, on_round=on_round,
            **remote,
        ) as runner:  # fmt: skip
            trajs = runner.run(specs)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    jsonl = save_trajectories(out / "trajectories.jsonl", trajs)
    print(format_table(HEADERS, [s.row() for s in score(trajs)]))
    print(f"\n{len(trajs)} episodes in {seconds:.1f}s with {policy.name}")
    print(f"trajectories: {jsonl}")
    if not args.no_report:
        meta = {
            "agent": policy.name,
            "envs": ", ".join(args.env_ids),
            "episodes": len(trajs),
            "sampling": sampling,
            "env kwargs": env_kwargs,
            "seconds": f"{seconds:.1f}",
        }
        report = write_report(out / "report.html", trajs, title="toolgym eval", meta=meta)
        print(f"report: {report}")
    return _infra_verdict(trajs)


def _infra_verdict(trajs: list[Any]) -> int:
    """1 with the causes on stderr when no episode ran (every one an infrastructure failure): a scoreboard of
    zeros would read as the model's failure. Some failing among others is reported in the table only."""
    if not trajs or not all(t.infra_failure for t in trajs):
        return 0
    causes: dict[str, int] = {}
    for t in trajs:
        cause = str(t.error or "unknown").strip().splitlines()[0][:300]
        causes[cause] = causes.get(cause, 0) + 1
    print(f"toolgym eval: all {len(trajs)} episodes failed for infrastructure reasons:", file=sys.stderr)
    for cause, n in sorted(causes.items(), key=lambda kv: -kv[1]):
        print(f"  {n} x {cause}", file=sys.stderr)
    return 1


def cmd_serve(args: argparse.Namespace) -> int:
    from toolgym.agents import make_policy
    from toolgym.agents.openai_server import PolicyServer

    # hf: a follow-up request whose prompt extends an earlier prompt + reply reuses that KV cache
    agent = _agent(args.agent)
    if agent.startswith("hf"):
        policy = make_policy(agent, reuse_kv=True)
    elif agent.startswith("engine"):  # (slots for a whole batch, each sequence up to --max-model-len)
        policy = make_policy(agent, slots=args.max_batch, capacity=args.max_model_len)
    else:
        policy = make_policy(agent)
    if policy.name == "scripted":
        from toolgym.errors import ConfigError

        raise ConfigError(
            "the scripted agent needs the env itself, so it cannot be served: use hf:… or openai:…"
        )
    if args.weight_updates and getattr(policy, "model", None) is None:
        from toolgym.errors import ConfigError

        raise ConfigError("--weight-updates needs a local model to load weights into: use hf:… or engine:…")
    from toolgym.serving.base import Limits

    server = PolicyServer(
        policy, host=args.host, port=args.port, model_name=args.model_name, max_batch=args.max_batch,
        threads=args.threads, strict_model=args.strict_model, max_tokens_limit=args.max_tokens_limit,
        limits=Limits(max_body_bytes=max(1, int(args.max_body_mb * 2**20))),
        weight_updates=args.weight_updates,
    )  # fmt: skip
    print(
        f"serving {policy.name} at {server.url} (POST /chat/completions, /completions); Ctrl-C stops",
        flush=True,
    )
    if args.weight_updates:
        print(
            "weight updates on (/pause, /collective_rpc, /reset_prefix_cache, /resume): anyone who can reach "
            "this port can replace the weights; keep it on a private network",
            flush=True,
        )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0
