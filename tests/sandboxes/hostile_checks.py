"""The checks every hostile case ends with (reference: sandboxes_rewards.md §4, "contained"): the typed
status, the elapsed-time bound, the host unaffected, no surviving process, and the pool still serving."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

from toolgym.sandboxes import ExecResult, Sandbox


def host_pids() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


ZYGOTE = "tg-spare"  # a box's zygote worker, which never runs code (`inside.server.ZYGOTE_NAME`)


def survivors(sb: Sandbox) -> list[str]:
    """The code's processes still alive in this sandbox's boxes (call when no session is open): docker,
    anything beyond init, the supervisor and one zygote worker that never ran code (workers are forks of
    the supervisor, so they are counted, not matched by name; a zygote renames itself when it takes a
    session); process backend, anything running under the uid of one of its boxes but a zygote."""
    left: list[str] = []
    if sb.backend == "docker":
        from toolgym.sandboxes.docker_backend import client

        for c in client().containers.list(filters={"name": sb._prefix}):  # type: ignore[attr-defined]
            try:
                procs = c.top(ps_args="-o pid,stat,comm,args")["Processes"] or []
            except Exception:  # removed meanwhile (the pool replaced it)
                continue
            zygotes = [p for p in procs if p[2] == ZYGOTE]
            if len(procs) - min(1, len(zygotes)) > 2:
                left += [" ".join(p) for p in procs]
    else:
        mine = set(sb.uids)  # type: ignore[attr-defined]

        for entry in os.listdir("/proc"):  # the code's processes run under the boxes' own uids
            if not entry.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry}/status").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if Path(f"/proc/{entry}/comm").read_text().strip() == ZYGOTE:
                    continue
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[0])
            state = status.split("\nState:")[1].split()[0]
            if uid in mine and state != "Z":
                left.append(f"{entry} uid {uid} {cmd.decode(errors='replace')}")
    return left


HOST_PIDS_AT_START = host_pids()


def host_unaffected() -> None:
    """Files the hostile code writes (all named /tmp/tg-hostile-*) never appear on the host, and the host's
    process count stays near where it was (a leaked fork bomb would blow it up)."""
    assert not glob.glob("/tmp/tg-hostile-*"), glob.glob("/tmp/tg-hostile-*")
    assert host_pids() < HOST_PIDS_AT_START + 400, (host_pids(), HOST_PIDS_AT_START)


def contained(sb: Sandbox, res: ExecResult, statuses: set[str], max_s: float, t0: float) -> None:
    """The checks every hostile case ends with: typed status, elapsed bound, host unaffected, no survivors,
    still serving."""
    elapsed = time.monotonic() - t0
    assert res.status in statuses, res
    assert elapsed < max_s, f"took {elapsed:.1f} s (bound {max_s} s): {res}"
    deadline = time.monotonic() + 3
    while (left := survivors(sb)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes survived the call: {left}"
    host_unaffected()
    after = sb.run("print(6 * 7)", timeout=10)
    assert after.status == "ok" and after.stdout == "42\n", after
