"""A file that is not an importable module (a benchmark script, a `scripts/` tool, another folder's conftest)
loaded as a module, for the tests that call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path | str, name: str | None = None, register: bool = False) -> ModuleType:
    """The module of `path` (relative paths from the repository root), named `name` (default: the file's stem).
    `register`: also put it in `sys.modules` under that name (a dataclass defined in it looks its module up
    there; `benchmarks/async.py` has one)."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
