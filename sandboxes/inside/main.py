"""Entry points: ``init`` (PID 1 of a container) and ``serve`` (the supervisor).

Run as ``python3 -c "import sys; sys.path.insert(0, DIR); from inside.main import main; main()" MODE ...``
where DIR holds this package (bind-mounted read-only at /opt/toolgym in containers).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from .procs import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, prctl
from .server import Server


def init_main() -> None:
    """Reaps whatever is orphaned to PID 1 (only happens if the supervisor itself died)."""
    prctl(PR_SET_DUMPABLE, 0)
    while True:
        try:
            os.wait()
        except OSError:  # no children yet (ChildProcessError) or an interrupted wait
            time.sleep(0.5)


def serve_main(argv: list[str]) -> None:
    scratch = [a.split("=", 1)[1] for a in argv if a.startswith("--scratch=")]
    preload = [a.split("=", 1)[1] for a in argv if a.startswith("--preload=")]
    max_output = int(next((a.split("=", 1)[1] for a in argv if a.startswith("--max-output=")), 1 << 20))
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)
    for name in preload:  # imported once here, then shared copy-on-write by every worker
        for mod in name.split(","):
            with contextlib.suppress(Exception):
                __import__(mod)
    # Nothing is written before the first request: a docker exec stream may still be inside the HTTP
    # upgrade when the host takes the socket, and early bytes could be lost there.
    server = Server(scratch or ["/tmp"], "--contained" in argv, max_output)
    server.serve()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "serve"
    if mode == "init":
        init_main()
    else:
        serve_main(sys.argv[2:])
