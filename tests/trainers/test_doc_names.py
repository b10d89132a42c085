"""Docs and benchmarks name a trainer function by the module that defines it (``grpo_update.optimize``),
not by a module that merely re-exports it (``grpo.optimize``): a reader who opens the named file finds it."""

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = {p.stem for p in (ROOT / "trainers").glob("*.py")}
NAMED = re.compile(
    r"`{1,2}([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\(\))?`{1,2}|\(([a-z_]+)\.([a-z_]+)\)"
)


def named(path):
    for m in NAMED.finditer(path.read_text()):
        module, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        if module in TRAINERS:
            yield module, name


@pytest.mark.parametrize("rel", ["docs/engine.md", "benchmarks/update.py"])
def test_trainer_names_point_at_the_defining_module(rel):
    wrong = []
    for module, name in named(ROOT / rel):
        obj = getattr(importlib.import_module(f"toolgym.trainers.{module}"), name, None)
        if (
            inspect.isfunction(obj) or inspect.isclass(obj)
        ) and obj.__module__ != f"toolgym.trainers.{module}":
            wrong.append(f"{module}.{name} is {obj.__module__}.{name}")
    assert not wrong, f"{rel}: {wrong}"
