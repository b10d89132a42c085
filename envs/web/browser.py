"""One shared Chromium behind a sync face: async Playwright runs on a background event-loop thread.

Every ``WebEnv`` holds one browser context (its own cookies and storage) in the same Chromium process;
``BrowserHost.acquire``/``release`` count the holders and the last ``release`` closes Chromium, so no
browser process outlives the envs. A browser that died (crash, OOM kill) is relaunched on the next
``acquire``/``new_context``; the episode it broke is reported as an ``InfrastructureError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.optional import require

T = TypeVar("T")

LAUNCH_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
)
# The headless shell first: it is Chromium's headless build without the browser UI layer (Playwright's own
# default for headless). The full browser in headless mode runs a WebUI renderer and more browser-process
# work per step; on the benchmark's 8 tasks the shell took ~20-40% less CPU per step (benchmarks/results/web.md).
CHROMIUM_CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str:
    """The Chromium executable: ``$TOOLGYM_CHROMIUM``, else the first of chromium-headless-shell, chromium,
    chromium-browser, google-chrome on PATH."""
    configured = os.environ.get("TOOLGYM_CHROMIUM")
    if configured:
        return configured
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        "no Chromium found: install it (Debian: apt-get install -y chromium-headless-shell, or chromium) "
        "or set TOOLGYM_CHROMIUM"
    )


class BrowserHost:
    """The process-wide Chromium and the event loop that drives it (use ``BrowserHost.shared()``)."""

    _shared: BrowserHost | None = None
    _shared_lock = threading.Lock()

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable
        self._lock = threading.Lock()
        self._holders = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._playwright: Any = None
        self._browser: Any = None
        self.launches = 0

    @classmethod
    def shared(cls) -> BrowserHost:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    # ----- the loop ----------------------------------------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the browser loop and wait for its result (a hung browser is an infra fault)."""
        loop = self._loop
        if loop is None:
            coro.close()
            raise InfrastructureError("the browser is not running")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except FutureTimeout as exc:
            future.cancel()
            raise InfrastructureError(f"the browser did not answer within {timeout:g}s") from exc

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="toolgym-browser", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()

    # ----- the browser -------------------------------------------------------------------------------------
    async def _launch(self) -> None:
        async_playwright = require("playwright.async_api").async_playwright

        if self._playwright is None:
            self._playwright = await async_playwright().start()
        self._browser = await self._playwright.chromium.launch(
            executable_path=self.executable or chromium_path(), args=list(LAUNCH_FLAGS), headless=True
        )
        self.launches += 1

    async def _shutdown(self) -> None:
        browser, pw = self._browser, self._playwright
        self._browser = self._playwright = None
        if browser is not None:
            with contextlib.suppress(Exception):  # already dead: nothing to close
                await browser.close()
        if pw is not None:
            await pw.stop()

    def _ensure_browser(self) -> None:
        require("playwright.async_api")  # before the loop: a missing package is not a browser fault
        if self._loop is None:
            self._start_loop()
        if self._browser is None or not self._browser.is_connected():
            if self._browser is not None:  # it died: drop it, then launch a fresh one
                self.run(self._shutdown())
            try:
                self.run(self._launch(), timeout=60)
            except InfrastructureError:
                raise
            except Exception as exc:
                raise InfrastructureError(f"Chromium failed to start: {exc}") from exc

    def acquire(self) -> None:
        """Count one more holder; starts the loop and Chromium if needed."""
        with self._lock:
            self._ensure_browser()
            self._holders += 1

    def release(self) -> None:
        """One holder fewer; the last one closes Chromium, Playwright's driver and the loop thread."""
        with self._lock:
            self._holders = max(0, self._holders - 1)
            if self._holders == 0 and self._loop is not None:
                try:
                    self.run(self._shutdown(), timeout=30)
                finally:
                    self._stop_loop()

    @property
    def holders(self) -> int:
        return self._holders

    def new_context(self, **options: Any) -> Any:
        """A fresh browser context (relaunching a dead Chromium first)."""
        with self._lock:
            self._ensure_browser()
            browser = self._browser
        try:
            return self.run(browser.new_context(**options))
        except InfrastructureError:
            raise
        except Exception as exc:
            raise InfrastructureError(f"could not open a browser context: {exc}") from exc
