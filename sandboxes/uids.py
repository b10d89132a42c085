"""Box uids that no other box on this host has: one per box, unique across every program running boxes.

A box's code runs under a uid of its own, so boxes share no per-uid kernel limit (processes, inotify
instances and watches, pipe buffers, POSIX message queue bytes). Each box leases its uid with an exclusive
``flock`` on a file named after it in a host-wide directory: the kernel keeps two leases of one uid apart,
within a program or across programs, and drops a lease when its holder closes it or dies (no stale state to
clean up). Both backends lease from the same range, so a docker box and a bubblewrap box never share one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import tempfile
import threading

UID_BASE = 200000  # no host account, no files on the host
UID_SPAN = 100000
_lock = threading.Lock()


def lease_dirs() -> list[str]:
    """Where leases live: /run (root), else the temp dir (a docker user without root)."""
    return ["/run/toolgym-uids", os.path.join(tempfile.gettempdir(), f"toolgym-uids-{os.geteuid()}")]


class UidLease:
    """One box's uid (also its gid) for as long as the lease is held."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid, self._fd = uid, fd

    def release(self) -> None:
        with _lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)  # drops the flock

    def __del__(self) -> None:
        self.release()


def _lease_dir() -> str:
    for d in lease_dirs():
        with contextlib.suppress(OSError):
            os.makedirs(d, mode=0o700, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
    raise OSError("no writable directory for box uid leases: " + ", ".join(lease_dirs()))


def lease_uid() -> UidLease:
    """A uid in [UID_BASE, UID_BASE + UID_SPAN) that no live box on this host holds. Starts at a random
    place so programs starting together do not all try the same files first."""
    where = _lease_dir()
    start = random.randrange(UID_SPAN)
    for i in range(UID_SPAN):
        uid = UID_BASE + (start + i) % UID_SPAN
        fd = os.open(os.path.join(where, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return UidLease(uid, fd)
    raise OSError(f"all {UID_SPAN} box uids are leased")
