"""A MiniWoB++ page in one browser context: load it, start episodes through MiniWoB's JavaScript, read it
as a list of elements, and act on it. Every call is one trip to the browser loop (see ``browser.py``).

Speed: ``page.js`` is installed in the page and does each action and the observation in ONE evaluate
(type, select, element scroll, episode start); a click is a hit-tested point from the page, then a real
mouse click there (trusted input through CDP) sent together with the read of the page after it: two
sequential round trips, no Playwright actionability polling (the page itself waits out running animations
before giving the point). The evaluates go as raw CDP ``Runtime.evaluate`` on the page's CDP session:
about a third less CPU per call than ``page.evaluate`` (no Playwright utility-script serialisation)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import mimetypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.envs.web.browser import BrowserHost
from toolgym.errors import InfrastructureError
from toolgym.optional import not_installed, require

BASE_URL = "http://miniwob.toolgym/"  # never resolved: requests are answered from the miniwob package
PAGE_JS = Path(__file__).with_name("page.js").read_text(encoding="utf-8")
VIEWPORT = {"width": 500, "height": 340}
KEYS = ("Enter", "Tab", "Escape", "Backspace", "Delete", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight",
        "Home", "End", "PageUp", "PageDown", "Space")  # fmt: skip


def miniwob_html_dir() -> Path:
    """The ``html`` folder of the installed PyPI ``miniwob`` package (found without importing it)."""
    from importlib.util import find_spec

    spec = find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise not_installed("miniwob", why="the web envs need MiniWoB++'s pages")
    return Path(next(iter(spec.submodule_search_locations))) / "html"


@dataclass
class Snapshot:
    """What the page shows now, and MiniWoB's episode state."""

    elements: list[dict[str, Any]] = field(default_factory=list)
    utterance: str = ""
    done: bool = False
    reward: float = 0.0
    raw_reward: float = 0.0
    reason: str | None = None

    @classmethod
    def from_js(cls, data: dict[str, Any]) -> Snapshot:
        return cls(
            elements=list(data.get("elements") or []),
            utterance=str(data.get("utterance") or ""),
            done=bool(data.get("done")),
            reward=float(data.get("reward") or 0.0),
            raw_reward=float(data.get("raw_reward") or 0.0),
            reason=data.get("reason"),
        )


def _is_dead(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in ("Target closed", "has been closed", "Browser closed", "Connection closed"))


class PageScriptError(Exception):
    """page.js threw (not an action error: those come back as text)."""


