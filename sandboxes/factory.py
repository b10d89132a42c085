"""`get_sandbox`: picks a backend (``docker``, ``process``, or ``auto`` = docker, never silently anything
weaker) and applies limit overrides."""

from __future__ import annotations

from typing import Any

from toolgym.errors import ConfigError
from toolgym.sandboxes.base import Sandbox
from toolgym.sandboxes.limits import Limits

BACKENDS = ("auto", "docker", "process")


def get_sandbox(backend: str = "auto", limits: Limits | None = None, **overrides: Any) -> Sandbox:
    """A sandbox with default limits (see `Limits`) updated by ``overrides``, e.g.
    ``get_sandbox("docker", memory_mb=256, pool_size=4)``. ``docker`` raises InfrastructureError with what
    to do when the daemon or the image is missing. ``auto`` is docker and raises the same error when docker is
    unavailable: it never downgrades to the weaker ``process`` backend, which must be asked for by name.

    >>> get_sandbox("podman")
    Traceback (most recent call last):
    ...
    toolgym.errors.ConfigError: unknown sandbox backend 'podman'; choose one of ('auto', 'docker', 'process')
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")
    lim = (limits or Limits()).updated(**overrides)
    if backend in ("auto", "docker"):
        from toolgym.errors import InfrastructureError
        from toolgym.sandboxes.docker_backend import DockerSandbox, docker_problem

        problem = docker_problem(lim.image)
        if problem is None and lim.runtime:
            from toolgym.sandboxes.docker_backend import runtime_problem

            problem = runtime_problem(lim.runtime)
        if problem is None:
            return DockerSandbox(lim)
        if backend == "auto":
            problem += "; `auto` uses docker only (it never downgrades): fix that"
            from toolgym.sandboxes.process_backend import process_problem

            if process_problem() is None:  # advised only where a real box just started and answered
                problem += (
                    ', or ask for get_sandbox("process") explicitly (bubblewrap boxes, weaker: see '
                    "docs/sandboxes.md)"
                )
        raise InfrastructureError(problem)
    if lim.runtime:
        raise ConfigError(f"runtime={lim.runtime!r} is a docker runtime: use it with the docker backend")
    from toolgym.sandboxes.process_backend import ProcessSandbox, process_problem

    problem = process_problem()
    if problem is not None:
        from toolgym.errors import InfrastructureError

        raise InfrastructureError(problem)
    return ProcessSandbox(lim)
