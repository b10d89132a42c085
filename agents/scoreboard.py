"""Per-env summaries of trajectories: the scoreboard that ``toolgym eval`` prints and the report shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolgym.agents.trajectory import Trajectory

HEADERS = ["env", "episodes", "success", "reward", "turns", "tool calls", "tokens", "invalid", "infra fail"]


@dataclass(frozen=True)
class EnvScore:
    """Means over the episodes of one env (infrastructure failures are counted, not scored)."""

    env_id: str
    episodes: int
    scored: int
    success: float
    reward: float
    turns: float
    tool_calls: float
    tokens: float
    invalid_actions: float
    infra_failures: int

    def row(self) -> list[str]:
        return [
            self.env_id,
            str(self.episodes),
            f"{self.success:.1%}",
            f"{self.reward:.3f}",
            f"{self.turns:.2f}",
            f"{self.tool_calls:.2f}",
            f"{self.tokens:.1f}",
            f"{self.invalid_actions:.2f}",
            str(self.infra_failures),
        ]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def score(trajectories: Sequence[Trajectory]) -> list[EnvScore]:
    """One ``EnvScore`` per env id (in order of first appearance), then ``all`` when there are several.

    >>> t = Trajectory(env_id="e", seed=0, rewards=[0.0, 1.0], reward=1.0, success=True)
    >>> s = score([t, Trajectory(env_id="e", seed=1, error="step: boom")])[0]
    >>> s.episodes, s.scored, s.success, s.infra_failures
    (2, 1, 1.0, 1)
    """
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.env_id, []).append(t)
    if len(groups) > 1:
        groups["all"] = list(trajectories)
    out = []
    for env_id, trajs in groups.items():
        ok = [t for t in trajs if not t.infra_failure]
        out.append(
            EnvScore(
                env_id=env_id,
                episodes=len(trajs),
                scored=len(ok),
                success=_mean([float(t.success) for t in ok]),
                reward=_mean([t.reward for t in ok]),
                turns=_mean([t.turns for t in ok]),
                tool_calls=_mean([t.tool_calls for t in ok]),
                tokens=_mean([t.completion_tokens for t in ok]),
                invalid_actions=_mean([t.invalid_actions for t in ok]),
                infra_failures=len(trajs) - len(ok),
            )
        )
    return out
