"""DPO (Rafailov et al. 2023): preference optimisation over (prompt, chosen, rejected) with a frozen reference.

For a pair (x, y_w, y_l), with log-ratios against the frozen reference π_ref,

    h = β [ (log πθ(y_w|x) − log π_ref(y_w|x)) − (log πθ(y_l|x) − log π_ref(y_l|x)) ]
    L = −(1 − ε) log σ(h) − ε log σ(−h)          (ε = ``label_smoothing``, 0: the paper's sigmoid loss)

where log π(y|x) is the sum of the response tokens' log-probabilities (the prompt is context only). The
"implicit rewards" β(log πθ − log π_ref) of y_w and y_l are logged with their margin and the pair accuracy
(margin > 0).

Pairs are token ids (``PreferencePair``): a prompt rendered the way the rollout engine renders it (the chat
template's generation prompt included) and each response's ids followed by the end-of-turn token, so DPO
trains exactly what rollouts sample (``toolgym.trainers.sft.conversation_tokens`` does the same for SFT).
A JSONL file gives them as text: ``{"messages": [...prompt...], "tools": [...], "chosen": "...",
"rejected": "..."}`` one a line. LSPO (``toolgym.trainers.lspo``) builds its pairs in memory.

The reference is the model as loaded (a frozen copy, or the base with adapters off under LoRA), the usual
choice; LSPO reloads it each iteration (π_ref = the previous iteration's policy). Departures: none in the
loss; one optimizer step per ``batch_size`` pairs with gradient accumulation over ``micro_batch_rows``
pairs, AdamW with linear warm-up then constant (TRL's default schedule is linear decay).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgym.errors import ConfigError
from toolgym.trainers.config import DataConfig

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PreferencePair:
    """One preference: the prompt's ids and the two responses' ids (each ending with the end-of-turn id)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)  # where it came from (logged only)


@dataclass
class DPOConfig(DataConfig):
    data: str = field(
        default="", metadata={"help": "JSONL of {messages, tools, chosen, rejected} preference pairs"}
    )
    beta: float = field(
        default=0.1, metadata={"help": "DPO beta: strength of the implicit KL to the reference"}
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "conservative DPO's epsilon (0: the standard sigmoid loss)"}
    )
    batch_size: int = field(default=16, metadata={"help": "pairs per optimizer step"})
    micro_batch_rows: int = field(default=4, metadata={"help": "pairs per forward/backward"})
    lr: float = field(default=5e-7, metadata={"help": "AdamW learning rate (peak)"})
    warmup_steps: int = field(default=2, metadata={"help": "linear warm-up steps, then constant"})
    max_pair_tokens: int = field(
        default=2048, metadata={"help": "a pair whose prompt + longer response exceeds this is left out"}
    )
    output_dir: str = field(
        default="runs/dpo", metadata={"help": "run folder (model/, metrics.jsonl, summary)"}
    )

    def validate(self) -> None:
        super().validate()
        if self.time_limit_s is not None:  # (no checkpoint to stop at: a DPO run is one uninterrupted pass)
            raise ConfigError("time_limit_s: toolgym dpo keeps no checkpoint to stop at; leave it unset")
        if self.beta <= 0:
            raise ConfigError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.batch_size < 1 or self.max_pair_tokens < 2:
            raise ConfigError("batch_size must be >= 1 and max_pair_tokens >= 2")
        if self.data and not Path(self.data).is_file():
            raise ConfigError(f"no preference file at {self.data}")


# ----- data ------------------------------------------------------------------------------------------------
def response_ids(renderer: Any, text: str) -> list[int]:
    """A response's ids as the rollout engine records a finished turn: the text's tokens then end-of-turn."""
    ids = renderer.encode(text)
    eot = renderer.end_of_turn_id
    return ids + ([eot] if eot is not None else [])


