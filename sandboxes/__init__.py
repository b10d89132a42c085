"""Sandboxes for untrusted model code (docs/sandboxes.md): `get_sandbox()` gives a `Sandbox` whose `run`
executes code once and whose `session()` keeps an interpreter for an episode. Docker is imported lazily."""

from __future__ import annotations

from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.factory import get_sandbox
from toolgym.sandboxes.limits import Limits
from toolgym.sandboxes.result import STATUSES, ExecResult, Status
from toolgym.sandboxes.session import Session

__all__ = ["STATUSES", "ExecResult", "Limits", "Sandbox", "Session", "Status", "get_sandbox"]
