"""``toolgym serve --weight-updates``: the served weights replaced by a trainer, through vLLM's dev endpoints.

A trainer with ``engine: vllm``, ``rollout_servers`` and ``weight_sync: disk`` (agents/vllm_policy.py
``DiskSync``) writes ``model.safetensors`` into a folder and then, on every server: ``POST /pause?mode=keep``,
``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": FOLDER}}``,
``POST /reset_prefix_cache``, ``POST /resume``. This module is the server's side of that:

- ``PauseGate``: the batcher asks it before each batch. ``pause()`` returns once no batch runs, and none starts
  until ``resume()``: requests that arrive meanwhile stay queued and are answered after (never dropped).
  ``exclusive()`` holds the batcher off while weights are loaded or caches dropped (between batches).
- ``WeightUpdates``: ``reload_weights`` checks the whole file against the model before writing anything
  (names, shapes), so a wrong file is a 400 and the served model stays as it was; then the copy, the policy's
  re-pack (``refresh(force=True)``: our engine's packed weights) and its caches dropped (``clear_kv``).

Anyone who can reach the port can replace the weights (and make the server read any safetensors file it can
open): keep such a server on a private network.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolgym.errors import ConfigError

PAUSE_MODES = ("keep",)  # vLLM's abort/wait are not offered: a running batch always finishes first


class PauseGate:
    """Batches and weight writes take turns: one batch, or one exclusive holder, at a time; none while
    paused but the holders (a reload between ``/pause`` and ``/resume``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.paused = False
        self._busy = False  # a batch is generating or a holder has the model
        self._wanted = 0  # holders waiting: the batcher lets them go first (no starving under load)
        self._closed = False

    def enter(self) -> bool:
        """Before a batch: waits until not paused and nothing else holds the model. False when the server is
        closing while paused (the batch must not run: its jobs are answered as shut down)."""
        with self._cond:
            self._cond.wait_for(
                lambda: (self._closed and self.paused) or not (self.paused or self._busy or self._wanted)
            )
            if self._closed and self.paused:
                return False
            self._busy = True
            return True

    def leave(self) -> None:
        """After a batch."""
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def pause(self) -> None:
        """No batch starts from now on; returns once the running one (if any) has ended. Twice is harmless."""
        with self._cond:
            self.paused = True
            self._cond.wait_for(lambda: not self._busy)

    def resume(self) -> None:
        """Batches go on (harmless when not paused)."""
        with self._cond:
            self.paused = False
            self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The model to oneself between batches (paused or not): waits for the running batch to end."""
        with self._cond:
            self._wanted += 1
            try:
                self._cond.wait_for(lambda: not self._busy)
            finally:
                self._wanted -= 1
            self._busy = True
        try:
            yield
        finally:
            self.leave()

    def close(self) -> None:
        """The server is closing: a batcher waiting on a pause is let go (to answer its jobs as shut down)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class CollectiveRpc(BaseModel):
    """vLLM's ``POST /collective_rpc`` body (only ``reload_weights`` with ``weights_path`` is served)."""

    model_config = ConfigDict(extra="forbid")
    method: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    timeout: float | None = None


class WeightUpdates:
    """The weight-update calls of a server over ``policy`` (its ``model`` a torch module), taking turns with
    the batcher through ``gate``."""

    def __init__(self, policy: Any, gate: PauseGate) -> None:
        self.policy, self.gate = policy, gate
        self.epoch = 0  # reloads so far (a continuous batcher restarts its turns in flight after one)

    def call(self, rpc: CollectiveRpc) -> dict[str, Any]:
        """vLLM's answer shape (one result per worker: we are one)."""
        if rpc.method != "reload_weights":
            raise ConfigError(
                f"unsupported collective_rpc method {rpc.method!r}: this server runs only 'reload_weights'"
            )
        if rpc.args:
            raise ConfigError("reload_weights takes its folder as kwargs.weights_path, not as args")
        extra = sorted(set(rpc.kwargs) - {"weights_path", "is_checkpoint_format"})
        if rpc.kwargs.get("is_checkpoint_format", True) is not True:
            extra.append("is_checkpoint_format")  # (only checkpoint-format files: what DiskSync writes)
        if extra:
            raise ConfigError(
                f"reload_weights takes weights_path (a folder with model.safetensors); not {extra}"
            )
        path = rpc.kwargs.get("weights_path")
        if not isinstance(path, str) or not path:
            raise ConfigError("reload_weights needs kwargs.weights_path: a folder holding model.safetensors")
        self.reload(path)
        return {"results": [None]}

    def reload(self, weights_path: str) -> None:
        """``weights_path/model.safetensors`` into the policy's model, cast to each parameter's dtype and
        device; all checked first (a ConfigError leaves the model unchanged), written between batches."""
        import torch

        file = Path(weights_path) / "model.safetensors"
        if not file.is_file():
            raise ConfigError(
                f"no weights at {file}: weights_path must be a folder holding model.safetensors"
            )
        model = getattr(self.policy, "model", None)
        if model is None or not hasattr(model, "named_parameters"):
            raise ConfigError(
                f"the served policy ({type(self.policy).__name__}) has no model to load weights into"
            )
        tensors = _read(file)
        params = dict(model.named_parameters())
        problem = mismatch(params, tensors)
        if problem is not None:
            raise ConfigError(
                f"{file} does not fit the served model: {problem}; the weights were not changed"
            )
        with self.gate.exclusive(), torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[name].to(device=p.device, dtype=p.dtype))
            refresh = getattr(self.policy, "refresh", None)
            if callable(refresh):  # our engine re-packs its fused copy of the weights
                refresh(force=True)
            self._clear()
            self.epoch += 1

    def reset_prefix_cache(self) -> dict[str, bool]:
        """Drop the policy's kept KV caches (between batches); vLLM's answer."""
        with self.gate.exclusive():
            self._clear()
        return {"success": True}

    def _clear(self) -> None:
        clear = getattr(self.policy, "clear_kv", None)
        if callable(clear):
            clear()


