"""`get_sandbox`: picks a backend (explicitly, or ``auto``: docker if a daemon answers, else the process
backend with a warning) and applies limit overrides."""

from __future__ import annotations

import warnings
from typing import Any

from toolgym.errors import ConfigError
from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.limits import Limits

BACKENDS = ("auto", "docker", "process")


def get_sandbox(backend: str = "auto", limits: Limits | None = None, **overrides: Any) -> Sandbox:
    """A sandbox with default limits (see `Limits`) updated by ``overrides``, e.g.
    ``get_sandbox("docker", memory_mb=256, pool_size=4)``. ``docker`` raises InfrastructureError with what
    to do when the daemon or the image is missing; ``auto`` falls back to ``process`` with a warning.

    >>> get_sandbox("podman")
    Traceback (most recent call last):
    ...
    toolgym.errors.ConfigError: unknown sandbox backend 'podman'; choose one of ('auto', 'docker', 'process')
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")
    lim = (limits or Limits()).updated(**overrides)
    if backend in ("auto", "docker"):
        from toolgym.sandboxes.docker_backend import DockerSandbox, docker_problem

        problem = docker_problem(lim.image)
        if problem is None:
            return DockerSandbox(lim)
        if backend == "docker":
            from toolgym.errors import InfrastructureError

            raise InfrastructureError(problem)
        warnings.warn(
            f"docker sandbox unavailable ({problem}); using the process backend, which does not isolate the "
            "file system or cap processes (see docs/sandboxes.md)",
            RuntimeWarning,
            stacklevel=2,
        )
    from toolgym.sandboxes.process_backend import ProcessSandbox

    return ProcessSandbox(lim)
