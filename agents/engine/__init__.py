"""Our decode engine for Llama/Qwen2-family HF models (docs/engine.md).

``EnginePolicy`` is a drop-in ``TokenPolicy``; ``Engine`` is the sequence-level API under it. ``unsupported``
says whether a model can run here (None) or why not; ``make_fast_policy`` picks the engine when it can and
the HF path otherwise. Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolgym.agents.engine.engine import Engine, Seq
    from toolgym.agents.engine.engine_policy import EnginePolicy

__all__ = ["Engine", "EnginePolicy", "Seq", "unsupported"]

_LAZY = {
    "Engine": "toolgym.agents.engine.engine",
    "Seq": "toolgym.agents.engine.engine",
    "EnginePolicy": "toolgym.agents.engine.engine_policy",
    "unsupported": "toolgym.agents.engine.weights",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'toolgym.agents.engine' has no attribute {name!r}")