def text_pair(
    renderer: Any,
    messages: Sequence[dict[str, Any]],
    chosen: str,
    rejected: str,
    tools: Sequence[dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
) -> PreferencePair:
    prompt = renderer.prompt_ids(list(messages), list(tools or []) or None)
    return PreferencePair(
        prompt, response_ids(renderer, chosen), response_ids(renderer, rejected), meta or {}
    )


def load_pairs(path: str | Path, renderer: Any) -> list[PreferencePair]:
    """Pairs from a JSONL file (see the module docstring); a malformed line is a ConfigError naming it
    (``file:line``), never a crash in the chat template nor a pair silently trained on wrong."""
    path = Path(path)
    out: list[PreferencePair] = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not UTF-8 text ({exc})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n} is not JSON ({exc})") from exc
            problem = pair_row_problem(row)
            if problem:
                raise ConfigError(f"{path}:{n}: {problem}")
            try:  # what the checks above let through and the template still refuses
                pair = text_pair(renderer, row["messages"], row["chosen"], row["rejected"], row.get("tools"))
            except Exception as exc:
                raise ConfigError(f"{path}:{n}: the chat template cannot render it: {exc}") from exc
            out.append(pair)
    if not out:
        raise ConfigError(f"{path} holds no preference pairs")
    return out


ROLES = ("system", "user", "assistant", "tool")


def pair_row_problem(row: Any) -> str | None:
    """What is wrong with a JSONL row of preference data, or None. A pair whose responses are empty or identical
    is refused: it teaches nothing (its margin is 0 at every step) and counts as a wrong pair in the accuracy."""
    shape = "expected {messages: [...], chosen: str, rejected: str}"
    if not isinstance(row, dict):
        return shape
    messages, tools = row.get("messages"), row.get("tools")
    if not isinstance(messages, list) or not messages:
        return f"messages must be a non-empty list ({shape})"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"messages[{i}] needs a role, one of {', '.join(ROLES)}"
        if not isinstance(m.get("content"), str) and not (m["role"] == "assistant" and m.get("tool_calls")):
            return f"messages[{i}] needs a string content"
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "tools must be a list of tool objects"
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        return shape
    if not chosen.strip() or not rejected.strip():
        return "chosen and rejected must not be empty"
    if chosen == rejected:
        return "chosen and rejected are identical"
    return None


# ----- the loss --------------------------------------------------------------------------------------------
def sequence_logps(
    model: Any, rows: Sequence[tuple[list[int], list[int]]], pad_id: int, device: Any
) -> torch.Tensor:
    """Σ log π(response tokens | prompt) [B] of each (prompt_ids, response_ids) row (right-padded batch)."""
    import torch

    B, T = len(rows), max(len(p) + len(r) for p, r in rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)  # [B, T]
    attn = torch.zeros((B, T), dtype=torch.long)  # [B, T]
    mask = torch.zeros((B, T), dtype=torch.float)  # [B, T] 1 on response tokens
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        attn[b, : len(p) + len(r)] = 1
        mask[b, len(p) : len(p) + len(r)] = 1.0
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()  # [B, T-1, V]
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return (logp * mask[:, 1:]).sum(-1)  # [B]


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-pair DPO loss [B] (module docstring) and its statistics (implicit rewards, margin)."""
    import torch.nn.functional as F

    chosen = beta * (policy_chosen - ref_chosen)  # [B] implicit reward of y_w
    rejected = beta * (policy_rejected - ref_rejected)  # [B] of y_l
    h = chosen - rejected
    loss = -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    return loss, {"chosen_reward": chosen, "rejected_reward": rejected, "margin": h}


def pair_logps(
    model: Any, pairs: Sequence[PreferencePair], pad_id: int, device: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(y_w|x), log π(y_l|x)) [B] each, in one forward of the 2B rows."""
    rows = [(p.prompt_ids, p.chosen_ids) for p in pairs] + [(p.prompt_ids, p.rejected_ids) for p in pairs]
    both = sequence_logps(model, rows, pad_id, device)
    return both[: len(pairs)], both[len(pairs) :]


def reference_logps(
    ref: Any, pairs: Sequence[PreferencePair], pad_id: int, device: Any, rows: int
) -> list[tuple[float, float]]:
    """The reference's (chosen, rejected) log-probs of every pair, computed once before training."""
    import torch

    out: list[tuple[float, float]] = []
    with torch.no_grad(), ref.active() as frozen:
        frozen.eval()
        for start in range(0, len(pairs), rows):
            c, r = pair_logps(frozen, pairs[start : start + rows], pad_id, device)
            out += list(zip(c.tolist(), r.tolist(), strict=True))
    return out


