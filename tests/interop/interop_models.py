"""Fixtures for the interop tests (imported by the test modules): the tiny tokenizers and models of
tests/agents/conftest.py."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location(
    "toolgym_tests_agents_conftest", Path(__file__).parents[1] / "agents" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
agents_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agents_fixtures)


@functools.cache
def chatml_policy() -> Any:
    """A tiny random Llama behind SmolLM2's template shape (no tools support in the template)."""
    from toolgym.agents import HFPolicy

    tok = agents_fixtures.make_tokenizer(agents_fixtures.CHATML)
    return HFPolicy(agents_fixtures.tiny_model(len(tok)), tok)


@functools.cache
def qwen_style_policy() -> Any:
    """A tiny random Llama behind a template that renders ``tools`` itself."""
    from toolgym.agents import HFPolicy

    tok = agents_fixtures.make_tokenizer(agents_fixtures.QWEN_STYLE)
    return HFPolicy(agents_fixtures.tiny_model(len(tok), seed=1), tok)
