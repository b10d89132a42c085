"""Exact save/resume: weights, optimizer, RNG states, step and data position, in one folder.

The checkpoint is written to a temporary folder and renamed into place, so a run killed mid-save keeps
the previous checkpoint. Rollouts draw their randomness from (seed, step), so a resumed run samples the
same next batch as an uninterrupted one. What the add-ons keep between steps (EPO's entropy history,
the replay buffer and its random draws, the task pool's cursor and rates) is saved with it (`extra`).

Two formats, told apart on load: one process writes one ``torch.save`` file per module plus
``optimizer.pt``; when a module is sharded (``parallel: fsdp2``, trainers/fsdp.py) every rank writes its
shards of the weights and AdamW state into ``dcp/`` (torch.distributed.checkpoint), keyed by parameter name,
so the run resumes on any number of ranks (or in one process, sharded or not). Then ``{name}.pt`` only
says that the module is in ``dcp/``, and rank 0 writes ``state.pt`` (RNG, progress, ``extra``).
"""

from __future__ import annotations

import copy
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from toolgym.errors import ConfigError

if TYPE_CHECKING:
    from toolgym.trainers.config import RunConfig

IN_DCP = {"in": "dcp"}  # what {name}.pt holds when the module's weights are in dcp/
C = TypeVar("C", bound="RunConfig")


@dataclass
class Progress:
    step: int = 0  # training steps done
    data_pos: int = 0  # tasks drawn so far (the next task index)
    extra: dict[str, Any] | None = None  # the run's other state (`AddonState.state_dict`), as saved
    missing: tuple[str, ...] = ()  # `load`'s optional modules the checkpoint did not hold


def save(
    folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer, progress: Progress,
    extra: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Writes `folder` (replacing it atomically): one state dict per module, optimizer, RNG, progress, and
    `extra` (picklable: the add-ons' state). With a sharded module every rank must call it (DCP)."""
    if any(_sharded(m) for m in modules.values()):
        _save_dcp(folder, modules, optimizer, progress, extra)
        return
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name, module in modules.items():
        if module is not None:
            torch.save(module.state_dict(), tmp / f"{name}.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    _save_state(tmp, progress, extra)
    _swap(tmp, folder)


def _save_state(tmp: Path, progress: Progress, extra: dict[str, Any] | None) -> None:
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    state = {"rng": rng, "step": progress.step, "data_pos": progress.data_pos, "extra": extra}
    torch.save(state, tmp / "state.pt")


def _swap(tmp: Path, folder: Path) -> None:
    """`tmp` becomes `folder`; the previous `folder` is removed only once the new one is in place."""
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        if old.exists():
            shutil.rmtree(old)
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old)


def load(
    folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer, optional: tuple[str, ...] = ()
) -> Progress:
    """Restores what `save` wrote into the given modules and optimizer; returns the progress. A module named
    in `optional` that the checkpoint does not hold (the KL reference of a run saved with kl_coef = 0) keeps
    its weights and is listed in `Progress.missing`."""
    folder = complete(folder)  # every file below is read from this one folder (`.old` after a cut save)
    missing = tuple(k for k in optional if modules.get(k) is not None and not (folder / f"{k}.pt").is_file())
    modules = {k: m for k, m in modules.items() if k not in missing}
    if not (folder / "state.pt").is_file():
        raise ConfigError(
            f"no checkpoint in {folder}: run without resume first, point output_dir at a run, or give "
            "resume: auto (--resume auto: resume when there is a checkpoint, else start fresh)"
        )
    if (folder / "dcp").is_dir():
        _load_dcp(folder, modules, optimizer)
    elif any(_sharded(m) for m in modules.values()):
        raise ConfigError(
            f"{folder} was saved by one process (torch.save files): resume it with parallel=ddp, not fsdp2"
        )
    else:
        for name, module in modules.items():
            if module is not None:
                module.load_state_dict(
                    torch.load(folder / f"{name}.pt", map_location="cpu", weights_only=False)
                )
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False))
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return Progress(
        step=int(state["step"]), data_pos=int(state["data_pos"]), extra=state.get("extra"), missing=missing
    )


def complete(folder: Path) -> Path:
    """`folder`, or the previous save when a run stopped between `_swap`'s two renames (the new save is then
    complete in ``.tmp`` but not known to be, and ``.old`` is the last one that was in place)."""
    old = folder.with_name(folder.name + ".old")
    if not folder.exists() and (old / "state.pt").is_file():
        return old
    return folder


def exists(folder: Path) -> bool:
    """Whether `folder` (or the previous save `complete` falls back to) holds a checkpoint `load` can read."""
    return (complete(folder) / "state.pt").is_file()


def resolve_resume(cfg: C) -> C:
    """`cfg` with its `resume` decided: ``auto`` is true when ``output_dir/checkpoint`` holds a checkpoint, else
    false (a fresh start: what a SLURM requeue script runs every time). A copy: the caller's config keeps
    ``auto`` for its next run. True stays true (`load` then requires the checkpoint)."""
    if cfg.resume != "auto":
        return cfg
    out = copy.copy(cfg)
    out.resume = exists(Path(cfg.output_dir) / "checkpoint")
    return out


def saved_step(folder: Path) -> int | None:
    """The step of the checkpoint in `folder` (None when there is none)."""
    folder = complete(folder)
    if not (folder / "state.pt").is_file():
        return None
    return int(torch.load(folder / "state.pt", map_location="cpu", weights_only=False)["step"])


def due(cfg: Any, step: int) -> bool:
    """Whether the loop saves after `step` (`save_every` steps, and the last one)."""
    return bool((cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps)


def save_shards(
    dist: Any, cfg: Any, step: int, folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer,
    progress: Progress,
) -> None:  # fmt: skip
    """The other ranks' part of a sharded (DCP) save: the loop's rank 0 calls `save` itself, after evaluating."""
    if dist.sharded and not dist.main and due(cfg, step):
        save(folder, modules, optimizer, progress)


def _sharded(module: Any) -> bool:
    if module is None:
        return False
    from toolgym.trainers.fsdp import is_sharded

    return is_sharded(module)


def _container(modules: dict[str, Any]) -> torch.nn.Module:
    """The modules under one parent, so that parameter names (and the optimizer's keys) say which is which."""
    return torch.nn.ModuleDict({k: m for k, m in modules.items() if m is not None})


def _rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _save_dcp(
    folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer, progress: Progress,
    extra: dict[str, Any] | None,
) -> None:  # fmt: skip
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    tmp = folder.with_name(folder.name + ".tmp")
    if _rank0():
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    box = _container(modules)
    state = {"model": get_model_state_dict(box), "optimizer": get_optimizer_state_dict(box, optimizer)}
    dcp.save(state, checkpoint_id=str(tmp / "dcp"))
    if _rank0():
        for name, module in modules.items():
            if module is not None:
                torch.save(IN_DCP, tmp / f"{name}.pt")
        _save_state(tmp, progress, extra)
    _barrier()  # every rank's shards are written
    if _rank0():
        _swap(tmp, folder)
    _barrier()  # nobody reads the folder before it is in place


def _load_dcp(folder: Path, modules: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Weights and AdamW state from dcp/ into the modules, sharded over any number of ranks or not at all."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    box = _container(modules)
    weights, adam = get_model_state_dict(box), get_optimizer_state_dict(box, optimizer)
    dcp.load({"model": weights, "optimizer": adam}, checkpoint_id=str(folder / "dcp"))  # fills both in place
    set_model_state_dict(box, weights)
    set_optimizer_state_dict(box, optimizer, adam)