# ----- the run ---------------------------------------------------------------------------------------------
def train(
    cfg: DPOConfig, pairs: Sequence[PreferencePair] | None = None, model: Any = None, tokenizer: Any = None
) -> dict[str, Any]:
    """Runs DPO on ``pairs`` (or ``cfg.data``); saves ``output_dir/model`` and returns the summary (first and
    last step's loss, margin and accuracy)."""
    import torch

    from toolgym.trainers.metrics_log import MetricsLog
    from toolgym.trainers.modeling import Reference, autocast, build_policy, pick_device, trainable_parameters
    from toolgym.trainers.sft import save_model

    cfg.validate()
    t_start = time.perf_counter()
    device = pick_device(cfg.device, cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    model = policy.model
    if pairs is None:
        if not cfg.data:
            raise ConfigError("DPO needs pairs: give data (a JSONL of preference pairs)")
        pairs = load_pairs(cfg.data, policy.renderer)
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    limit = min(cfg.max_pair_tokens, positions) if isinstance(positions, int) else cfg.max_pair_tokens
    kept = [p for p in pairs if len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids)) <= limit]
    if not kept:
        raise ConfigError(
            f"every one of {len(pairs)} pairs is longer than {limit} tokens (max_pair_tokens "
            f"{cfg.max_pair_tokens}, the model's positions {positions})"
        )
    ref = Reference(model)
    with autocast(device, cfg.bf16):
        ref_lp = reference_logps(ref, kept, policy.pad_id, device, cfg.micro_batch_rows)
    steps = cfg.steps or max(1, math.ceil(cfg.epochs * len(kept) / cfg.batch_size))
    out = Path(cfg.output_dir)
    log = MetricsLog(out, cfg.tensorboard)
    (out / "config.json").write_text(json.dumps({"algorithm": "dpo", **cfg.to_dict()}, indent=2))
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps))
    )
    rng = random.Random(cfg.seed)
    order: list[int] = []
    summary: dict[str, Any] = {"pairs": len(kept), "left_out": len(pairs) - len(kept), "steps": steps}
    metrics: dict[str, float] = {}
    for step in range(1, steps + 1):
        t_step = time.perf_counter()
        picked: list[int] = []
        while len(picked) < min(cfg.batch_size, len(kept)):
            if not order:
                order = list(range(len(kept)))
                rng.shuffle(order)
            picked.append(order.pop())
        model.train()
        optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "margin": 0.0, "chosen_reward": 0.0, "rejected_reward": 0.0, "accuracy": 0.0}
        for start in range(0, len(picked), cfg.micro_batch_rows):
            idx = picked[start : start + cfg.micro_batch_rows]
            chunk = [kept[i] for i in idx]
            rc = torch.tensor([ref_lp[i][0] for i in idx], device=device)
            rr = torch.tensor([ref_lp[i][1] for i in idx], device=device)
            with autocast(device, cfg.bf16):
                pc, pr = pair_logps(model, chunk, policy.pad_id, device)
            loss, stats = dpo_loss(pc, pr, rc, rr, cfg.beta, cfg.label_smoothing)
            (loss.sum() / len(picked)).backward()
            sums["loss"] += float(loss.detach().sum())
            sums["accuracy"] += float((stats["margin"] > 0).float().sum())
            for k in ("margin", "chosen_reward", "rejected_reward"):
                sums[k] += float(stats[k].detach().sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or float("inf"))
        optimizer.step()
        sched.step()
        metrics = {f"dpo/{k}": v / len(picked) for k, v in sums.items()}
        metrics |= {"losses/grad_norm": float(grad_norm), "time/step_s": time.perf_counter() - t_step}
        if step == 1:
            summary["first"] = dict(metrics)
        log.log(step, metrics)
    summary["last"] = metrics
    model.eval()
    save_model(model, policy.tokenizer, out / "model")
    log.close()
    summary |= {"seconds": time.perf_counter() - t_start, "device": str(device)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
