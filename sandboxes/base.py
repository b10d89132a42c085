"""The `Sandbox` every backend shares: one-shot runs and sessions over a pool of boxes.

A backend only says how to make a box (`_new_box`) and how to describe itself (`describe`); everything else
(payload checks, the pool, result mapping, asyncio wrappers) lives here, so both backends behave alike.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from toolgym.errors import ToolgymError
from toolgym.sandboxes.box import Box, BoxFailure, to_result
from toolgym.sandboxes.inside.frames import Blobs
from toolgym.sandboxes.limits import Limits
from toolgym.sandboxes.pool import Pool
from toolgym.sandboxes.result import ExecResult
from toolgym.sandboxes.session import Session


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


class Sandbox:
    """Runs untrusted Python. Thread-safe; ``arun``/``asession`` are the asyncio forms."""

    backend = "base"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.pool = Pool(self._new_box, limits.size)
        # Boxes go away at interpreter exit even if close() is forgotten (the pool keeps this object alive).
        weakref.finalize(self, self.pool.close)

    def _new_box(self) -> Box:
        raise NotImplementedError

    @property
    def supports_fork(self) -> bool:
        """Whether ``Session.fork`` can branch a session here: not under gVisor (``runtime="runsc"`` has no
        child subreaper). Envs built on sessions report it as their own ``supports_fork``, so rollouts
        replay prefixes there instead of forking."""
        return self.limits.runtime != "runsc"

    def describe(self) -> dict[str, Any]:
        """The backend and the limits in force, for logs and `toolgym sandbox doctor`."""
        raise NotImplementedError

    def payload(
        self, code: str, stdin: str | bytes | None, files: dict[str, str | bytes] | None
    ) -> Blobs | ExecResult:
        """The call's blobs, or an ``error`` result when they are over ``payload_bytes``."""
        blobs: Blobs = {"code": _as_bytes(code)}
        if stdin is not None:
            blobs["stdin"] = _as_bytes(stdin)
        for rel, data in (files or {}).items():
            blobs[f"file:{rel}"] = _as_bytes(data)
        size = sum(len(v) for v in blobs.values())
        if size > self.limits.payload_bytes:
            msg = (
                f"payload of {size} bytes is over the sandbox limit payload_bytes={self.limits.payload_bytes}"
            )
            return ExecResult("error", "", msg, None, 0.0, detail=msg)
        return blobs

    def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: dict[str, str | bytes] | None = None,
        grader: bool = False,
    ) -> ExecResult:
        """Runs ``code`` once in a fresh interpreter and a fresh working dir holding ``files`` (relative
        path -> content). Nothing it leaves behind survives the call. ``timeout`` defaults to
        ``limits.timeout_s``. Never raises for anything the code does; infrastructure faults come back as
        ``sandbox_error``.

        ``grader=True`` is for a trusted grading harness only: the code runs as root in the box with just
        the capabilities to start processes under the box's code uid (environment
        ``TOOLGYM_CANDIDATE_UID``/``_GID``; e.g. ``subprocess.Popen(..., user=uid, group=gid,
        extra_groups=[])``) and to kill them. Those processes can then neither read its memory, stdin or
        files (mode 0600 under umask 077) nor signal or ptrace it."""
        timeout = timeout or self.limits.timeout_s
        blobs = self.payload(code, stdin, files)
        if isinstance(blobs, ExecResult):
            return blobs
        t0 = time.monotonic()
        try:
            box = self.pool.acquire()
        except ToolgymError as exc:
            return ExecResult("sandbox_error", "", "", None, time.monotonic() - t0, detail=str(exc))
        except Exception as exc:  # the daemon itself failed while making a box
            return ExecResult(
                "sandbox_error", "", "", None, time.monotonic() - t0, detail=f"{type(exc).__name__}: {exc}"
            )
        try:
            reply, out = box.call({"op": "run", "timeout": timeout, "grader": grader}, blobs, timeout)
        except BoxFailure as exc:
            self.pool.release(box)
            return ExecResult(exc.status, "", "", None, time.monotonic() - t0, detail=exc.detail)
        if not reply.get("clean", True):
            box.broken = "a run left processes or files behind, or changed the box: " + "; ".join(
                reply.get("problems") or []
            )
        self.pool.release(box)
        return to_result(reply, out)

    async def arun(
        self,
        code: str,
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: dict[str, str | bytes] | None = None,
        grader: bool = False,
    ) -> ExecResult:
        return await asyncio.to_thread(
            self.run, code, timeout=timeout, stdin=stdin, files=files, grader=grader
        )

    def session(self) -> Session:
        """A persistent interpreter for one episode; its box is taken from the pool on the first call."""
        return Session(self)

    def warmup(self, n: int | None = None) -> None:
        """Starts ``n`` boxes now (default: the pool size) so the first calls do not pay for it."""
        self.pool.warm(self.limits.size if n is None else n)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
