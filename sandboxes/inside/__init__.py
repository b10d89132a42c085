"""The supervisor that runs *inside* the sandbox: a container (docker backend) or a bubblewrap box (process
backend). A stdlib-only package with no imports outside itself; the host imports `frames` from it and sends
the package's source over the supervisor's own stream when a box starts (`BOOT`), so no host path is ever
mounted into a box. Nothing runs at import time.

Trust boundary. Three kinds of process live in a box:

- ``init`` (PID 1 of a container, `INIT`): root, ignores every signal it can, never OOM-killed
  (``oom_score_adj`` -1000), reaps orphans.
- the *supervisor* (`server`): root with only the capabilities it needs (setuid/setgid to drop, kill,
  override file modes to wipe scratch, adjust OOM scores), not dumpable, never OOM-killed. It alone holds
  the host's stream. The untrusted code runs under another uid, so it cannot signal, ptrace, renice or
  read the supervisor or init.
- *workers*: the code's processes, forked by the supervisor, dropped to the box uid with no capabilities
  and ``oom_score_adj`` 1000 (the OOM killer always picks them). A one-shot run is one fresh worker whose
  status comes from ``waitpid``. A session's worker receives each call on a request socket it can only
  read, with fresh stdin/stdout/stderr and a fresh one-use reply pipe; the supervisor checks every reply
  strictly and restarts a worker that misbehaves (garbage or stray replies, threads or processes left
  running after its call).

Modes (`main`): ``serve`` (the supervisor; reads request frames on fd 0, writes replies on fd 1).
"""

from __future__ import annotations

# PID 1 of a container: ignore every signal it can, never be OOM-killed, reap orphans forever.
INIT = """
import ctypes, os, signal, time
for s in range(1, signal.NSIG):
    try:
        signal.signal(s, signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError):
        pass
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
try:
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
try:
    with open('/proc/self/oom_score_adj', 'w') as f:
        f.write('-1000')
except OSError:
    pass
while True:
    try:
        os.wait()
    except OSError:
        time.sleep(0.5)
"""

# Reads the package (one frame: header {"files": [[name, size], ...]} + the sources) from fd 0, writes it
# under argv[1] (a root-owned tmpfs the code cannot write), then runs the supervisor with argv[2:].
BOOT = """
import json, os, struct, sys
def take(n):
    b = b''
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit(0)
        b += c
    return b
n, m = struct.unpack('>II', take(8))
head, body = json.loads(take(n)), take(m)
root = sys.argv[1]
os.makedirs(os.path.join(root, 'inside'), mode=0o755, exist_ok=True)
pos = 0
for name, size in head['blobs']:
    with open(os.path.join(root, 'inside', name), 'wb') as f:
        f.write(body[pos:pos + size])
    pos += size
sys.path.insert(0, root)
from inside.main import main
main(sys.argv[2:])
"""


def package_blobs() -> dict[str, bytes]:
    """The package's sources, for the host to send after starting `BOOT`."""
    import pathlib

    here = pathlib.Path(__file__).parent
    return {p.name: p.read_bytes() for p in sorted(here.glob("*.py"))}


def boot_args(root: str) -> list[str]:
    """Python arguments that start `BOOT` with the package written under ``root``.

    >>> boot_args("/opt/toolgym")[:1]
    ['-c']
    """
    return ["-c", BOOT, root]
