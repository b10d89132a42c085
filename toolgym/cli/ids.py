"""Env ids given on the command line: one check for every command that takes one (check, info, eval, play,
serve-env), so an unknown id always gets the same short "did you mean" and never a list of every id."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from toolgym.errors import ConfigError


def _registered() -> list[str]:
    from gymnasium.envs.registration import registry

    import toolgym  # noqa: F401  (registers toolgym's ids and its plugins')

    return list(registry)


def _core(env_id: str) -> str:
    """The part that tells ids apart: ``toolgym/Search-v0`` -> ``search`` (namespace and version dropped)."""
    name = env_id.rsplit("/", 1)[-1]
    head, _, version = name.rpartition("-v")
    return (head if head and version.isdigit() else name).lower()


def suggestions(env_id: str, known: Iterable[str] | None = None, n: int = 3) -> list[str]:
    """The registered ids closest to ``env_id``: a slip of case or a missing ``toolgym/`` first, then near
    spellings and names it begins (compared without namespace and version, which every id shares).

    >>> suggestions("calculator-v0", ["toolgym/Calculator-v0", "CartPole-v1"])
    ['toolgym/Calculator-v0']
    >>> suggestions("toolgym/Serch-v0", ["toolgym/Search-v0", "toolgym/Web-v0", "toolgym/GEM-v0"])
    ['toolgym/Search-v0']
    >>> suggestions("toolgym/calc", ["toolgym/Calculator-v0", "toolgym/Search-v0"])
    ['toolgym/Calculator-v0']
    >>> suggestions("zzz", ["toolgym/Calculator-v0"])
    []
    """
    ids = list(known) if known is not None else _registered()
    by_lower = {i.lower(): i for i in ids}
    asked = [env_id] if "/" in env_id else [env_id, f"toolgym/{env_id}"]
    exact = [by_lower[a.lower()] for a in asked if a.lower() in by_lower]
    if exact:  # a slip of case or namespace: that id, not its neighbours
        return exact[:1]
    cores: dict[str, list[str]] = {}
    for i in ids:
        cores.setdefault(_core(i), []).append(i)
    core = _core(env_id)
    near = difflib.get_close_matches(core, list(cores), n=n, cutoff=0.7)
    if len(core) >= 3:
        near += sorted(c for c in cores if c.startswith(core))
    return list(dict.fromkeys(i for c in near for i in cores[c]))[:n]


def unknown_id_message(env_id: str, known: Iterable[str] | None = None) -> str:
    """``unknown env id 'x' (did you mean 'y'?)``.

    >>> unknown_id_message("toolgym/Calculater-v0", ["toolgym/Calculator-v0"])
    "unknown env id 'toolgym/Calculater-v0' (did you mean 'toolgym/Calculator-v0'?)"
    """
    near = suggestions(env_id, known)
    hint = f" (did you mean {' or '.join(repr(s) for s in near)}?)" if near else ""
    return f"unknown env id {env_id!r}{hint}"


def require_ids(env_ids: Iterable[str]) -> None:
    """Raise ConfigError naming every unknown id, each with its nearest registered ones."""
    known = _registered()
    registered = set(known)
    unknown = [i for i in env_ids if i not in registered]
    if unknown:
        lines = "; ".join(unknown_id_message(i, known) for i in unknown)
        raise ConfigError(f"{lines}; `toolgym list` shows every id")