class MiniWoBPage:
    """One browser context with one page showing MiniWoB++ tasks."""

    def __init__(self, host: BrowserHost, html_dir: Path, action_timeout_ms: int = 2000) -> None:
        self.host = host
        self.html_dir = html_dir
        self.action_timeout_ms = action_timeout_ms
        self.context: Any = None
        self.page: Any = None
        self.cdp: Any = None
        self.task: str | None = None

    # ----- life cycle --------------------------------------------------------------------------------------
    def open(self) -> None:
        self.context = self.host.new_context(viewport=VIEWPORT)
        try:
            self.page = self.host.run(self._open())
        except Exception as exc:
            raise InfrastructureError(f"could not open a page: {exc}") from exc

    async def _open(self) -> Any:
        await self.context.route(BASE_URL + "**", self._serve)
        await self.context.add_init_script(PAGE_JS)
        page = await self.context.new_page()
        self.cdp = await self.context.new_cdp_session(page)
        page.set_default_timeout(self.action_timeout_ms)
        page.set_default_navigation_timeout(30_000)  # a loaded machine loads slowly; actions stay short
        return page

    async def _serve(self, route: Any) -> None:
        rel = route.request.url[len(BASE_URL) :].split("?", 1)[0].split("#", 1)[0]
        path = (self.html_dir / rel).resolve()
        if not path.is_relative_to(self.html_dir.resolve()) or not path.is_file():
            await route.fulfill(status=404, body="not found")
            return
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        await route.fulfill(status=200, body=path.read_bytes(), headers={"content-type": kind})

    def close(self) -> None:
        context, self.context, self.page, self.cdp, self.task = self.context, None, None, None, None
        if context is not None:
            with contextlib.suppress(Exception):  # a dead browser took the context with it
                self.host.run(context.close(), timeout=10)

    def alive(self) -> bool:
        return self.page is not None and not self.page.is_closed()

    # ----- episodes ----------------------------------------------------------------------------------------
    def start(self, task: str, seed: int, max_time_ms: int, reload: bool) -> Snapshot:
        """Show ``task`` (loading its page if needed) and start a seeded episode through MiniWoB's JS."""
        return self._call(self._start(task, seed, max_time_ms, reload), timeout=60)

    async def _start(self, task: str, seed: int, max_time_ms: int, reload: bool) -> Snapshot:
        page = self.page
        if reload or self.task != task:
            await page.goto(f"{BASE_URL}miniwob/{task}.html", wait_until="load")
            self.task = task
        out = await self._eval("start", json.dumps(str(seed)), str(max_time_ms))
        if out.get("error"):
            raise InfrastructureError(f"MiniWoB {task}: {out['error']}")
        return Snapshot.from_js(out["snapshot"])

    def snapshot(self) -> Snapshot:
        return self._call(self._snapshot())

    async def _snapshot(self) -> Snapshot:
        out = await self._eval("act", '"snapshot"', "[]", "0")
        return Snapshot.from_js(out["snapshot"])

    def act(self, name: str, args: tuple[Any, ...]) -> tuple[str | None, Snapshot]:
        """Do one action; returns (error text for the model or None, the page afterwards)."""
        return self._call(self._act(name, args))

    def screenshot(self) -> bytes:
        return self._call(self.page.screenshot(type="png"))

    def screenshot_b64(self) -> str:
        return base64.b64encode(self.screenshot()).decode("ascii")

    # ----- internals ---------------------------------------------------------------------------------------
    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        if not self.alive():
            coro.close()
            raise InfrastructureError("the browser page is gone (Chromium crashed or was closed)")
        try:
            return self.host.run(coro, timeout=timeout)
        except InfrastructureError:
            raise
        except Exception as exc:
            if _is_dead(exc) or not self.alive():
                raise InfrastructureError(f"the browser failed: {exc}") from exc
            raise

    async def _eval(self, function: str, *args: str) -> Any:
        """``window.__toolgym.<function>(args...)`` (args are JS literals), awaited, its JSON result parsed."""
        expression = f"window.__toolgym.{function}({', '.join(args)})"
        params = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        result = await self.cdp.send("Runtime.evaluate", params)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text") or "error"
            raise PageScriptError(f"the page's script failed: {str(text).splitlines()[0][:200]}")
        return json.loads(result["result"]["value"])

    async def _in_page(self, name: str, args: list[Any]) -> tuple[str | None, Snapshot]:
        out = await self._eval("act", json.dumps(name), json.dumps(args), str(self.action_timeout_ms))
        return out.get("error"), Snapshot.from_js(out["snapshot"])

    async def _act(self, name: str, args: tuple[Any, ...]) -> tuple[str | None, Snapshot]:
        PlaywrightError = require("playwright.async_api").Error

        page = self.page
        try:
            if name in ("type", "select"):
                return await self._in_page(name, [args[0], str(args[1])])
            if name == "click":
                out = await self._eval("act", '"point"', json.dumps([args[0]]), str(self.action_timeout_ms))
                if out.get("error"):
                    return out["error"], Snapshot.from_js(out["snapshot"])
                # the click and the read of the page after it go out together (the page waits for the
                # mouse-up), so a click costs two sequential round trips, not three
                _, after = await asyncio.gather(page.mouse.click(*out["point"]), self._eval("afterClick"))
                return None, Snapshot.from_js(after["snapshot"])
            elif name == "press":
                key = str(args[0])
                await page.keyboard.press(" " if key == "Space" else key)
            elif name == "scroll":
                direction = str(args[0]).lower()
                step = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}.get(direction)
                if step is None:
                    error = f"scroll direction must be up, down, left or right, got {args[0]!r}"
                    return error, await self._snapshot()
                if len(args) > 1 and args[1] is not None:
                    return await self._in_page("scroll", [list(step), args[1]])
                await page.mouse.wheel(step[0] * 100, step[1] * 100)
            elif name == "click_xy":
                x, y = float(args[0]), float(args[1])
                if not (0 <= x <= VIEWPORT["width"] and 0 <= y <= VIEWPORT["height"]):
                    error = f"({x:g}, {y:g}) is outside the {VIEWPORT['width']}x{VIEWPORT['height']} page"
                    return error, await self._snapshot()
                await page.mouse.click(x, y)
            else:  # the env only sends known names
                return f"unknown action {name!r}", await self._snapshot()
        except (PlaywrightError, PageScriptError) as exc:
            if _is_dead(exc):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"{name} failed: {first[:200]}", await self._snapshot()
        return None, await self._snapshot()
