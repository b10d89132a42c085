"""``toolgym sandbox build`` (the default image, offline when needed) and ``toolgym sandbox doctor``."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sandbox", help="build the sandbox image or check what sandboxes can run here")
    sub = p.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND")
    b = sub.add_parser("build", help="build the default sandbox image (python3, numpy, sympy)")
    b.add_argument("--tag", default="toolgym-sandbox:latest")
    b.add_argument(
        "--from-dockerfile", action="store_true", help="use sandboxes/docker/Dockerfile (needs a registry)"
    )
    b.add_argument("--debootstrap", action="store_true", help="build offline from Debian packages")
    b.add_argument("--mirror", default=None, help="Debian mirror for debootstrap (default: the one apt uses)")
    b.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")
    b.set_defaults(func=cmd_build)
    d = sub.add_parser("doctor", help="say which backends work here, the limits in force, and what to do")
    d.add_argument("--image", default="toolgym-sandbox:latest")
    d.add_argument("--json", action="store_true")
    d.add_argument(
        "--prune",
        "--clean",
        dest="prune",
        action="store_true",
        help="remove this host's containers labelled toolgym.sandbox whose owning process is gone",
    )
    d.add_argument(
        "--all-hosts",
        action="store_true",
        help="with --prune: also remove other hosts' sandbox containers on this daemon (and unlabelled ones); "
        "their owners cannot be checked from here, so only when you know those hosts' runs are over",
    )
    d.set_defaults(func=cmd_doctor)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def cmd_build(args: argparse.Namespace) -> int:
    from toolgym.sandboxes.image import build

    method = "dockerfile" if args.from_dockerfile else "debootstrap" if args.debootstrap else "auto"
    print(build(args.tag, method=method, force=args.force, mirror=args.mirror, log=lambda m: print(f"  {m}")))
    return 0


def _check(name: str, ok: bool, detail: str, todo: str = "") -> dict[str, Any]:
    return {"check": name, "ok": ok, "detail": detail, "todo": "" if ok else todo}


def _by_host(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} of {host}" for host, n in sorted(counts.items()))


def _prune(all_hosts: bool) -> None:
    """``--prune``: this host's containers whose owner is gone; ``--all-hosts``: every host's (not a live one
    of this host); says how many of which host it removed and what it left."""
    import socket

    from toolgym.sandboxes.docker_backend import remove_orphans

    done = remove_orphans(all_hosts=all_hosts)
    what = (
        "of any host, all but this host's live ones"
        if all_hosts
        else f"of this host ({socket.gethostname()}) whose owner process is gone"
    )
    detail = f": {_by_host(done.by_host)}" if done.by_host else ""
    print(f"removed {done.total} leftover sandbox container(s) {what}{detail}")
    if done.left_by_host:
        print(
            f"left {sum(done.left_by_host.values())} container(s) of other hosts ({_by_host(done.left_by_host)}): "
            "their owners cannot be checked from here; `--prune --all-hosts` removes them once those runs are over"
        )


def cmd_doctor(args: argparse.Namespace) -> int:
    import time

    from toolgym.sandboxes.docker_backend import docker_problem
    from toolgym.sandboxes.factory import get_sandbox
    from toolgym.sandboxes.process_backend import process_problem

    all_hosts = bool(getattr(args, "all_hosts", False))  # (callers building a Namespace may leave it out)
    if all_hosts and not args.prune:
        print("--all-hosts goes with --prune")
        return 2
    checks = []
    problem = docker_problem(args.image)
    pproblem = process_problem()
    if args.prune and problem is None:
        _prune(all_hosts)
    checks.append(
        _check(
            "docker backend",
            problem is None,
            problem or f"daemon answers, image {args.image} present",
            "start dockerd and run `toolgym sandbox build`",
        )
    )
    if problem is None:
        from toolgym.sandboxes.docker_backend import client

        info = client().info()
        security = ", ".join(o.split(",")[0].removeprefix("name=") for o in info.get("SecurityOptions") or [])
        runtimes = ", ".join(sorted(info.get("Runtimes") or {}))
        checks.append(
            _check(
                "docker seccomp",
                "seccomp" in security,
                f"daemon security options: {security or 'none'}; runtimes: {runtimes}",
                "containers run without a seccomp filter here; the other limits still hold (see docs/sandboxes.md)",
            )
        )
    limits: dict[str, Any] = {}
    smoke: dict[str, bool] = {}
    for backend in ("docker", "process"):
        if (backend == "docker" and problem is not None) or (backend == "process" and pproblem is not None):
            continue
        try:
            sb = get_sandbox(backend, image=args.image, pool_size=1)
            t0 = time.monotonic()
            res = sb.run("import sys; print(sys.version.split()[0])", timeout=30)
            took = time.monotonic() - t0
            limits[backend] = sb.describe()
            sb.close()
            smoke[backend] = res.ok
            checks.append(
                _check(
                    f"{backend} smoke run",
                    res.ok,
                    f"{res.status} in {took * 1000:.0f} ms, python {res.stdout.strip()} {res.detail}".strip(),
                    "see the detail above",
                )
            )
        except Exception as exc:
            checks.append(
                _check(f"{backend} smoke run", False, f"{type(exc).__name__}: {exc}", "see the error")
            )
    checks.append(
        _check(
            "process backend (bubblewrap)",
            pproblem is None and smoke.get("process", False),  # ok only once a real call worked
            pproblem
            or (
                "bubblewrap boxes with their own uid, namespaces and private /tmp work here"
                if smoke.get("process")
                else "a box starts, but its smoke run failed (see above)"
            ),
            "apt-get install bubblewrap and run as root, or use the docker backend",
        )
    )
    root = os.geteuid() == 0
    checks.append(
        _check(
            "debootstrap build possible",
            root,
            "running as root" if root else f"euid {os.geteuid()}",
            "`toolgym sandbox build` without a registry needs root (sudo)",
        )
    )
    if args.json:
        print(json.dumps({"checks": checks, "limits": limits}, indent=2, default=str))
    else:
        for c in checks:
            mark = "ok " if c["ok"] else "-- "
            print(f"{mark}{c['check']}: {c['detail']}" + (f"\n     to do: {c['todo']}" if c["todo"] else ""))
        for backend, info in limits.items():
            print(f"\n{backend} limits in force:")
            for k, v in info.items():
                print(f"  {k}: {v}")
    return 0 if problem is None else 1
