"""Which rollout engine a trainer uses: ``engine: auto | fast | hf | vllm`` (``RunConfig.engine``).

``auto`` takes our engine on CUDA for the architectures it supports and the HF path otherwise (CPU, or
another architecture), and says which and why on stderr; ``fast`` insists on our engine (it also runs,
slowly, on CPU; an unsupported architecture is a ``ConfigError``); ``hf`` keeps ``HFPolicy``; ``vllm`` samples
with vLLM (agents/vllm_policy.py, docs/vllm.md): in this process (``memory`` of the GPU, asleep during the update)
or on ``servers`` (OpenAI-compatible URLs; a comma-separated entry counts as several).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from toolgym.errors import ConfigError

ENGINES = ("auto", "fast", "hf", "vllm")


def check_memory(memory: float) -> None:
    """``engine_memory`` is a share of free GPU memory: (0, 0.9] (the rest is the trainer's)."""
    if not 0 < memory <= 0.9:
        raise ConfigError(f"engine_memory must be in (0, 0.9], got {memory}")


def budget_slots(budget: int, capacity: int, bytes_per_token: int, who: str, fix: str) -> int:
    """How many sequences of ``capacity`` tokens a KV cache of ``budget`` bytes holds (its part of the run's
    memory estimate) beside its scratch slot (kv_slots.py); a ``ConfigError`` (``who`` gets …: ``fix``) when
    not one."""
    per_slot = max(1, capacity * bytes_per_token)
    fit = budget // per_slot - 1
    if fit < 1:
        raise ConfigError(
            f"{who} {budget / 1e9:.2f} GB of KV cache in the run's memory estimate, and one sequence of {capacity} "
            f"tokens (+ a scratch slot) needs {2 * per_slot / 1e9:.2f} GB: {fix}"
        )
    return fit


def slots_for(
    rows: int, capacity: int, shape_bytes_per_token: int, device: Any, memory: float = 1 / 3,
    budget: int | None = None,
) -> int:  # fmt: skip
    """Slots for ``rows`` concurrent sequences (+ room for forks), capped at ``memory`` of free GPU memory, or
    at ``budget`` bytes when given (the run's memory estimate, trainers/gpu_memory.py ``memory_plan``: on any
    device; a ``ConfigError`` when not one sequence and the cache's scratch slot fit)."""
    want = max(16, min(512, 2 * rows))
    if budget is not None:
        fit = budget_slots(
            budget, capacity, shape_bytes_per_token, "the fast engine's KV cache gets",
            "raise engine_memory, lower max_total_tokens + max_new_tokens, or drop a weight copy (the estimate's "
            "line on stderr lists them)",
        )  # fmt: skip
        return min(want, fit)
    if getattr(device, "type", "cpu") != "cuda":
        return want
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    fit = int(free * memory // max(1, capacity * shape_bytes_per_token))
    return max(1, min(want, fit))


def choose_engine(
    policy: Any, engine: str, *, rows: int, capacity: int, quiet: bool = False, memory: float = 1 / 3,
    servers: Sequence[str] = (), weight_sync: str = "auto", sync_folder: str = "", seed: int = 0,
    budget: int | None = None,
) -> Any:  # fmt: skip
    """``policy`` (an ``HFPolicy``), an ``EnginePolicy`` or a ``VLLMPolicy`` over the same live model and
    tokenizer; a KV cache takes at most ``memory`` of the GPU memory free when it is made, or ``budget``
    bytes when given (its part of the run's memory estimate, trainers/gpu_memory.py ``memory_plan``)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    check_memory(memory)
    urls = [u.strip() for entry in servers for u in entry.split(",") if u.strip()]
    if urls and engine != "vllm":
        raise ConfigError("rollout servers need engine=vllm")
    if engine == "hf":
        return policy
    if engine == "vllm":
        from toolgym.agents.vllm_policy import make_vllm_policy

        return make_vllm_policy(
            policy, capacity=capacity, memory=memory, servers=urls, weight_sync=weight_sync,
            sync_folder=sync_folder or None, seed=seed, quiet=quiet, rows=rows,
        )  # fmt: skip
    from toolgym.agents.engine.weights import shape_of, unsupported

    model = policy.model
    device = next(model.parameters()).device
    why = unsupported(model)
    if why is None and engine == "auto" and device.type != "cuda":
        why = "it runs on CUDA only by default (pass engine=fast to use it on CPU)"
    if why is not None:
        if engine == "fast":
            raise ConfigError(f"engine=fast cannot run this model: {why}; use engine=hf")
        if not quiet:
            print(
                f"toolgym: rollouts use the HF engine: the fast engine is off because {why}", file=sys.stderr
            )
        return policy
    import torch

    from toolgym.agents.engine.engine_policy import EnginePolicy

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    per_token = shape_of(model).kv_bytes_per_token(dtype)
    slots = slots_for(rows, capacity, per_token, device, memory, budget)
    fast = EnginePolicy(
        model, policy.tokenizer, slots=slots, capacity=capacity, engine_dtype=dtype,
        chat_template=policy.renderer.chat_template, tool_role=policy.renderer.tool_role,
    )  # fmt: skip
    if not quiet:
        gb = fast.engine.cache.nbytes() / 1e9
        print(
            f"toolgym: rollouts use the fast engine ({slots} slots x {capacity} tokens, KV cache {gb:.2f} GB)",
            file=sys.stderr,
        )
    return fast
