"""Processes a test starts end with the test, children included (a launcher's workers, a server's workers).

Each process starts in a session of its own, so ``stop`` reaches its whole group: SIGTERM, then SIGKILL for
whatever is left after ``grace_s``. ``subprocess.run(..., timeout=…)`` kills only the direct child, which
leaves e.g. torchrun's ranks running for minutes after a timed-out test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any


def start(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` in a new session (the group ``stop`` ends)."""
    return subprocess.Popen(list(cmd), start_new_session=True, **popen)


def stop(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """End ``proc`` and every process of its group: SIGTERM, then SIGKILL after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the group outlives a leader that has exited: signal it anyway
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader is gone; its children get the SIGKILL too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        return


@contextlib.contextmanager
def running(cmd: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """A started process that ``stop`` ends when the block exits, however it exits."""
    proc = start(cmd, **popen)
    try:
        yield proc
    finally:
        stop(proc)


def run(
    cmd: Sequence[str], timeout: float, input: str | None = None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=…, input=…)`` whose timeout (or any
    error) ends the whole process group, not just its leader (a grandchild holding the pipes open would
    otherwise keep ``communicate`` waiting, and outlive the test)."""
    stdin = subprocess.PIPE if input is not None else None
    with running(
        cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    ) as proc:
        out, err = proc.communicate(input=input, timeout=timeout)
        return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
