"""Saving a step's rollout trees for ``toolgym view`` (opt-in: ``save_rollouts``, every N steps).

One JSONL file per saved step, ``RUN_DIR/rollouts/step_000012.jsonl``, one line per tree (one task, its
GRPO group). A line holds the task (``uid``, ``env_id``, ``seed``, the gold answer) and every node: its
parent and children (a node with two or more children is a branch point), kind (``prompt``, ``model``,
``tool``, ``user``, ``env``), turn, decoded text, for a model turn its parsed tool calls, the env's step
reward, the outcome reward at a leaf with the episode's summary (success, truncation), and the advantage the
estimator gave the node in each row that holds it (``advantages``, with ``kept`` saying whether the row
survived the filters). The format is read by ``toolgym.viewer``; ``FORMAT`` changes when it does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolgym.trainers.tree import RolloutTree, Row

FORMAT = 1
_EPISODE_KEYS = ("success", "truncation", "episode_reward", "turns", "tool_calls", "void", "tokens")


def tree_record(
    tree: RolloutTree,
    tree_index: int,
    rows: Sequence[Row],
    node_adv: Sequence[dict[int, float]] | None,
    keep: Sequence[bool] | None,
    decode: Callable[[list[int]], str],
    step: int,
) -> dict[str, Any]:
    """One tree as a JSON-ready dict (``rows``/``node_adv``/``keep`` are the whole forest's, aligned)."""
    from toolgym.agents.policy import parse_turn

    tools = tree.meta.get("tools") or None
    advantages: dict[int, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        if row.tree != tree_index or node_adv is None or i >= len(node_adv):
            continue
        for nid, value in node_adv[i].items():
            advantages.setdefault(nid, []).append(
                {"leaf": row.leaf, "value": float(value), "kept": True if keep is None else bool(keep[i])}
            )
    nodes = []
    for node in tree.nodes:
        text = decode(node.token_ids)
        entry: dict[str, Any] = {
            "id": node.id,
            "parent": node.parent,
            "children": list(node.children),
            "kind": node.kind,
            "turn": node.turn,
            "tokens": len(node.token_ids),
            "text": text,
            "step_reward": float(node.step_reward),
            "reward": node.reward,
            "branch_reason": node.branch_reason,
        }
        if node.kind == "model":
            if "calls" in node.info:  # the env's own reading of the turn (TreeRollout keeps it)
                entry["tool_calls"] = list(node.info["calls"])
            else:
                action = node.info.get("action", text)
                calls = parse_turn(str(action), tools).tool_calls or ()
                entry["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
            entry["invalid"] = bool(node.info.get("invalid", False))
            if node.info.get("infra_error"):
                entry["infra_error"] = str(node.info["infra_error"])
        episode = node.info.get("episode")
        if episode:
            entry["episode"] = {k: episode.get(k) for k in _EPISODE_KEYS if k in episode}
        if node.id in advantages:
            entry["advantages"] = advantages[node.id]
        nodes.append(entry)
    return {
        "format": FORMAT,
        "step": step,
        "uid": tree.uid,
        "env_id": tree.meta.get("env_id"),
        "seed": tree.meta.get("seed"),
        "answer": _plain(tree.meta.get("answer")),
        "tools": [t.get("function", t).get("name") for t in tools or [] if isinstance(t, dict)],
        "nodes": nodes,
    }


def save_step(
    run_dir: Path | str,
    step: int,
    forest: Sequence[RolloutTree],
    rows: Sequence[Row],
    node_adv: Sequence[dict[int, float]] | None,
    keep: Sequence[bool] | None,
    decode: Callable[[list[int]], str],
    folder_name: str = "rollouts",
) -> Path:
    """Writes ``run_dir/{folder_name}/step_{step:06d}.jsonl`` and returns its path."""
    folder = Path(run_dir) / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.jsonl"
    with path.open("w") as f:
        for i, tree in enumerate(forest):
            record = tree_record(tree, i, rows, node_adv, keep, decode, step)
            f.write(json.dumps(record, default=str) + "\n")
    return path


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)
