"""Rescoring a run's saved rollouts with another reward function, or another version of one, without a model.

Reads ``RUN_DIR/rollouts/step_*.jsonl`` (``save_rollouts``; the format is ``saved_rollouts.FORMAT``). Each
episode that ended with an answer (no truncation) is one row: the completion is the path's turns as chat
messages, the final one as the env read it (an ``answer`` tool call becomes ``<answer>…</answer>``, the form
every answer reward reads), with the gold as the ``answer`` column and the rendered prompt as ``prompts``.
The stored value is what the env paid for that final turn (``step_reward`` of the leaf: the answer's
reward components, e.g. Calculator-v0's ``correct`` plus a tool bonus when one is on), or with
``stored="episode"`` the whole episode's reward. Episodes cut by a turn limit, a token budget or an
infrastructure fault gave no answer and are counted, not rescored.

A flip is a row whose pass/fail (value >= ``threshold``) changed; a None (the reward does not apply, or
its infrastructure failed) is neither.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolgym.errors import ConfigError

Stored = Literal["final_step", "episode"]


@dataclass(frozen=True)
class Episode:
    """One answered episode of a saved step."""

    step: int
    uid: str
    leaf: int
    env_id: str | None
    completion: list[dict[str, Any]]
    answer: Any
    prompt: str
    stored: float | None

    @property
    def final(self) -> str:
        return str(self.completion[-1]["content"]) if self.completion else ""


@dataclass(frozen=True)
class Change:
    step: int
    uid: str
    leaf: int
    old: float | None
    new: float | None
    final: str


@dataclass
class Report:
    files: int = 0
    episodes: int = 0  # answered episodes rescored
    skipped: dict[str, int] = field(default_factory=dict)  # unanswered, by truncation reason
    same: int = 0
    changed: int = 0
    now_none: int = 0
    flips_up: int = 0
    flips_down: int = 0
    old_mean: float = 0.0
    new_mean: float = 0.0
    changes: list[Change] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rollout_files(run_dir: str | Path, folder: str = "rollouts") -> list[Path]:
    root = Path(run_dir)
    path = root / folder if (root / folder).is_dir() else root
    files = sorted(path.glob("step_*.jsonl"))
    if not files:
        raise ConfigError(
            f"no saved rollouts under {path} (step_*.jsonl): train with save_rollouts: N to write them"
        )
    return files


def episodes(record: dict[str, Any], stored: Stored = "final_step") -> Iterator[Episode | str]:
    """The answered episodes of one saved tree; an unanswered one yields its truncation reason instead."""
    if record.get("format") != 1:
        raise ConfigError(f"rollout format {record.get('format')!r} is not one this reverify reads (1)")
    nodes = {n["id"]: n for n in record["nodes"]}
    prompt = next((n["text"] for n in record["nodes"] if n["parent"] is None), "")
    for node in record["nodes"]:
        ep = node.get("episode")
        if not ep:
            continue
        if ep.get("truncation") is not None:
            yield str(ep["truncation"])
            continue
        path = []
        nid: int | None = node["id"]
        while nid is not None:
            path.append(nodes[nid])
            nid = nodes[nid]["parent"]
        turns = [_message(n) for n in reversed(path) if n["kind"] != "prompt"]
        turns[-1] = _message(node, final=True)
        value = node.get("step_reward") if stored == "final_step" else ep.get("episode_reward")
        yield Episode(
            step=int(record.get("step", 0)), uid=str(record.get("uid")), leaf=int(node["id"]),
            env_id=record.get("env_id"), completion=turns, answer=record.get("answer"), prompt=prompt,
            stored=None if value is None else float(value),
        )  # fmt: skip


def _message(node: dict[str, Any], final: bool = False) -> dict[str, Any]:
    role = {"model": "assistant", "tool": "tool", "user": "user", "env": "user"}.get(node["kind"], "user")
    text = str(node.get("text", ""))
    if final and "<answer>" not in text:
        from toolgym.parsing import parse_action

        parsed = parse_action(text)  # an answer given through the `answer` tool call, as the env read it
        if parsed.ok and parsed.answer is not None:
            text = f"<answer>{parsed.answer}</answer>"
    return {"role": role, "content": text}


def reverify(
    run_dir: str | Path,
    reward: Callable[..., Any],
    *,
    stored: Stored = "final_step",
    threshold: float = 0.5,
    folder: str = "rollouts",
    steps: set[int] | None = None,
) -> Report:
    """Rescore every answered episode of the saved steps (all of them, or those in ``steps``) with
    ``reward`` (a reward function or ``Rubric``, TRL form) and compare with what was stored."""
    from toolgym.rewards.rubric import _run_sync

    report = Report()
    old_sum = new_sum = 0.0
    n_old = n_new = 0
    for path in rollout_files(run_dir, folder):
        report.files += 1
        batch: list[Episode] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if steps is not None and int(record.get("step", -1)) not in steps:
                continue
            for ep in episodes(record, stored):
                if isinstance(ep, str):
                    report.skipped[ep] = report.skipped.get(ep, 0) + 1
                else:
                    batch.append(ep)
        if not batch:
            continue
        cols = {"answer": [e.answer for e in batch], "prompts": [e.prompt for e in batch]}
        values = _run_sync(reward, [e.completion for e in batch], cols)
        for ep, new in zip(batch, values, strict=True):
            new = None if new is None else float(new)
            report.episodes += 1
            old = ep.stored
            if old is not None:
                old_sum, n_old = old_sum + old, n_old + 1
            if new is not None:
                new_sum, n_new = new_sum + new, n_new + 1
            if new is None:
                report.now_none += 1
            if new == old:
                report.same += 1
                continue
            report.changed += 1
            if old is not None and new is not None:
                up, down = old < threshold <= new, new < threshold <= old
                report.flips_up += up
                report.flips_down += down
            report.changes.append(Change(ep.step, ep.uid, ep.leaf, old, new, ep.final[-200:]))
    report.old_mean = old_sum / max(n_old, 1)
    report.new_mean = new_sum / max(n_new, 1)
    return report


def format_report(report: Report, threshold: float = 0.5, limit: int = 20) -> str:
    """The counts, then a table of the flips (pass/fail changed), then other changed values."""
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(report.skipped.items())) or "none"
    lines = [
        f"rescored {report.episodes} answered episodes from {report.files} files (not answered: {skipped})",
        f"same {report.same}, changed {report.changed} (now None {report.now_none}); flips at "
        f">= {threshold:g}: {report.flips_up} fail->pass, {report.flips_down} pass->fail",
        f"mean stored {report.old_mean:.4f} -> rescored {report.new_mean:.4f}",
    ]
    flips = [
        c for c in report.changes
        if c.old is not None and c.new is not None and (c.old >= threshold) != (c.new >= threshold)
    ]  # fmt: skip
    for title, rows in (("flips", flips), ("other changes", [c for c in report.changes if c not in flips])):
        if not rows:
            continue
        lines += ["", f"{title} ({len(rows)}{f', first {limit}' if len(rows) > limit else ''}):"]
        lines.append(f"{'step':>5}  {'episode':<28} {'leaf':>4}  {'stored':>7}  {'new':>7}  final turn")
        for c in rows[:limit]:
            final = " ".join(c.final.split())[-60:]
            lines.append(
                f"{c.step:>5}  {c.uid[:28]:<28} {c.leaf:>4}  {_num(c.old):>7}  {_num(c.new):>7}  {final}"
            )
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "None" if x is None else f"{x:.4g}"
