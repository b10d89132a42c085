"""Episode records: what the runner writes (one JSON object a line) and the trainer reads.

For token-level policies (``hf``) an episode is one token sequence: ``token_ids`` (prompt, every model
turn, every rendered env suffix), ``loss_mask`` (1 exactly on sampled tokens), ``logprobs`` (the sampling
logprob on those tokens, 0.0 elsewhere) and ``turn_spans`` ((start, end) of each model turn's sampled ids,
so the prompt of turn k is ``token_ids[:turn_spans[k][0]]``). For other policies these are empty and the
messages carry the episode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError


@dataclass
class Trajectory:
    """One episode: messages, tokens, rewards and infos."""

    env_id: str
    seed: int | None
    agent: str = ""
    task_id: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    truncation: str | None = None
    error: str | None = None  # an infrastructure failure (env or backend), not the model's
    completion_tokens: int = 0  # tokens the model generated (counted by the server for http backends)
    duration_s: float = 0.0

    @property
    def turns(self) -> int:
        return len(self.rewards)

    @property
    def infra_failure(self) -> bool:
        return self.error is not None

    @property
    def tool_calls(self) -> int:
        return sum(int(i.get("tool_calls", 0)) for i in self.infos)

    @property
    def invalid_actions(self) -> int:
        return sum(bool(i.get("invalid_action")) for i in self.infos)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["turn_spans"] = [list(s) for s in self.turn_spans]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"not a toolgym trajectory: unknown keys {sorted(unknown)}")
        kwargs = dict(data)
        kwargs["turn_spans"] = [tuple(s) for s in data.get("turn_spans", [])]
        return cls(**kwargs)


def save_trajectories(path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False) -> Path:
    """Write one JSON object a line; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False, default=_jsonable) + "\n")
    return path


def iter_trajectories(path: str | Path) -> Iterator[Trajectory]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no trajectory file at {path}")
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n} is not JSON ({exc}); was the file cut short?") from exc


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a JSONL file written by ``save_trajectories``."""
    return list(iter_trajectories(path))


def _jsonable(value: Any) -> Any:
    """Infos may hold numpy scalars or other objects: numbers stay numbers, the rest becomes text."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return repr(value)
