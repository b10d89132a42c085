"""The model an engine runs: its shape read off the HF config, its weights packed from a live HF model.

Supported: Llama- and Qwen2-family causal LMs (``llama``, ``qwen2``, ``mistral`` without a sliding window):
RMSNorm, rotary positions (any rope type whose ``inv_freq`` does not depend on the sequence length), GQA
attention with optional q/k/v biases, a SiLU-gated MLP, tied or separate embeddings. ``unsupported(model)``
says why another model is not (the caller then falls back to the HF path).

Packing: q/k/v are concatenated into one ``[(H + 2·Hkv)·D, hidden]`` matrix and gate/up into one
``[2·I, hidden]`` matrix per layer, all layers stacked, in the engine's dtype. ``PackedWeights.refresh``
re-packs in place from the live model whenever its weights may have changed (``agents/weights_version.py``:
after any torch optimizer step, fused ones included, or an in-place write); a write through ``p.data`` needs
``EnginePolicy.refresh(force=True)``.
The engine reads the trainer's current weights with no transfer and no reload, and
the buffers keep their addresses, so captured CUDA graphs stay valid. LoRA adapters (peft) are merged
into the packed copy (``W + scale·B·A``); the trainer's model is never modified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from toolgym.agents.weights_version import WeightsVersion, weights_version

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    tied: bool

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    @property
    def qkv_dim(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * torch.empty((), dtype=dtype).element_size()


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (or the model itself)."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def unsupported(model: Any) -> str | None:
    """Why the engine cannot run ``model`` (None when it can)."""
    base = base_model(model)
    cfg = getattr(base, "config", None)
    if cfg is None:
        return f"{type(model).__name__} has no HF config"
    kind = getattr(cfg, "model_type", "")
    if kind not in SUPPORTED_TYPES:
        return f"model_type {kind!r} is not one of {SUPPORTED_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if getattr(cfg, "use_sliding_window", False) or (
        kind == "mistral" and getattr(cfg, "sliding_window", None)
    ):
        return "sliding-window attention"
    inner = getattr(base, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "embed_tokens"):
        return (
            f"{type(base).__name__} does not have the Llama module layout (model.layers, model.embed_tokens)"
        )
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "no rotary embedding module with inv_freq"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) in (
        "dynamic",
        "longrope",
    ):
        return f"rope type {rope.get('rope_type')!r} depends on the sequence length"
    return None


def shape_of(model: Any) -> ModelShape:
    cfg = base_model(model).config
    heads = int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    return ModelShape(
        vocab=int(cfg.vocab_size),
        hidden=hidden,
        layers=int(cfg.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
        intermediate=int(cfg.intermediate_size),
        eps=float(cfg.rms_norm_eps),
        tied=bool(getattr(cfg, "tie_word_embeddings", False)),
    )


def effective_weight(mod: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of a linear layer, LoRA deltas of the active adapters added (peft ``LoraLayer``)."""
    base = getattr(mod, "base_layer", None)
    if base is None:
        return mod.weight, getattr(mod, "bias", None)
    w = base.weight
    if not getattr(mod, "merged", False) and not getattr(mod, "disable_adapters", False):
        adapters = getattr(mod, "active_adapters", None) or []
        for name in adapters:
            if name in getattr(mod, "lora_A", {}):
                w = w + mod.get_delta_weight(name).to(w.dtype)
    return w, getattr(base, "bias", None)


class PackedWeights:
    """Fused, stacked copies of a live model's weights (see the module docstring); ``refresh`` re-packs."""

    def __init__(self, model: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.shape = s = shape_of(model)
        self.device, self.dtype = device, dtype
        layers = base_model(model).model.layers
        attn0, mlp0 = layers[0].self_attn, layers[0].mlp

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, device=device, dtype=dtype)

        L = s.layers
        self.embed = empty(s.vocab, s.hidden)
        self.lm_head = self.embed if s.tied else empty(s.vocab, s.hidden)
        self.norm = empty(s.hidden)
        self.ln1, self.ln2 = empty(L, s.hidden), empty(L, s.hidden)
        self.wqkv = empty(L, s.qkv_dim, s.hidden)
        self.wo = empty(L, s.hidden, s.heads * s.head_dim)
        self.wgu = empty(L, 2 * s.intermediate, s.hidden)
        self.wd = empty(L, s.hidden, s.intermediate)
        self.bqkv = empty(L, s.qkv_dim) if effective_weight(attn0.q_proj)[1] is not None else None
        self.bo = empty(L, s.hidden) if effective_weight(attn0.o_proj)[1] is not None else None
        self.bgu = empty(L, 2 * s.intermediate) if effective_weight(mlp0.gate_proj)[1] is not None else None
        self.bd = empty(L, s.hidden) if effective_weight(mlp0.down_proj)[1] is not None else None
        rotary = base_model(model).model.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().to(device=device, dtype=torch.float32).clone()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0) or 1.0)
        self.version: WeightsVersion = (-1, -1, -1)
        self.refresh()

    @torch.no_grad()
    def refresh(self, force: bool = False) -> bool:
        """Re-pack from the live model when its weights changed; True when it did."""
        version = weights_version(self.model)
        if version == self.version and not force:
            return False
        base = base_model(self.model)
        inner = base.model
        self.embed.copy_(inner.embed_tokens.weight)
        if not self.shape.tied:
            self.lm_head.copy_(
                base.lm_head.weight
                if not hasattr(base.lm_head, "base_layer")
                else effective_weight(base.lm_head)[0]
            )
        self.norm.copy_(inner.norm.weight)
        s = self.shape
        q_end, k_end = s.heads * s.head_dim, (s.heads + s.kv_heads) * s.head_dim
        for i, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            self.ln1[i].copy_(layer.input_layernorm.weight)
            self.ln2[i].copy_(layer.post_attention_layernorm.weight)
            for (lo, hi), proj, bias_buf in (
                ((0, q_end), attn.q_proj, self.bqkv),
                ((q_end, k_end), attn.k_proj, self.bqkv),
                ((k_end, s.qkv_dim), attn.v_proj, self.bqkv),
            ):
                w, b = effective_weight(proj)
                self.wqkv[i, lo:hi].copy_(w)
                if bias_buf is not None and b is not None:
                    bias_buf[i, lo:hi].copy_(b)
            w, b = effective_weight(attn.o_proj)
            self.wo[i].copy_(w)
            if self.bo is not None and b is not None:
                self.bo[i].copy_(b)
            for (lo, hi), proj in (
                ((0, s.intermediate), mlp.gate_proj),
                ((s.intermediate, 2 * s.intermediate), mlp.up_proj),
            ):
                w, b = effective_weight(proj)
                self.wgu[i, lo:hi].copy_(w)
                if self.bgu is not None and b is not None:
                    self.bgu[i, lo:hi].copy_(b)
            w, b = effective_weight(mlp.down_proj)
            self.wd[i].copy_(w)
            if self.bd is not None and b is not None:
                self.bd[i].copy_(b)
        self.version = version
        return True

    def nbytes(self) -> int:
        bufs = [self.embed, self.norm, self.ln1, self.ln2, self.wqkv, self.wo, self.wgu, self.wd]
        if not self.shape.tied:
            bufs.append(self.lm_head)
        return sum(b.numel() * b.element_size() for b in bufs)
