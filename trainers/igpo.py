"""IGPO turn rewards with the trainer's model as the scorer, on token ids.

P(node) = exp(mean log p(gold answer tokens | the tree's token prefix up to `node`)), computed once for
the prompt and for every env node (the state before each model turn). Turn t of a row then earns
IG_t = P(after turn t) - P(before turn t) (or the difference of logs); its last turn earns the outcome
reward; `advantages_turn.igpo` normalises within the tree and sums discounted turn rewards.

Departures from the paper / official code:
1. Token level: the gold answer is rendered once as the assistant reply `<answer>GOLD</answer>` and
   appended to exact prefix ids (the messages are never re-rendered; the rewards issue's
   `information_gain` is the same formula over messages).
2. The gold answer is the env's hidden `task.answer`, read by the rollout engine (`tree.meta["answer"]`);
   a tree without one falls back to outcome-only turn rewards (IG 0).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from toolgym.trainers.advantages import NodeAdv, turn_to_nodes
from toolgym.trainers.advantages_turn import igpo
from toolgym.trainers.tree import RolloutTree, Row, row_turns


def gold_logprobs(
    model: Any, prefixes: list[list[int]], gold: list[list[int]], pad_id: int, device: torch.device
) -> list[float]:
    """Mean log p(gold_i | prefix_i) per pair (teacher forced, one padded batch)."""
    seqs = [p + g for p, g in zip(prefixes, gold, strict=True)]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)  # [N, T]
    attn = torch.zeros((len(seqs), T), dtype=torch.long)  # [N, T]
    gold_mask = torch.zeros((len(seqs), T))  # [N, T] 1 on gold tokens
    for i, (p, g) in enumerate(zip(prefixes, gold, strict=True)):
        ids[i, : len(p) + len(g)] = torch.tensor(p + g)
        attn[i, : len(p) + len(g)] = 1
        gold_mask[i, len(p) : len(p) + len(g)] = 1
    ids, attn, gold_mask = ids.to(device), attn.to(device), gold_mask.to(device)
    with torch.no_grad():
        logits = (
            model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        )  # [N, T-1, V]
        logp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, -1)  # [N, T-1]
        m = gold_mask[:, 1:]  # [N, T-1]
        mean = (logp * m).sum(1) / m.sum(1).clamp(min=1)  # [N]
    return [float(x) for x in mean.tolist()]


def igpo_advantages(
    model: Any,
    renderer: Any,
    forest: list[RolloutTree],
    rows: list[Row],
    pad_id: int,
    device: torch.device,
    kind: Literal["prob_diff", "log_prob_diff"] = "prob_diff",
    norm: Literal["joint", "separate"] = "joint",
    gamma: float = 1.0,
    batch_size: int = 8,
) -> NodeAdv:
    """Node advantages from IGPO turn rewards (see the module docstring)."""
    # 1. score every prompt/env node of every tree that has a gold answer
    todo: list[tuple[int, int]] = []
    for ti, tree in enumerate(forest):
        if tree.meta.get("answer") is not None:
            todo += [(ti, n.id) for n in tree.nodes if n.kind != "model"]
    gold_ids = {
        ti: renderer.encode(f"<answer>{tree.meta['answer']}</answer>")
        for ti, tree in enumerate(forest)
        if tree.meta.get("answer") is not None
    }
    score: dict[tuple[int, int], float] = {}
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        prefixes = [forest[ti].prefix_ids(nid) for ti, nid in chunk]
        values = gold_logprobs(model, prefixes, [gold_ids[ti] for ti, _ in chunk], pad_id, device)
        score.update(zip(chunk, values, strict=True))
    # 2. turn rewards per row: info gains, then the outcome on the last turn
    turn_rewards: list[list[float]] = []
    for r in rows:
        tree = forest[r.tree]
        turns = row_turns(tree, r)
        before = [tree.nodes[t.nodes[0]].parent for t in turns]  # node each turn starts from
        rewards = []
        for j in range(len(turns) - 1):
            a, b = score.get((r.tree, before[j])), score.get((r.tree, before[j + 1]))  # type: ignore[arg-type]
            if a is None or b is None:
                rewards.append(0.0)
            else:
                rewards.append(b - a if kind == "log_prob_diff" else math.exp(b) - math.exp(a))
        rewards.append(tree.nodes[r.leaf].reward or 0.0)
        turn_rewards.append(rewards)
    return turn_to_nodes(forest, rows, igpo(turn_rewards, [r.tree for r in rows], gamma=gamma, norm=norm))
