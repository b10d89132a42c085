"""Metrics of a run: JSONL (one line a step), tensorboard events, and PNG plots in the run folder.

Every name lies under one of the fixed namespaces `NAMESPACES` (`charts/episode_reward`, `losses/policy`,
`rollout/tokens_per_s`, `eval/success`, `time/step_s`, …); docs/trainer.md lists each metric and its meaning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NAMESPACES = ("charts/", "losses/", "rollout/", "eval/", "time/", "curriculum/")

PLOTS = {
    "reward.png": ["charts/episode_reward", "charts/trained_reward", "eval/episode_reward"],
    "success.png": ["charts/success", "eval/success"],
    "length.png": ["charts/tokens_per_episode", "eval/tokens_per_episode"],
    "turns.png": ["charts/turns", "charts/tool_calls"],
    "kl.png": ["losses/approx_kl", "losses/kl_ref"],
    "entropy.png": ["losses/entropy"],
    "tokens_per_s.png": ["rollout/tokens_per_s", "time/train_tokens_per_s"],
    "curriculum.png": ["curriculum/level", "curriculum/success"],
}


class MetricsLog:
    """Appends metrics to `folder/metrics.jsonl` (and tensorboard); `plot()` draws the PNGs."""

    def __init__(self, folder: Path, tensorboard: bool = True, resume_step: int | None = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "metrics.jsonl"
        if resume_step is not None and self.path.exists():  # drop lines written after the checkpoint
            keep = [
                ln
                for ln in self.path.read_text().splitlines()
                if ln and json.loads(ln)["step"] <= resume_step
            ]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self.writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(folder / "tensorboard"))
            except ImportError:  # tensorboard is optional: JSONL and plots still work
                self.writer = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(k, v, step)
            self.writer.flush()

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(ln) for ln in self.path.read_text().splitlines() if ln]

    def plot(self) -> list[Path]:
        """One PNG per entry of PLOTS that has data; returns the files written."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:  # plots are optional: metrics.jsonl and tensorboard hold the same numbers
            print("toolgym train: matplotlib is not installed, no PNG plots (pip install matplotlib)")
            return []

        records = self.read()
        written = []
        for filename, keys in PLOTS.items():
            series = {k: [(r["step"], r[k]) for r in records if k in r] for k in keys}
            series = {k: v for k, v in series.items() if v}
            if not series:
                continue
            fig, ax = plt.subplots(figsize=(5, 3.2))
            for k, pts in series.items():
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, label=k)
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            out = self.folder / filename
            fig.savefig(out, dpi=100)
            plt.close(fig)
            written.append(out)
        return written

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
