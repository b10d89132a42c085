"""A self-contained HTML report of an evaluation: the scoreboard, success by env (an inline SVG bar chart),
and every episode's transcript with its tool calls, per-step rewards and reward parts. No scripts, no
external files: it opens anywhere."""

from __future__ import annotations

import contextlib
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolgym.agents.scoreboard import HEADERS, EnvScore, score
from toolgym.agents.trajectory import Trajectory

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f0f0f0}
details{border:1px solid #ddd;border-radius:6px;margin:6px 0;padding:4px 10px}
summary{cursor:pointer;font-family:monospace}.ok{color:#17803d}.bad{color:#b42318}.infra{color:#b26a00}
.msg{margin:6px 0;padding:6px 10px;border-radius:6px;white-space:pre-wrap;font-family:monospace;font-size:13px}
.system{background:#f4f4f5}.user{background:#eef4ff}.assistant{background:#effaf1}.tool{background:#fff7e6}
.role{font-weight:bold;font-size:11px;text-transform:uppercase;color:#555}
.call{background:#fff;border:1px dashed #999;padding:4px;margin-top:4px}
.step{font-size:12px;color:#555;margin:2px 0 8px 10px;font-family:monospace}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def success_chart(scores: Sequence[EnvScore]) -> str:
    """An SVG bar chart of success rate by env."""
    bar_h, gap, label_w, width = 22, 8, 260, 420
    rows = [s for s in scores if s.env_id != "all"] or list(scores)
    height = len(rows) * (bar_h + gap) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + width + 80}" height="{height}" '
        'role="img" aria-label="success by env">'
    ]
    for i, s in enumerate(rows):
        y = 10 + i * (bar_h + gap)
        w = max(1.0, s.success * width)
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end" font-size="13">{_e(s.env_id)}</text>'
        )
        parts.append(f'<rect x="{label_w}" y="{y}" width="{width}" height="{bar_h}" fill="#eee"/>')
        parts.append(
            f'<rect class="bar" x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#2f6fde"/>'
        )
        parts.append(f'<text x="{label_w + width + 8}" y="{y + 16}" font-size="13">{s.success:.0%}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _message(m: dict[str, Any]) -> str:
    role = str(m.get("role", "?"))
    head = role + (f" · {m['name']}" if m.get("name") else "")
    body = _e(m.get("content") or "")
    calls = ""
    for c in m.get("tool_calls") or []:
        fn = c.get("function", c)
        args = fn.get("arguments", {})
        with contextlib.suppress(json.JSONDecodeError):
            args = json.dumps(json.loads(args) if isinstance(args, str) else args, indent=1)
        calls += (
            f'<div class="call">tool call <b>{_e(fn.get("name"))}</b> {_e(c.get("id", ""))}\n{_e(args)}</div>'
        )
    return f'<div class="msg {_e(role)}"><div class="role">{_e(head)}</div>{body}{calls}</div>'


def _episode(i: int, t: Trajectory) -> str:
    if t.infra_failure:
        status = '<span class="infra">infrastructure failure</span>'
    elif t.success:
        status = '<span class="ok">success</span>'
    else:
        status = f'<span class="bad">failed ({_e(t.truncation or "wrong answer")})</span>'
    parts = ", ".join(f"{k} {v:+.2f}" for k, v in t.reward_components.items() if v)
    summary = (
        f"#{i} {_e(t.env_id)} seed {_e(t.seed)} · {status} · reward {t.reward:.2f}"
        f"{' (' + _e(parts) + ')' if parts else ''} · {t.turns} turns · {t.tool_calls} tool calls"
    )
    body = []
    assistant_seen = 0
    for m in t.messages:
        body.append(_message(m))
        if m.get("role") == "assistant":
            if assistant_seen < len(t.infos):
                info = t.infos[assistant_seen]
                comps = ", ".join(
                    f"{k} {v:+.2f}" for k, v in (info.get("reward_components") or {}).items() if v
                )
                flags = " · invalid action" if info.get("invalid_action") else ""
                body.append(
                    f'<div class="step">reward {t.rewards[assistant_seen]:+.2f}'
                    f"{' (' + _e(comps) + ')' if comps else ''}{flags}</div>"
                )
            assistant_seen += 1
    if t.error:
        body.append(f'<div class="msg infra">{_e(t.error)}</div>')
    return f"<details><summary>{summary}</summary>{''.join(body)}</details>"


def render_report(
    trajectories: Sequence[Trajectory], *, title: str = "toolgym eval", meta: dict[str, Any] | None = None
) -> str:
    """The whole report as one HTML string."""
    scores = score(trajectories)
    head = "".join(f"<th>{_e(h)}</th>" for h in HEADERS)
    rows = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in s.row()) + "</tr>" for s in scores)
    meta_html = "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in (meta or {}).items())
    episodes = "".join(_episode(i, t) for i, t in enumerate(trajectories))
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1><ul>{meta_html}</ul>"
        f"<h2>Scoreboard</h2><table id='scoreboard'><tr>{head}</tr>{rows}</table>"
        f"<h2>Success by env</h2>{success_chart(scores)}"
        f"<h2>Episodes ({len(trajectories)})</h2>{episodes}</body></html>"
    )


def write_report(path: str | Path, trajectories: Sequence[Trajectory], **kwargs: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(trajectories, **kwargs), encoding="utf-8")
    return path
