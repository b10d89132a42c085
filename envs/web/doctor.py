"""Is the web family usable here? Chromium, Playwright, MiniWoB++'s pages, and a real launch.

python -m toolgym.envs.web.doctor
"""

from __future__ import annotations

import subprocess
import time
from importlib.metadata import PackageNotFoundError, version


def checks() -> list[tuple[str, bool, str]]:
    """(what, ok, detail or what to install) for each requirement, the launch last."""
    out: list[tuple[str, bool, str]] = []
    from toolgym.envs.web.browser import chromium_path
    from toolgym.errors import ConfigError

    try:
        path = chromium_path()
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
        hint = (
            ""
            if "headless-shell" in path
            else " (apt-get install -y chromium-headless-shell: less CPU per step)"
        )
        out.append(("chromium", True, f"{path}: {text}{hint}"))
    except (ConfigError, OSError, subprocess.SubprocessError) as exc:
        out.append(("chromium", False, f"{exc} (Debian: apt-get install -y chromium-headless-shell)"))
    for package in ("playwright", "miniwob"):
        try:
            out.append((package, True, version(package)))
        except PackageNotFoundError:
            out.append(
                (
                    package,
                    False,
                    "pip install 'toolgym[web]' (never `playwright install`: Debian's Chromium is used)",
                )
            )
    if all(ok for _, ok, _ in out):
        try:
            import gymnasium as gym

            import toolgym  # noqa: F401
            from toolgym.envs.base import tool_env

            start = time.perf_counter()
            env = gym.make("toolgym/MiniWoB-click-button-v0")
            try:
                env.reset(seed=0)
                _, _, _, _, info = env.step(tool_env(env).expert_action())
            finally:
                env.close()
            ok = bool(info.get("success"))
            out.append(("launch", ok, f"click-button solved={ok} in {time.perf_counter() - start:.1f}s"))
        except Exception as exc:  # the report says what failed, it does not crash
            out.append(("launch", False, f"{type(exc).__name__}: {exc}"))
    return out


def main() -> int:
    results = checks()
    for what, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
