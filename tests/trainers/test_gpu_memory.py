"""``free_gpu_memory``: collect, then give the CUDA allocator's cache back; the one place that does it (was:
LSPO's ``_free_gpu`` and the Werewolf pipeline's ``_cleanup``, two copies)."""

from __future__ import annotations

import ast
import gc
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

from toolgym.trainers.gpu_memory import free_gpu_memory

ROOT = Path(__file__).resolve().parents[2]


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _cycle() -> weakref.ref[_Cycle]:
    return weakref.ref(_Cycle())  # only a collection frees it


def test_without_cuda_it_collects_and_leaves_cuda_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("empty_cache without CUDA"))
    gc.disable()
    try:
        ref = _cycle()
        free_gpu_memory()
        assert ref() is None
    finally:
        gc.enable()


def test_with_cuda_it_collects_first_then_empties_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    gc.disable()
    try:
        ref = _cycle()
        seen: list[Any] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: seen.append(ref()))
        free_gpu_memory()
        assert seen == [None]  # once, after the cycle (which may hold CUDA tensors) was collected
    finally:
        gc.enable()


def test_without_torch_it_only_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    gc.disable()
    try:
        ref = _cycle()
        free_gpu_memory()
        assert ref() is None
    finally:
        gc.enable()


def _calls(tree: ast.AST) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_no_other_copy_collects_and_empties_the_cache() -> None:
    """A function that calls both ``gc.collect`` and ``torch.cuda.empty_cache`` is ``free_gpu_memory``."""
    copies = []
    folders = (
        "agents",
        "benchmarks",
        "envs",
        "examples",
        "rewards",
        "sandboxes",
        "scripts",
        "toolgym",
        "trainers",
    )
    for path in sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                calls = _calls(fn)
                if "gc.collect" in calls and "torch.cuda.empty_cache" in calls:
                    copies.append(f"{rel}:{fn.name}")
    assert copies == ["trainers/gpu_memory.py:free_gpu_memory"]
