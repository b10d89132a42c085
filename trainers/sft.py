"""Supervised warm start (SFT) on conversations: the scripted experts' episodes of any env, or a JSONL file
of OpenAI-format chat messages (tool calls included).

Each conversation becomes one token sequence exactly as the rollout engine builds it (``ChatRenderer``:
the first prompt rendered by the chat template, each assistant reply's ids + the end-of-turn token, the
template's tail and the env/tool messages appended, never re-rendered), with a loss mask that is 1 on the
assistant replies and their end-of-turn token only (``conversation_tokens``). Sequences are packed into
rows of ``pack_tokens`` (position ids restart at each sequence and attention never crosses one), the loss
is the token mean of cross-entropy over a step's masked tokens, and the run writes
``RUN_DIR/model`` (a plain transformers folder; LoRA adapters are merged into it) for
``toolgym train --init RUN_DIR``. Held-out success (greedy, the trainer's ``evaluate``) is measured before
and after, on ``eval_env_kwargs`` on top of ``env_kwargs`` (e.g. ``{split: test}``).

``save_every`` writes ``RUN_DIR/checkpoint`` (trainers/checkpoint.py's format: the trainable weights, i.e.
all of them or only the LoRA adapters, AdamW, and in ``extra`` the LR schedule, the data order and its
random state, and a fingerprint of the data); ``resume`` continues from it, bit-identical to a run that
was never stopped. SIGTERM/SIGINT save it at the next step boundary and stop (trainers/preemption.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgym.errors import ConfigError
from toolgym.trainers import preemption
from toolgym.trainers.config import DataConfig
from toolgym.trainers.preemption import Preemption

if TYPE_CHECKING:
    import torch

    from toolgym.agents.rendering import ChatRenderer

Conversation = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (messages, tools)


@dataclass
class SFTConfig(DataConfig):
    data: str = field(
        default="", metadata={"help": "JSONL of conversations ({messages, tools}); empty: the env experts"}
    )
    episodes: int = field(
        default=200, metadata={"help": "scripted-expert episodes per env id (when data is empty)"}
    )
    batch_size: int = field(default=16, metadata={"help": "conversations per optimizer step"})
    pack_tokens: int = field(
        default=2048, metadata={"help": "row length when packing; longer conversations are cut"}
    )
    packing: bool = field(default=True, metadata={"help": "pack several conversations into one row"})
    lr: float = field(default=5e-5, metadata={"help": "AdamW learning rate (peak)"})
    warmup_steps: int = field(default=2, metadata={"help": "linear warm-up steps, then cosine to lr/10"})
    max_new_tokens: int = field(default=64, metadata={"help": "tokens per model turn in evaluations"})
    eval_env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {},
        metadata={"help": "gym.make keywords for evaluation on top of env_kwargs, e.g. {split: test}"},
    )
    eval_before: bool = field(default=True, metadata={"help": "also evaluate before training (step 0)"})
    eval_episodes: int = field(default=64, metadata={"help": "held-out episodes per evaluation (greedy)"})
    output_dir: str = field(default="runs/sft", metadata={"help": "run folder (model/, metrics, plots)"})
    save_every: int = field(
        default=0,
        metadata={"help": "write RUN_DIR/checkpoint every N steps for --resume (0: only on SIGTERM/Ctrl-C)"},
    )

    def validate(self) -> None:
        super().validate()
        for name in ("episodes", "batch_size", "pack_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.data and not Path(self.data).is_file():
            raise ConfigError(f"no conversation file at {self.data}")


# ----- data ------------------------------------------------------------------------------------------------
def expert_conversations(
    env_ids: Sequence[str], env_kwargs: dict[str, Any], episodes: int, seed: int = 0
) -> list[Conversation]:
    """Successful episodes of each env's scripted expert (``env.expert_action()``), as (messages, tools).

    They run through the one episode runner (``agents.scripted.expert_transcripts``). Seeds are
    ``seed * 1_000_003 + i``, below the trainer's held-out seeds (``EVAL_SEED0``). An env fault raises
    ``InfrastructureError`` (an episode left out for an infra reason would silently change the data);
    none solved raises ``ConfigError``.
    """
    from toolgym.agents.scripted import expert_transcripts

    out = expert_transcripts(env_ids, env_kwargs, episodes, first_seed=seed * 1_000_003)
    if not out:
        raise ConfigError(f"the scripted experts of {list(env_ids)} solved none of {episodes} episodes")
    return out


def load_conversations(path: str | Path) -> list[Conversation]:
    """Conversations from a JSONL file: one object a line with ``messages`` (OpenAI chat format: system, user,
    assistant with optional ``tool_calls``, tool) and optional ``tools``; toolgym trajectories (what
    ``toolgym eval`` writes) have both. Each needs at least one assistant message after a first prompt."""
    path = Path(path)
    out: list[Conversation] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n} is not JSON ({exc})") from exc
            messages = row.get("messages") if isinstance(row, dict) else None
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
            ):
                raise ConfigError(
                    f"{path}:{n}: expected an object with a list of messages (each with a role)"
                )
            roles = [m["role"] for m in messages]
            if "assistant" not in roles or roles[0] == "assistant":
                raise ConfigError(
                    f"{path}:{n}: needs a prompt (system/user) then at least one assistant turn"
                )
            tools = row.get("tools") or []
            if not isinstance(tools, list):
                raise ConfigError(f"{path}:{n}: tools must be a list of OpenAI tool objects")
            out.append((messages, tools))
    if not out:
        raise ConfigError(f"{path} holds no conversations")
    return out


def assistant_text(message: dict[str, Any]) -> str:
    """What the model writes for an assistant message: its text, then its ``tool_calls`` as Hermes
    ``<tool_call>{json}</tool_call>`` blocks (unless the text already holds them).

    >>> assistant_text({"role": "assistant", "content": None, "tool_calls": [
    ...     {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'}}]})
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    """
    text = str(message.get("content") or "")
    calls = message.get("tool_calls") or []
    if not calls or "<tool_call>" in text:
        return text
    blocks = []
    for call in calls:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise ConfigError(f"tool call {fn.get('name')!r} has arguments that are not JSON") from exc
        blocks.append(f"<tool_call>{json.dumps({'name': fn.get('name'), 'arguments': args})}</tool_call>")
    return "\n".join([text.strip(), *blocks] if text.strip() else blocks)


def conversation_tokens(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, renderer: ChatRenderer
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on assistant replies and their end-of-turn token) of one conversation,
    built the way the rollout engine builds an episode, so SFT trains on exactly what RL will sample from.
    """
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise ConfigError("a conversation needs a prompt (system/user) then at least one assistant turn")
    ids = renderer.prompt_ids(list(messages[:first]), list(tools or []) or None)
    mask = [0] * len(ids)
    eot = renderer.end_of_turn_id
    i = first
    while i < len(messages):
        reply = renderer.encode(assistant_text(messages[i]))
        if eot is not None:
            reply.append(eot)
        ids += reply
        mask += [1] * len(reply)
        tail = renderer.close_turn(reply)
        j = i + 1
        while j < len(messages) and messages[j].get("role") != "assistant":
            j += 1
        if j < len(messages):  # env/tool messages, then the next generation prompt
            env = tail + renderer.env_suffix([dict(m) for m in messages[i + 1 : j]])
            ids += env
            mask += [0] * len(env)
        i = j
    return ids, mask


def pack(
    seqs: Sequence[tuple[list[int], list[int]]], row_tokens: int, packing: bool = True
) -> list[list[tuple[list[int], list[int]]]]:
    """Rows of sequences (first fit, longest first); a sequence longer than ``row_tokens`` is cut.

    >>> [[len(s[0]) for s in row] for row in pack([([1] * 3, [1] * 3), ([2] * 2, [1] * 2), ([3] * 4, [1] * 4)], 5)]
    [[4], [3, 2]]
    """
    cut = [(ids[:row_tokens], mask[:row_tokens]) for ids, mask in seqs]
    if not packing:
        return [[s] for s in cut]
    rows: list[list[tuple[list[int], list[int]]]] = []
    room: list[int] = []
    for s in sorted(cut, key=lambda s: -len(s[0])):
        for r, free in enumerate(room):
            if len(s[0]) <= free:
                rows[r].append(s)
                room[r] -= len(s[0])
                break
        else:
            rows.append([s])
            room.append(row_tokens - len(s[0]))
    return rows


def row_tensors(
    rows: Sequence[Sequence[tuple[list[int], list[int]]]], pad_id: int
) -> dict[str, torch.Tensor]:
    """Padded tensors of packed rows: input_ids, labels mask, position ids (restarting per sequence) and
    a 4-D boolean attention mask [B, 1, T, T] that is causal inside each sequence and false elsewhere."""
    import torch

    B, T = len(rows), max(sum(len(s[0]) for s in row) for row in rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)  # [B, T]
    loss_mask = torch.zeros((B, T))  # [B, T]
    positions = torch.zeros((B, T), dtype=torch.long)  # [B, T]
    seq_id = torch.full((B, T), -1, dtype=torch.long)  # [B, T] which sequence of the row (-1: padding)
    for b, row in enumerate(rows):
        at = 0
        for k, (s_ids, s_mask) in enumerate(row):
            n = len(s_ids)
            ids[b, at : at + n] = torch.tensor(s_ids)
            loss_mask[b, at : at + n] = torch.tensor(s_mask, dtype=torch.float)
            positions[b, at : at + n] = torch.arange(n)
            seq_id[b, at : at + n] = k
            at += n
    causal = torch.ones((T, T), dtype=torch.bool).tril()  # [T, T]
    same = (seq_id[:, :, None] == seq_id[:, None, :]) & (seq_id[:, :, None] >= 0)  # [B, T, T]
    attn = (same & causal)[:, None]  # [B, 1, T, T]
    attn |= torch.eye(T, dtype=torch.bool)[None, None]  # padding attends to itself (no NaN rows)
    return {"input_ids": ids, "loss_mask": loss_mask, "position_ids": positions, "attention_mask": attn}


def token_losses(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy [B, T-1] of each next token, and whether the argmax was right (same shape)."""
    import torch

    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()  # [B, T-1, V]
    target = batch["input_ids"][:, 1:]  # [B, T-1]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # [B, T-1]
    return ce, logits.argmax(-1) == target


# ----- the run ---------------------------------------------------------------------------------------------
def model_dir(run_dir: str | Path) -> Path:
    """The model folder an SFT run wrote (what ``toolgym train --init RUN_DIR`` loads)."""
    folder = Path(run_dir) / "model"
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{run_dir} holds no SFT model ({folder}/config.json): run `toolgym sft` first")
    return folder


def _schedule(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor: linear warm-up, then cosine from 1 to 0.1."""
    if step < warmup:
        return (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac)))


class TrainableWeights:
    """What an SFT checkpoint keeps of the model (as a module for trainers/checkpoint.py): its trainable
    tensors, every weight or only the LoRA adapters (the frozen base is loaded from ``model`` again)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        import torch

        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        if set(saved) != set(params):
            raise ConfigError(
                f"the checkpoint holds {len(saved)} trainable tensors, this model {len(params)}: resume with "
                "the model, lora_r and lora_targets the run started with"
            )
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])


def data_fingerprint(seqs: Sequence[tuple[list[int], list[int]]]) -> str:
    """A hash of the token ids and loss masks: a resumed run must train on the data it started with."""
    h = hashlib.sha256()
    for ids, mask in seqs:
        h.update(json.dumps([ids, mask]).encode())
    return h.hexdigest()[:16]


def train(cfg: SFTConfig, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Runs (or resumes) SFT as configured; returns the summary (success before/after, steps, tokens,
    seconds). A SIGTERM/SIGINT saves the checkpoint and raises `Preempted` (trainers/preemption.py)."""
    from toolgym.trainers.checkpoint import resolve_resume

    cfg = resolve_resume(cfg)  # resume: auto -> whether output_dir holds a checkpoint
    with preemption.for_run(cfg, lambda s: _saves(cfg, s)) as stop:
        return _train(cfg, model, tokenizer, stop)


def _saves(cfg: SFTConfig, step: int) -> bool:
    """Whether the loop writes the checkpoint after `step` (every `save_every` steps; none at the end: the
    model folder is the result)."""
    return bool(cfg.save_every and step % cfg.save_every == 0)


def _train(cfg: SFTConfig, model: Any, tokenizer: Any, stop: Preemption) -> dict[str, Any]:
    import torch

    from toolgym.trainers import checkpoint
    from toolgym.trainers.episodes import evaluate
    from toolgym.trainers.metrics_log import MetricsLog
    from toolgym.trainers.modeling import autocast, build_policy, pick_device, trainable_parameters
    from toolgym.trainers.rollout import RolloutConfig

    cfg.validate()
    t_start = time.perf_counter()
    device = pick_device(cfg.device, cfg.threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg, device, model, tokenizer)
    model, renderer = policy.model, policy.renderer
    convs = (
        load_conversations(cfg.data)
        if cfg.data
        else expert_conversations(cfg.env_ids, cfg.env_kwargs, cfg.episodes, cfg.seed)
    )
    seqs = [conversation_tokens(m, t, renderer) for m, t in convs]
    steps = cfg.steps or max(1, math.ceil(cfg.epochs * len(seqs) / cfg.batch_size))
    heavy = stop.heavy  # the last step evaluates: with `epochs` its number is known only now
    stop.heavy = lambda s: s == steps or heavy(s)
    out = Path(cfg.output_dir)
    fingerprint = data_fingerprint(seqs)
    # optimizer, schedule and data order, then the checkpoint's state into them (before anything draws)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _schedule(s, steps, cfg.warmup_steps))
    rng = random.Random(cfg.seed)
    order: list[int] = []  # what is left of the current pass over the data, drawn from the end
    trained_tokens = 0
    summary: dict[str, Any] = {"conversations": len(seqs), "steps": steps}
    progress = checkpoint.Progress()
    folder = out / "checkpoint"
    if cfg.resume:
        progress = checkpoint.load(folder, {"model": TrainableWeights(model)}, optimizer)
        state = progress.extra or {}
        if state.get("data") != fingerprint:
            raise ConfigError(
                f"{folder} was saved while training on other data ({state.get('conversations')} conversations, "
                f"now {len(seqs)}): resume with the data, env_kwargs, episodes and seed the run started with"
            )
        sched.load_state_dict(state["schedule"])
        rng.setstate(state["rng"])
        order, trained_tokens = list(state["order"]), int(state["trained_tokens"])
        if state.get("success_before") is not None:
            summary["success_before"] = state["success_before"]

    def save() -> None:
        extra = {
            "schedule": sched.state_dict(), "rng": rng.getstate(), "order": list(order),
            "trained_tokens": trained_tokens, "success_before": summary.get("success_before"),
            "data": fingerprint, "conversations": len(seqs),
        }  # fmt: skip
        checkpoint.save(folder, {"model": TrainableWeights(model)}, optimizer, progress, extra)

    log = MetricsLog(out, cfg.tensorboard, resume_step=progress.step if cfg.resume else None)
    (out / "config.json").write_text(json.dumps({"algorithm": "sft", **cfg.to_dict()}, indent=2))
    eval_kwargs = {**cfg.env_kwargs, **cfg.eval_env_kwargs}
    rollout = RolloutConfig(
        budget=1, max_new_tokens=cfg.max_new_tokens, max_total_tokens=cfg.max_total_tokens
    )

    def held_out() -> dict[str, float]:
        model.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            return evaluate(policy, cfg.env_ids, eval_kwargs, rollout, cfg.eval_episodes)

    if cfg.eval_before and not cfg.resume:  # (a resumed run has its step-0 evaluation in its log)
        before = held_out()
        log.log(0, before)
        summary["success_before"] = before["eval/success"]
    bar = _bar(cfg, steps, progress.step)
    metrics: dict[str, float] = {}
    for step in range(progress.step + 1, steps + 1):
        stop.check(None, progress.step, folder, save)  # a signal came: checkpoint, then `Preempted`
        t_step = time.perf_counter()
        picked: list[tuple[list[int], list[int]]] = []
        while len(picked) < min(cfg.batch_size, len(seqs)):
            if not order:
                order = list(range(len(seqs)))
                rng.shuffle(order)
            picked.append(seqs[order.pop()])
        rows = pack(picked, cfg.pack_tokens, cfg.packing)
        n_target = sum(sum(m[1:]) for row in rows for _, m in row) or 1  # masked next-token targets
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss_sum, right, tokens = 0.0, 0.0, 0
        for start in range(0, len(rows), cfg.micro_batch_rows):
            batch = {
                k: v.to(device)
                for k, v in row_tensors(rows[start : start + cfg.micro_batch_rows], policy.pad_id).items()
            }
            with autocast(device, cfg.bf16):
                ce, hit = token_losses(model, batch)
            mask = batch["loss_mask"][:, 1:]  # [b, T-1]: targets are the next tokens
            loss = (ce * mask).sum() / n_target
            loss.backward()
            loss_sum += float(loss.detach()) * n_target
            right += float((hit.float() * mask).sum())
            tokens += int((batch["position_ids"] > 0).sum()) + len(rows[start : start + cfg.micro_batch_rows])
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable_parameters(model), cfg.grad_clip or float("inf"))
        optimizer.step()
        sched.step()
        trained_tokens += tokens
        elapsed = time.perf_counter() - t_step
        metrics = {
            "losses/sft": loss_sum / n_target,
            "charts/token_accuracy": right / n_target,
            "charts/learning_rate": optimizer.param_groups[0]["lr"],
            "losses/grad_norm": float(grad_norm),
            "time/train_tokens_per_s": tokens / max(elapsed, 1e-9),
            "time/step_s": elapsed,
        }
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == steps:
            metrics |= held_out()
        log.log(step, metrics)
        progress.step, progress.data_pos = step, progress.data_pos + len(picked)
        if _saves(cfg, step):
            save()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                loss=f"{metrics['losses/sft']:.3f}", acc=f"{metrics['charts/token_accuracy']:.2f}"
            )
    if bar is not None:
        bar.close()
    save_model(model, policy.tokenizer, out / "model")
    log.plot()
    plot_loss(log.read(), out / "sft_loss.png")
    log.close()
    summary |= {
        "success_after": metrics.get("eval/success"),
        "tool_calls_after": metrics.get("eval/tool_calls"),
        "trained_tokens": trained_tokens,
        "seconds": time.perf_counter() - t_start,
        "device": str(device),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def save_model(model: Any, tokenizer: Any, folder: Path) -> None:
    """A plain transformers folder (LoRA adapters merged in), written aside and renamed into place."""
    import shutil

    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    plain = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def plot_loss(records: Iterable[dict[str, Any]], path: Path) -> None:
    """sft_loss.png: the SFT loss and token accuracy per step (nothing without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    recs = [r for r in records if "losses/sft" in r]
    if not recs:
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    steps = [r["step"] for r in recs]
    ax.plot(steps, [r["losses/sft"] for r in recs], label="losses/sft")
    ax2 = ax.twinx()
    ax2.plot(
        steps, [r["charts/token_accuracy"] for r in recs], color="tab:orange", label="charts/token_accuracy"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2.set_ylabel("token accuracy")
    fig.legend(fontsize=7, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bar(cfg: SFTConfig, total: int, done: int = 0) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="sft", unit="step", dynamic_ncols=True)