def _read(file: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not a readable safetensors file: {exc}") from exc


def mismatch(params: Mapping[str, Any], tensors: Mapping[str, Any]) -> str | None:
    """The first way ``tensors`` (name -> tensor) fails to be exactly ``params`` (the model's
    ``named_parameters()``): an unexpected name, a shape or dtype kind that differs, a missing parameter.

    >>> import torch
    >>> p = {"a": torch.zeros(2), "b": torch.zeros(3)}
    >>> mismatch(p, {"a": torch.ones(2), "b": torch.ones(3)}) is None
    True
    >>> mismatch(p, {"a": torch.ones(2)})
    "missing parameter 'b'"
    >>> mismatch(p, {"a": torch.ones(2), "b": torch.ones(3), "c": torch.ones(1), "d": torch.ones(1)})
    "unexpected tensor 'c' (not a parameter of the model; and 1 more)"
    >>> mismatch(p, {"a": torch.ones(2), "b": torch.ones(4)})
    "shape of 'b': [4] in the file, [3] in the model"
    """
    unexpected = [n for n in tensors if n not in params]
    if unexpected:
        more = f"; and {len(unexpected) - 1} more" if len(unexpected) > 1 else ""
        return f"unexpected tensor {unexpected[0]!r} (not a parameter of the model{more})"
    for name, p in params.items():
        t = tensors.get(name)
        if t is None:
            missing = sum(1 for n in params if n not in tensors)
            more = f" (and {missing - 1} more)" if missing > 1 else ""
            return f"missing parameter {name!r}{more}"
        if tuple(t.shape) != tuple(p.shape):
            return f"shape of {name!r}: {list(t.shape)} in the file, {list(p.shape)} in the model"
        if p.is_floating_point() and not t.is_floating_point():
            return f"{name!r} is {t.dtype} in the file, a floating-point parameter in the model"
    return None
