"""``--agent hf:RUN_DIR``: the model a training run made, as a transformers folder ``hf:`` can load.

- A ``toolgym sft`` run keeps its model in ``RUN_DIR/model`` (what ``train --init`` reads): used as it is.
- A ``toolgym train`` run (GRPO, PPO) keeps state dicts in ``RUN_DIR/checkpoint/model.pt`` and its settings in
  ``RUN_DIR/config.json``. The first use writes ``RUN_DIR/model``: the run's starting model (``model`` in its
  config: an embedded name, a folder or a hub id) with the checkpoint's weights, and its tokenizer; written to
  a temporary folder and renamed into place, and rewritten when the checkpoint is newer.
- Anything else (a model folder, a hub id, ``smollm2-135m``) passes through.

``run_env_kwargs`` gives the env settings a run evaluated on (its ``env_kwargs`` with its ``eval_env_kwargs``
over them): a model trained on a prompt format and system prompt is evaluated on the same ones.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError
from toolgym.optional import require


def run_model(spec: str) -> str:
    """The model folder for ``spec`` (see the module docstring); ``spec`` itself when it is not a run."""
    run = Path(spec)
    if not run.is_dir():
        return spec  # a hub id or an embedded name
    model = run / "model"
    weights = run / "checkpoint" / "model.pt"
    if not (run / "checkpoint").exists() and (run / "checkpoint.old" / "model.pt").is_file():
        weights = run / "checkpoint.old" / "model.pt"  # a save cut between its renames (checkpoint.complete)
    if weights.is_file():  # a train run: its weights over its starting model, exported once per checkpoint
        if not (model / "config.json").is_file() or model.stat().st_mtime < weights.stat().st_mtime:
            _export(run, weights, model)
        return str(model)
    if (model / "config.json").is_file():  # an SFT run
        return str(model)
    return spec  # a model folder


def run_env_kwargs(spec: str) -> dict[str, Any] | None:
    """The env settings of the run at ``spec`` (a run's config.json has an ``algorithm``); None otherwise."""
    path = Path(spec) / "config.json"
    try:
        settings = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(settings, dict) or "algorithm" not in settings:
        return None  # a model's own config.json
    return {**(settings.get("env_kwargs") or {}), **(settings.get("eval_env_kwargs") or {})}


def _export(run: Path, weights: Path, target: Path) -> None:
    # first: a missing package names its extra (the imports below keep their types)
    require("torch", why="exporting a run's weights")
    require("transformers", why="exporting a run's weights")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolgym.agents.embedded import resolve_model

    try:
        settings = json.loads((run / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{run}/config.json cannot be read ({exc}): is {run} a `toolgym train` run?"
        ) from exc
    if int(settings.get("lora_r") or 0) > 0:
        raise ConfigError(
            f"{run} trained LoRA adapters (lora_r={settings['lora_r']}): load its base model and "
            f"{weights} with peft; hf:RUN_DIR reads full-weight runs"
        )
    base = str(settings.get("model") or "")
    if not base:
        raise ConfigError(
            f"{run}/config.json names no model: cannot tell what {weights} holds the weights of"
        )
    if (base.startswith((".", "/")) or base.startswith("runs/")) and not Path(base).exists():
        raise ConfigError(
            f"{run} started from {base}, which is not here (run from the folder it was trained in)"
        )
    source = resolve_model(base)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    state = torch.load(weights, map_location="cpu", weights_only=True)
    # a compiled model's state dict names its parameters under _orig_mod.
    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(f"{weights} does not fit {base} ({str(exc).splitlines()[0]})") from exc
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
    old = target.with_name(target.name + ".old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
