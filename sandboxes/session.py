"""A persistent interpreter for one episode, and its forks.

A session owns one box (container) for its lifetime; its state lives in a worker process there. `fork()`
asks that worker to `os.fork()`, so the branch starts with a copy-on-write copy of every variable, import and
open file; branches of one session share the box and the file system, and their calls run one at a time.
When the last branch closes, the box is reset (workers killed, scratch wiped) and goes back to the pool.

A call that kills the interpreter (timeout, OOM, crash, ``os._exit``) returns that status; the next call on
the session starts a fresh interpreter and says so with ``restarted=True``. The same happens when the
supervisor finds the interpreter misbehaved (garbage on its reply channel, a thread left running, code of
an earlier call still in control when the next call comes). If the whole box dies, the session takes a
new one from the pool the same way.

What is covered: state across turns, branching by fork, recovery from any interpreter death, fresh stdio
and no leftover processes or threads at every call, isolation from other sessions (each session has its
own box). What is not covered: the interpreter is the candidate's state, so code can change what later
calls of the same session see through it (never send hidden data into a session; graders use
``Sandbox.run(..., grader=True)``); branches of one session run one call at a time and share a file
system; a fork copies only the calling thread, as ``os.fork`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from toolgym.errors import InfrastructureError
from toolgym.sandboxes.box import Box, BoxFailure, to_result
from toolgym.sandboxes.result import ExecResult

if TYPE_CHECKING:
    from toolgym.sandboxes.base import Sandbox

LOST = "a fresh interpreter: the previous one died, so earlier state is gone"
NO_SUBREAPER = "needs a child subreaper"  # the supervisor's words where the runtime cannot branch (gVisor)


class _Family:
    """What the branches of one session share: the box, its generation, and how many branches are open."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.lock = threading.RLock()
        self.box: Box | None = None
        self.generation = 0
        self.open = 0

    def live_box(self) -> Box:
        if self.box is not None and self.box.broken:
            self.sandbox.pool.release(self.box)
            self.box = None
        if self.box is None:
            self.box = self.sandbox.pool.acquire()
            self.generation += 1
        return self.box


