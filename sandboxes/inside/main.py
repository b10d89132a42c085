"""Entry point of the supervisor (``serve``), started by `BOOT` as root with a few capabilities.

Arguments: ``--uid=N --gid=N`` (the code's ids), ``--scratch=DIR`` (writable dirs wiped after each
one-shot run; the first holds the work dirs), ``--max-output=BYTES``, ``--preload=MODULES``,
``--limit=RLIMIT_NAME=VALUE`` (set on every worker), ``--contained`` (alone in its pid namespace),
``--keep=PATH`` (an entry of a scratch dir that is not scratch: never wiped).
"""

from __future__ import annotations

import contextlib
import os

from .procs import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, prctl, prepare_seccomp, set_oom_adj
from .server import Server


def _values(argv: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]


def serve_main(argv: list[str]) -> None:
    scratch = _values(argv, "scratch")
    max_output = int((_values(argv, "max-output") or [str(1 << 20)])[0])
    limits = {}
    for item in _values(argv, "limit"):
        name, _, value = item.partition("=")
        limits[name] = int(value)
    subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0  # gVisor (runsc) has none: see Server.fork
    prctl(PR_SET_DUMPABLE, 0)
    set_oom_adj(-1000)  # the OOM killer takes the code's processes, never the supervisor
    with contextlib.suppress(OSError):  # ahead of the code's processes (a fork bomb) when it must kill them
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    prepare_seccomp(not os.path.ismount("/dev/mqueue"))  # built once here; every worker only installs it
    for name in _values(argv, "preload"):  # imported once here, then shared copy-on-write by every worker
        for mod in name.split(","):
            with contextlib.suppress(Exception):
                __import__(mod)
    # Nothing is written before the first request: a docker exec stream may still be inside the HTTP
    # upgrade when the host takes the socket, and early bytes could be lost there.
    server = Server(
        scratch or ["/tmp"],
        "--contained" in argv,
        max_output,
        int((_values(argv, "uid") or ["65534"])[0]),
        int((_values(argv, "gid") or ["65534"])[0]),
        limits,
        subreaper,
    )
    server.keep = set(_values(argv, "keep"))
    server.serve()


def main(argv: list[str]) -> None:
    serve_main(argv[1:] if argv and argv[0] == "serve" else argv)
