"""A bounded pool of warm boxes: checked out per call or per session, liveness-checked, replaced when dead.

At most ``size`` boxes exist at once (idle, busy or being created). A caller that finds none free waits:
calls are queued, never dropped. A box comes back either clean (one-shot runs clean up after themselves)
or with ``reset=True`` (sessions: reset by a janitor thread, off the caller's path), and goes to the idle
list only if it answers, is clean and passed the supervisor's health check (nothing persistent changed);
otherwise it is destroyed (in a tracked, non-daemon thread that ``close()`` and interpreter exit wait for,
so no container outlives the program) and a fresh one is made on the next demand. Safe from many threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from toolgym.errors import InfrastructureError
from toolgym.sandboxes.box import Box

IDLE_PING_S = 30.0  # an idle box older than this is pinged before it is handed out
JANITORS = 4  # threads that reset returned session boxes at once (each reset waits on one box)
JANITOR_IDLE_S = 5.0  # a janitor with nothing to do waits this long for more before it ends


class Pool:
    def __init__(self, factory: Callable[[], Box], size: int) -> None:
        self._factory = factory
        self.size = size
        self._idle: list[Box] = []
        self._count = 0  # idle + busy + being created
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # janitors wait on their own condition (same lock): a notify() meant for a caller waiting for a box
        # must never wake a janitor instead
        self._work = threading.Condition(lock)
        self._closed = False
        self._warm_target = 0  # boxes to keep idle: replacements are started in the background
        self.created = 0
        self.replaced = 0
        self._destroying: set[threading.Thread] = set()
        self._dirty: list[Box] = []  # session boxes waiting for their reset
        self._janitors: set[threading.Thread] = set()

    def acquire(self, wait_s: float = 600.0) -> Box:
        """A live box; raises InfrastructureError if none can be created or none frees up in ``wait_s``."""
        end = time.monotonic() + wait_s
        while True:
            dirty = None
            with self._cond:
                while not self._idle and not self._dirty and self._count >= self.size:
                    if self._closed:
                        raise InfrastructureError("the sandbox pool is closed")
                    if not self._cond.wait(timeout=max(0.0, end - time.monotonic())):
                        raise InfrastructureError(f"no sandbox became free within {wait_s:g} s")
                if self._closed:
                    raise InfrastructureError("the sandbox pool is closed")
                box = self._idle.pop() if self._idle else None
                if box is None and self._dirty:  # none idle: reset one here, not wait (nor cold-start)
                    dirty = box = self._dirty.pop(0)
                if box is None:
                    self._count += 1
            if box is None:
                return self._create()
            if dirty is not None:
                if not dirty.reset():
                    self._discard(dirty)
                    continue
                return dirty
            if box.broken or (time.monotonic() - box.last_used > IDLE_PING_S and not box.ping()):
                self._discard(box)
                continue
            return box

    def _create(self) -> Box:
        try:
            box = self._factory()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise
        self.created += 1
        return box

    def release(self, box: Box, reset: bool = False) -> None:
        """Gives a box back. ``reset=True`` (a session's box) resets it in the pool's janitor thread, so the
        caller (an env starting its next episode) does not wait for it; the box is handed out again only
        once it is clean."""
        if reset and not box.broken and not self._closed:
            with self._cond:
                self._dirty.append(box)
                self._work.notify()
                self._cond.notify()  # a caller waiting for a box may reset this one itself
                if len(self._janitors) < min(JANITORS, len(self._dirty)):
                    t = threading.Thread(target=self._clean, name="pool-janitor", daemon=True)
                    self._janitors.add(t)
                    t.start()
            return
        if box.broken or self._closed:
            self._discard(box)
            return
        with self._cond:
            self._idle.append(box)
            self._cond.notify()

    def _clean(self) -> None:
        """The janitor: resets returned session boxes one at a time (each reset is one supervisor call) and
        puts them back; at close, what is left is destroyed."""
        while True:
            with self._cond:
                if not self._dirty and not self._closed:
                    self._work.wait(timeout=JANITOR_IDLE_S)  # more boxes come back at every episode's end
                if not self._dirty:
                    self._janitors.discard(threading.current_thread())
                    return
                box = self._dirty.pop(0)
            if not self._closed:
                box.reset()
            self.release(box)

    def _discard(self, box: Box) -> None:
        self.replaced += 1
        if self._closed:  # at shutdown nobody waits for a background thread: remove it now
            box.destroy()
        else:
            t = threading.Thread(target=self._destroy, args=(box,), name=f"destroy-{box.name}")
            with self._cond:
                self._destroying.add(t)
            t.start()
        with self._cond:
            self._count -= 1
            self._cond.notify()
            refill = not self._closed and len(self._idle) < self._warm_target
        if refill:  # tracked like destroy threads: close() waits, so a box made meanwhile is removed too
            t = threading.Thread(target=self._refill, name="pool-refill")
            with self._cond:
                self._destroying.add(t)
            t.start()

    def _destroy(self, box: Box) -> None:
        try:
            box.destroy()
        finally:
            with self._cond:
                self._destroying.discard(threading.current_thread())

    def _refill(self) -> None:
        """Starts one replacement box so a dead one does not cost the next caller a cold start."""
        try:
            with self._cond:
                if self._closed or self._count >= self.size or len(self._idle) >= self._warm_target:
                    return
                self._count += 1
            try:
                box = self._create()
            except Exception:
                return  # _create gave the slot back; the next acquire retries and reports the fault
            self.release(box)  # after close() this destroys it
        finally:
            with self._cond:
                self._destroying.discard(threading.current_thread())

    def warm(self, n: int) -> None:
        """Starts boxes until ``n`` are idle (bounded by the pool size), in parallel."""
        boxes: list[Box] = []
        errors: list[BaseException] = []

        def one() -> None:
            try:
                boxes.append(self.acquire(wait_s=60.0))
            except BaseException as exc:
                errors.append(exc)

        with self._cond:
            self._warm_target = max(self._warm_target, min(n, self.size))
            need = min(n, self.size) - len(self._idle)
        threads = [threading.Thread(target=one) for _ in range(max(0, need))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for box in boxes:
            self.release(box)
        if errors:
            raise errors[0]

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "size": self.size,
                "live": self._count,
                "idle": len(self._idle),
                "created": self.created,
                "replaced": self.replaced,
            }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
            self._work.notify_all()
            janitors = list(self._janitors)
        for t in janitors:  # they destroy the boxes still waiting for a reset
            t.join(timeout=60)
        threads = [threading.Thread(target=b.destroy) for b in idle]
        for t in threads:
            t.start()
        with self._cond:
            threads += list(self._destroying)
        for t in threads:
            t.join(timeout=60)
