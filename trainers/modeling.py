"""Loading the model to train: the policy behind the rollout engine, LoRA, the reference, the value head."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from toolgym.agents.policy import context_of
from toolgym.errors import ConfigError
from toolgym.optional import require
from toolgym.trainers.config import RunConfig


def pick_device(name: str, threads: int = 0) -> torch.device:
    """The device to train on; also sets torch's CPU thread count when `threads` > 0."""
    if threads > 0:
        torch.set_num_threads(threads)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for but CUDA is not available; use --device cpu")
    return torch.device(name)


def build_policy(cfg: RunConfig, device: torch.device, model: Any = None, tokenizer: Any = None) -> Any:
    """An `HFPolicy` on `device` with fp32 weights (bf16 comes from autocast), LoRA applied when asked.

    `model`/`tokenizer` may be passed already loaded (tests build a tiny one); otherwise `cfg.model`.
    """
    from toolgym.agents.hf import load_model

    if model is None:
        model, tokenizer = load_model(cfg.model, device=str(device), dtype="float32")
    check_positions(cfg, model)
    model = model.to(device=device, dtype=torch.float32)
    if cfg.lora_r > 0:
        peft = require("peft", why="lora_r > 0 trains LoRA adapters")
        check_lora_targets(model, list(cfg.lora_targets))
        lora = peft.LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets), lora_dropout=0.0
        )
        model = peft.get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    return hf_policy(model, tokenizer, device)


def check_positions(cfg: Any, model: Any) -> None:
    """At start, whether a path of ``max_total_tokens`` plus a last turn of ``max_new_tokens`` fits the model's
    positions (``config.max_position_embeddings``). Past them a model with learned position embeddings fails
    mid-run (a ConfigError now), and a rotary one runs on positions it never trained on (a warning)."""
    positions = context_of(model)
    total, new = getattr(cfg, "max_total_tokens", None), getattr(cfg, "max_new_tokens", 0) or 0
    if positions is None or not isinstance(total, int) or total + new <= positions:
        return
    what = (
        f"max_total_tokens ({total}) + max_new_tokens ({new}) = {total + new} tokens pass the model's "
        f"{positions} positions (config.max_position_embeddings)"
    )
    config = getattr(model, "config", None)
    if all(getattr(config, k, None) is None for k in ("rope_theta", "rope_scaling", "rope_parameters")):
        raise ConfigError(
            f"{what}: lower max_total_tokens (its positions are learned: longer paths would fail)"
        )
    warnings.warn(f"{what}: later tokens run on rotary positions the model never trained on", stacklevel=2)


def check_lora_targets(model: Any, targets: list[str]) -> None:
    """A ConfigError naming every `lora_targets` entry that names no module of `model` (as peft matches them:
    the whole name or its dotted tail). peft fails only when none matches and silently adapts the rest
    otherwise: on Phi-3, whose q, k and v are one `qkv_proj`, the default targets would train `o_proj` alone."""
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        leaves = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise ConfigError(
            f"lora_targets {missing} name no module of this {kind} model (its linear layers: {', '.join(leaves)}); "
            "set lora_targets"
        )


def hf_policy(model: Any, tokenizer: Any, device: torch.device) -> Any:
    """The rollout's ``HFPolicy`` over ``model`` (the live model, or fsdp2's full-weight copy)."""
    from toolgym.agents.hf import HFPolicy

    # on CPU a turn continues from the KV cache of the turns before it instead of prefilling the whole
    # conversation again (rollouts and evaluations run between weight updates, which drop the kept caches)
    return HFPolicy(model, tokenizer, batch_size=256, reuse_kv=device.type == "cpu")


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA when asked; nothing on CPU."""
    if device.type == "cuda" and bf16:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Reference:
    """Logprobs of the initial policy for the KL term: the base model with adapters off (LoRA), or a frozen copy."""

    def __init__(self, model: Any, frozen: Any = None) -> None:
        """``frozen``: the initial policy already copied (fsdp2 shards it before the model, which FSDP then
        cannot copy: trainers/fsdp.py)."""
        self.lora = hasattr(model, "disable_adapter")
        if frozen is None and not self.lora:
            from toolgym.trainers.fsdp import initial_copy, is_sharded

            frozen = (
                initial_copy(model)
                if is_sharded(model)
                else copy.deepcopy(model).eval().requires_grad_(False)
            )
        self.frozen = frozen
        self.model = model

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """The model to call for reference logprobs (use under torch.no_grad)."""
        if self.frozen is not None:
            yield self.frozen
        else:
            with self.model.disable_adapter():
                yield self.model


def value_head(model: Any) -> torch.nn.Module:
    """A linear value head on the last hidden state, zero-initialised (V = 0 at the start)."""
    hidden = (
        model.config.get_text_config().hidden_size
        if hasattr(model.config, "get_text_config")
        else model.config.hidden_size
    )
    head = torch.nn.Linear(hidden, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


def trainable_parameters(*modules: Any) -> list[torch.nn.Parameter]:
    return [p for m in modules if m is not None for p in m.parameters() if p.requires_grad]


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clips the gradients' total norm to ``max_norm`` (0: no clipping); returns the norm before clipping, a
    plain tensor also when the parameters are sharded (FSDP2's DTensors give a DTensor norm)."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf"))
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def make_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; the fused kernel on CUDA (one launch per step, not per tensor)."""
    params = trainable_parameters(model)
    fused = True if params and all(p.is_cuda for p in params) else None
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)