class Session:
    """``run(code)`` keeps state across calls; ``fork()`` branches it; ``close()`` (or ``with``) ends it."""

    def __init__(self, sandbox: Sandbox, family: _Family | None = None, wid: int | None = None) -> None:
        self._family = family or _Family(sandbox)
        self._sandbox = sandbox
        self._wid = wid
        self._generation = self._family.generation
        self._lost = False
        self._why = ""  # why the next call starts a fresh interpreter, when it is not that the last one died
        self.closed = False
        with self._family.lock:
            self._family.open += 1

    def _live_wid(self) -> int | None:
        """This branch's worker id in the family's current box, or None when it needs a new one."""
        if self._wid is not None and self._generation == self._family.generation:
            return self._wid
        return None

    def _adopt(self, reply: dict[str, Any]) -> bool:
        """Takes the new worker a spawning call reports; whether it replaces one that was lost."""
        if "spawn_error" in reply:  # e.g. the session's branches used up the pids cap
            raise BoxFailure("error", f"could not start an interpreter: {reply['spawn_error']}")
        restarted = self._lost or self._wid is not None
        self._wid, self._generation, self._lost = int(reply["wid"]), self._family.generation, False
        return restarted

    def _worker(self, box: Box) -> tuple[int, bool]:
        """This branch's worker id in ``box``, spawning one if it has none there; and whether it is new
        after a loss."""
        wid = self._live_wid()
        if wid is not None:
            return wid, False
        reply, _ = box.call({"op": "spawn"})
        restarted = self._adopt(reply)
        assert self._wid is not None
        return self._wid, restarted

    def _exec(self, box: Box, blobs: Any, timeout: float) -> tuple[dict[str, Any], Any, bool]:
        """One exec call; a branch without a worker gets one in the same round trip. (reply, output,
        whether the worker is new after a loss)."""
        wid = self._live_wid()
        header: dict[str, Any] = {"op": "exec", "timeout": timeout}
        if wid is None:
            header["spawn"] = True
        else:
            header["wid"] = wid
        reply, out = box.call(header, blobs, timeout)
        restarted = self._adopt(reply) if wid is None else False
        return reply, out, restarted

    def run(self, code: str, *, timeout: float | None = None, stdin: str | bytes | None = None) -> ExecResult:
        if self.closed:
            raise RuntimeError("this session is closed; open a new one with Sandbox.session()")
        timeout = timeout or self._sandbox.limits.timeout_s
        blobs = self._sandbox.payload(code, stdin, None)
        if isinstance(blobs, ExecResult):
            return blobs
        t0 = time.monotonic()
        with self._family.lock:
            restarted, gone = False, ""
            try:
                box = self._family.live_box()
                reply, out, restarted = self._exec(box, blobs, timeout)
                if reply.get("status") == "gone":  # the supervisor restarted the worker (it misbehaved)
                    gone = str(reply.get("why") or LOST)
                    self._wid = None
                    reply, out, _ = self._exec(box, blobs, timeout)
                    restarted = True
            except BoxFailure as exc:
                self._lost = True
                return ExecResult(
                    exc.status,
                    "",
                    "",
                    None,
                    time.monotonic() - t0,
                    restarted=restarted,
                    detail=exc.detail + "; the next call starts a fresh interpreter",
                )
            except Exception as exc:  # the pool could not give a box (daemon gone): infrastructure
                self._lost = True
                return ExecResult("sandbox_error", "", "", None, time.monotonic() - t0, detail=str(exc))
            why, self._why = (gone or self._why or LOST) if restarted else "", ""
            if not reply.get("alive", False):
                self._lost = True
                self._wid = None
                if reply.get("status") == "ok" and reply.get("detail"):  # it answered, then was retired
                    self._why = f"a fresh interpreter: {reply['detail']}"
            return to_result(reply, out, restarted, why)

    async def arun(
        self, code: str, *, timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        return await asyncio.to_thread(self.run, code, timeout=timeout, stdin=stdin)

    def fork(self) -> Session:
        """A new branch holding a copy of this one's interpreter state (copy-on-write, milliseconds). When
        the code made that impossible, a branch whose first call starts a fresh interpreter and says so
        (``restarted=True``); InfrastructureError only for faults of ours (the box died, the runtime
        cannot branch: see ``Sandbox.supports_fork``)."""
        if self.closed:
            raise RuntimeError("cannot fork a closed session")
        with self._family.lock:
            try:
                box = self._family.live_box()
                wid, _ = self._worker(box)
                reply, _ = box.call({"op": "fork", "wid": wid})
            except BoxFailure as exc:
                raise InfrastructureError(f"could not fork the session: {exc.detail}") from exc
            if "fork_error" in reply:
                error = str(reply["fork_error"])
                if NO_SUBREAPER in error:  # the runtime cannot branch (`Sandbox.supports_fork` says so)
                    raise InfrastructureError(f"could not fork the session: {error}")
                # Anything else is the code's doing (its interpreter misbehaved, its branches used up the
                # pids cap): the branch is a fresh interpreter, and its first call says so.
                branch = Session(self._sandbox, self._family)
                branch._lost = True
                branch._why = f"a fresh interpreter: the branch could not copy the session's ({error})"
                return branch
            return Session(self._sandbox, self._family, int(reply["wid"]))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fam = self._family
        with fam.lock:
            fam.open -= 1
            box = fam.box
            if (
                fam.open > 0  # the last branch's worker goes with the box's reset below
                and box is not None
                and not box.broken
                and self._wid is not None
                and self._generation == fam.generation
            ):
                with contextlib.suppress(BoxFailure):
                    box.call({"op": "kill", "wid": self._wid})
            if fam.open == 0 and box is not None:
                fam.box = None
                self._sandbox.pool.release(box, reset=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            with contextlib.suppress(Exception):
                self.close()
