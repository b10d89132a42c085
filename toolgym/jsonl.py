"""Reading JSONL files: one JSON value per line, blank lines skipped, a bad line named by file and number.

The loaders of questions and labelled sets check their own fields; they use ``bad_line`` so that every
error about a JSONL file reads the same: ``path:line: what is wrong``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError


def bad_line(path: str | Path, line: int, why: str) -> ConfigError:
    """The error for line ``line`` of ``path`` (1-based)."""
    return ConfigError(f"{path}:{line}: {why}")


def read_jsonl(path: str | Path, what: str = "JSONL file") -> list[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of ``path`` (numbers 1-based).

    A missing or unreadable file is a ConfigError naming ``what`` and the path; a line that is not JSON is a
    ConfigError naming the file and the line.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the {what} {path}: {exc}") from exc
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except ValueError as exc:
            raise bad_line(path, n, f"not JSON ({exc})") from exc
    return rows
