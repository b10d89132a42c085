"""What a sandbox call returns: one frozen `ExecResult` for one-shot runs and session calls alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "error", "timeout", "oom", "output_limit", "sandbox_error"]
STATUSES: tuple[Status, ...] = ("ok", "error", "timeout", "oom", "output_limit", "sandbox_error")


@dataclass(frozen=True)
class ExecResult:
    """The outcome of running code once.

    ``status``: ``ok`` (finished, exit code 0), ``error`` (an exception, a non-zero exit, a crash: the code's
    fault), ``timeout`` (wall clock), ``oom`` (memory cap or ``MemoryError``), ``output_limit`` (a one-shot
    run stopped for printing past the cap), ``sandbox_error`` (our infrastructure failed: never score it as
    the model's failure). ``exit_code`` is negative for a signal and None when nothing ran. ``truncated``
    says stdout or stderr was cut at the cap. ``restarted`` (sessions) says the interpreter is fresh
    because the previous one died, so earlier state is gone. ``detail`` explains any non-``ok`` status.

    >>> r = ExecResult("ok", "42\\n", "", 0, 0.001)
    >>> r.ok, r.infra_failure
    (True, False)
    """

    status: Status
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    truncated: bool = False
    restarted: bool = False
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def infra_failure(self) -> bool:
        """True when the result says nothing about the code (exclude it from rewards, do not score 0)."""
        return self.status == "sandbox_error"


def sandbox_error(detail: str, duration_s: float = 0.0, restarted: bool = False) -> ExecResult:
    return ExecResult("sandbox_error", "", "", None, duration_s, detail=detail, restarted=restarted)
