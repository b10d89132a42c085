"""A training run that dies right after one of its checkpoints, for the resume tests (SFT, GRPO, PPO, the
option matrix): the run is then resumed from that checkpoint and compared with one never stopped.

    with dies_after_save(monkeypatch, step=2):
        train(cfg_with_save_every_1, model, tokenizer)   # saves step 2, then raises Killed (expected)
    train(cfg_with_resume_true, other_model, tokenizer)  # the real checkpoint.save again
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class Killed(Exception):
    """Raised by ``checkpoint.save`` right after it saved the step ``dies_after_save`` names."""


@contextlib.contextmanager
def dies_after_save(monkeypatch: pytest.MonkeyPatch, step: int) -> Iterator[None]:
    """Inside the block ``checkpoint.save`` saves, then raises ``Killed`` once the step it saved is ``step``;
    the block must end with that ``Killed`` (a run that never saves ``step`` fails the test). After it,
    ``checkpoint.save`` is the real one again."""
    from toolgym.trainers import checkpoint

    save = checkpoint.save

    def save_then_die(folder: Path, *args: Any, **kwargs: Any) -> None:
        save(folder, *args, **kwargs)
        progress = kwargs["progress"] if "progress" in kwargs else args[2]  # (modules, optimizer, progress)
        if progress.step == step:
            raise Killed

    monkeypatch.setattr(checkpoint, "save", save_then_die)
    try:
        with pytest.raises(Killed):
            yield
    finally:
        monkeypatch.setattr(checkpoint, "save", save)
