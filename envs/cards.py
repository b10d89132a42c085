"""Env cards: what a user needs to know about an id before training on it (``toolgym info ID``).

A card is built from the env class and one instance of it, without playing anything: family, origin, the
docstring's first line, the tools (name and first line of description), the reward components, the action
formats, the knobs with their defaults, and the expert's declared success rate. Two optional parts cost an
episode or more: ``example=True`` plays one expert episode (seed 0) and keeps its transcript, and
``measure=N`` replaces the declared success rate by the expert's over N episodes. The README's env table is
rendered from the static part (``scripts/env_table.py``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from toolgym.envs.base import ToolEnv
from toolgym.envs.knobs import knob_parameters, knobs
from toolgym.errors import ConfigError, DependencyNotInstalled

# the knobs every ToolEnv takes; a card lists them on one line and the family's own ones with defaults
COMMON_KNOBS = knobs(ToolEnv)


@dataclass
class EnvCard:
    env_id: str
    family: str
    origin: str
    summary: str
    tools: list[tuple[str, str]]
    reward_components: tuple[str, ...]
    action_formats: tuple[str, ...]
    knobs: list[tuple[str, str]]
    common_knobs: tuple[str, ...]
    expert_success: float
    expert_source: str
    supports_fork: bool
    example: list[dict[str, Any]] = field(default_factory=list)
    example_error: str = ""


def _first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _defaults(cls: type) -> dict[str, str]:
    """Each knob's default as written in the first ``__init__`` (in MRO order) that declares it."""
    return {
        name: "required" if p.default is inspect.Parameter.empty else repr(p.default)
        for name, p in knob_parameters(cls).items()
    }


_COMMON_DEFAULTS = _defaults(ToolEnv)


def _action_formats(env: ToolEnv) -> tuple[str, ...]:
    """The default format first; ``tags`` where every tool takes one argument at most (``<tool>ARG</tool>``
    has room for one); a structured assistant message (OpenAI ``tool_calls``) always."""
    default = env.action_format
    formats: list[str] = [default]
    single = all(len(s.parameters.get("properties", {})) <= 1 for s in env.tool_specs)
    if default == "hermes" and single and env.tool_specs:
        formats.append("tags")
    formats.append("message")
    return tuple(formats)


def _play_expert(env: ToolEnv, seed: int) -> tuple[list[dict[str, Any]], bool]:
    env.reset(seed=seed)
    info: dict[str, Any] = {}
    for _ in range(env.max_turns):
        _, _, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            break
    return env.transcript, bool(info.get("success"))


def build_card(
    env_id: str,
    *,
    cls: type[ToolEnv] | None = None,
    origin: str | None = None,
    example: bool = False,
    measure: int = 0,
) -> EnvCard:
    """The card of a registered id (or of ``cls``, a class not registered yet, e.g. a fresh scaffold)."""
    from toolgym.envs import ENVS, ORIGINS, _load

    if cls is None:
        if env_id not in ENVS:
            raise ConfigError(f"unknown env id {env_id!r} (see `toolgym list`)")
        cls = _load(ENVS[env_id])
    env = cls()
    try:
        tools = [(s.name, _first_line(s.description)) for s in env.tool_specs]
        formats = _action_formats(env)
        declared = float(env.expert_success_rate)
        success, source = declared, "declared"
        transcript: list[dict[str, Any]] = []
        missing = ""
        if example:
            try:
                transcript, _ = _play_expert(env, 0)
            except DependencyNotInstalled as exc:  # the card's static part still says what the env is
                missing = str(exc)
        if measure > 0:
            wins = sum(_play_expert(env, 1000 + seed)[1] for seed in range(measure))
            success, source = wins / measure, f"measured over {measure} episodes (declared {declared:.2f})"
    finally:
        env.close()
    defaults = _defaults(cls)
    # the family's own knobs, and the common ones whose default it changes (max_turns, say)
    own = [
        (name, defaults.get(name, "?"))
        for name in knobs(cls)
        if name not in COMMON_KNOBS or defaults.get(name) != _COMMON_DEFAULTS.get(name)
    ]
    return EnvCard(
        env_id=env_id,
        family=cls.family,
        origin=origin or ORIGINS.get(env_id, "toolgym"),
        summary=_first_line(cls.__doc__),
        tools=tools,
        reward_components=tuple(cls.reward_keys),
        action_formats=formats,
        knobs=own,
        common_knobs=COMMON_KNOBS,
        expert_success=success,
        expert_source=source,
        supports_fork=bool(cls.supports_fork),
        example=transcript,
        example_error=missing,
    )


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _example_lines(card: EnvCard, limit: int = 160, max_messages: int = 10) -> list[str]:
    lines = []
    for m in card.example[:max_messages]:
        body = m.get("content") or ""
        for call in [] if body else m.get("tool_calls") or []:
            fn = call.get("function", call)
            body += f" [{fn.get('name')}({fn.get('arguments')})]"
        lines.append(f"[{m['role']}{' ' + m['name'] if m.get('name') else ''}] {_clip(body, limit)}")
    if len(card.example) > max_messages:
        lines.append(f"… {len(card.example) - max_messages} more messages")
    return lines


def render_text(card: EnvCard) -> str:
    """The card as ``toolgym info`` prints it."""
    tools = "\n".join(f"  {name}: {desc}" for name, desc in card.tools) or "  none (commands)"
    own = "\n".join(f"  {name} = {default}" for name, default in card.knobs) or "  none"
    parts = [
        f"{card.env_id}  ({card.family}; from {card.origin})",
        card.summary,
        f"tools:\n{tools}",
        f"reward components: {', '.join(card.reward_components)}",
        f"action formats: {', '.join(card.action_formats)}",
        f"knobs:\n{own}\n  common: {', '.join(card.common_knobs)}",
        f"expert success: {card.expert_success:.2f} ({card.expert_source})",
        f"forking: {'yes' if card.supports_fork else 'no (trainers replay the prefix)'}",
    ]
    if card.example:
        parts.append(
            "example episode (expert, seed 0):\n" + "\n".join("  " + x for x in _example_lines(card))
        )
    elif card.example_error:
        parts.append(f"example episode: not played ({card.example_error})")
    return "\n".join(parts)


def render_markdown(card: EnvCard) -> str:
    """The card as markdown (a package README's card section)."""
    tools = ", ".join(f"`{name}` ({desc})" for name, desc in card.tools) or "none (commands)"
    own = ", ".join(f"`{name}={default}`" for name, default in card.knobs) or "none"
    rows = [
        ("family", card.family),
        ("origin", card.origin),
        ("what", card.summary),
        ("tools", tools),
        ("reward components", ", ".join(f"`{k}`" for k in card.reward_components)),
        ("action formats", ", ".join(card.action_formats)),
        ("knobs", own),
        ("common knobs", ", ".join(f"`{k}`" for k in card.common_knobs)),
        ("expert success", f"{card.expert_success:.2f} ({card.expert_source})"),
        ("forking", "yes" if card.supports_fork else "no"),
    ]
    out = ["| | |", "|---|---|"] + [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]
    if card.example:
        out += ["", "Example episode (expert, seed 0):", "", "```text", *_example_lines(card), "```"]
    elif card.example_error:
        out += ["", f"Example episode: not played ({card.example_error})."]
    return "\n".join(out)
