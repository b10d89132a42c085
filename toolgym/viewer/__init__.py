"""``toolgym view RUN_DIR``: one self-contained HTML page of a training run's rollout trees.

Reads ``RUN_DIR/rollouts/step_*.jsonl`` (``toolgym train --save-rollouts N``; the format is
``toolgym.trainers.saved_rollouts``) and writes a page with the data inline and plain JavaScript (no CDN, no
network): per tree its task, leaves and rewards; per node the text of each turn, the parsed tool calls, the
observations, the step reward, the advantage of the node in each row, and branch points (nodes with two or
more children) shown as side-by-side branches. Filters: step, task, leaf reward range, outcome, text search.
Each node shows the messages its tokens hold (``toolgym.viewer.messages``); the "template tokens" switch shows
the decoded tokens as the model saw them, chat-template markup included.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError
from toolgym.viewer.messages import with_messages

MAX_DEFAULT_STEPS = 20
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def saved_steps(run_dir: Path) -> dict[int, Path]:
    """The saved steps of a run, step -> file."""
    folder = run_dir / "rollouts"
    if not folder.is_dir():
        raise ConfigError(
            f"{run_dir} has no rollouts/ folder: train with --save-rollouts N (every N steps) to save the trees"
        )
    found = {int(m.group(1)): p for p in folder.iterdir() if (m := _STEP_FILE.match(p.name))}
    if not found:
        raise ConfigError(f"{folder} holds no step_*.jsonl files")
    return dict(sorted(found.items()))


def pick_steps(available: list[int], spec: str | None) -> list[int]:
    """Steps chosen by ``spec``: None (the last 20), ``last``, ``7``, ``1,5,9``, ``10-20`` (mixable).

    >>> pick_steps([1, 2, 3, 5, 8], "2-5,8")
    [2, 3, 5, 8]
    >>> pick_steps([1, 2, 3], "last")
    [3]
    """
    if spec is None:
        return available[-MAX_DEFAULT_STEPS:]
    chosen: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        try:
            if part == "last":
                chosen.add(available[-1])
            elif "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                chosen.update(s for s in available if lo <= s <= hi)
            else:
                chosen.add(int(part))
        except ValueError as exc:
            raise ConfigError(f"--steps {spec!r}: use N, N,M, N-M or last") from exc
    missing = sorted(chosen - set(available))
    if missing:
        raise ConfigError(f"steps {missing} were not saved; saved: {available}")
    return sorted(chosen)


def load_trees(run_dir: Path, steps: list[int]) -> list[dict[str, Any]]:
    files = saved_steps(run_dir)
    trees = []
    for step in steps:
        for n, line in enumerate(files[step].read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                trees.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{files[step]} line {n} is not JSON: {exc}") from exc
    return trees


def render_page(trees: list[dict[str, Any]], title: str) -> str:
    """The HTML page (data inline; ``</`` escaped so no text can close the script element)."""
    template = resources.files(__package__).joinpath("page.html").read_text()
    data = (
        json.dumps([with_messages(t) for t in trees], default=str)
        .replace("</", "<\\/")
        .replace("<!--", "<\\!--")
    )
    return template.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)


def write_view(run_dir: str | Path, *, steps: str | None = None, out: str | Path | None = None) -> Path:
    """Writes the page for ``run_dir`` (default ``run_dir/rollouts.html``) and returns its path."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"no run folder {run}")
    chosen = pick_steps(list(saved_steps(run)), steps)
    trees = load_trees(run, chosen)
    target = Path(out) if out else run / "rollouts.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_page(trees, f"toolgym rollouts: {run.name}"))
    return target
