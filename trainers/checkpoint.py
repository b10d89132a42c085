"""Exact save/resume: weights, optimizer, RNG states, step and data position, in one folder.

The checkpoint is written to a temporary folder and renamed into place, so a run killed mid-save keeps
the previous checkpoint. Rollouts draw their randomness from (seed, step), so a resumed run samples the
same next batch as an uninterrupted one. What the add-ons keep between steps (EPO's entropy history,
the replay buffer and its random draws, the task pool's cursor and rates) is saved with it (`extra`).
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toolgym.errors import ConfigError


@dataclass
class Progress:
    step: int = 0  # training steps done
    data_pos: int = 0  # tasks drawn so far (the next task index)
    extra: dict[str, Any] | None = None  # the run's other state (`AddonState.state_dict`), as saved


def save(
    folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer, progress: Progress,
    extra: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Writes `folder` (replacing it atomically): one state dict per module, optimizer, RNG, progress, and
    `extra` (picklable: the add-ons' state)."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name, module in modules.items():
        if module is not None:
            torch.save(module.state_dict(), tmp / f"{name}.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    state = {"rng": rng, "step": progress.step, "data_pos": progress.data_pos, "extra": extra}
    torch.save(state, tmp / "state.pt")
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        if old.exists():
            shutil.rmtree(old)
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old)


def load(folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer) -> Progress:
    """Restores what `save` wrote into the given modules and optimizer; returns the progress."""
    if not (folder / "state.pt").is_file():
        raise ConfigError(
            f"no checkpoint in {folder}: run without resume first (or point output_dir at a run)"
        )
    for name, module in modules.items():
        if module is not None:
            module.load_state_dict(torch.load(folder / f"{name}.pt", map_location="cpu", weights_only=False))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False))
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return Progress(step=int(state["step"]), data_pos=int(state["data_pos"]), extra=state.get("extra"))
