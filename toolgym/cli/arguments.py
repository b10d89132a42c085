"""Argument types the commands share (argparse ``type=`` callables: a bad value is a usage error)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line, e.g. ``--env-kwargs '{"digits": 3}'``.

    >>> json_object('{"digits": 3}')
    {'digits': 3}
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, e.g. \'{"prompt_format": "text"}\'')
    return value
