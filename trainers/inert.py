"""Inert options of `RunConfig` (model, engine, update) that both GRPO's and PPO's `inert_options` report.

Like config.py it imports no torch: `toolgym train` warns with each message before anything is loaded.
"""

from __future__ import annotations

from typing import Any


def run_inert(cfg: Any, changed: set[str]) -> list[str]:
    """The `RunConfig` options (model, engine, update) that do nothing under the other settings."""
    out = []
    lora = sorted(n for n in ("lora_alpha", "lora_targets") if n in changed)
    if lora and not cfg.lora_r:
        out.append(f"{', '.join(lora)}: inert with lora_r = 0 (every weight trains)")
    if cfg.fsdp_offload and cfg.parallel != "fsdp2":
        out.append("fsdp_offload: inert unless parallel=fsdp2")
    if "weight_sync" in changed and not cfg.rollout_servers:
        out.append("weight_sync: inert without rollout_servers (it is how new weights reach vLLM servers)")
    if "weight_sync_folder" in changed and cfg.weight_sync != "disk":
        out.append("weight_sync_folder: inert unless weight_sync=disk")
    if "engine_memory" in changed and cfg.engine == "hf":
        out.append("engine_memory: inert with engine=hf (no KV cache is reserved)")
    if cfg.device == "cpu" and getattr(cfg, "compile", "auto") == "on":
        out.append("compile=on: inert on CPU (the update is compiled on CUDA only)")
    if (
        cfg.device == "cpu"
        and getattr(cfg, "packing", "") == "auto"
        and getattr(cfg, "share_prefix", "") == "on"
    ):
        out.append(
            "share_prefix=on: inert with packing=auto on CPU (auto packs on CUDA only); set packing: on"
        )
    return out
