"""Sandboxes for the code reward tests: one process sandbox and one docker sandbox per run. Under CI (``CI``
set) the docker tests fail when docker is missing; elsewhere they are skipped."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

IMAGE = os.environ.get("TOOLGYM_SANDBOX_IMAGE", "toolgym-sandbox:latest")


@pytest.fixture(scope="session")
def process_box() -> Iterator[Any]:
    from toolgym.sandboxes import get_sandbox

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        box = get_sandbox("process", pool_size=2)
    yield box
    box.close()


@pytest.fixture(scope="session")
def docker_box() -> Iterator[Any]:
    from toolgym.sandboxes import get_sandbox
    from toolgym.sandboxes.docker_backend import docker_problem

    problem = docker_problem(IMAGE)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"docker sandbox unavailable under CI: {problem}")
        pytest.skip(f"docker sandbox unavailable: {problem}")
    box = get_sandbox("docker", image=IMAGE, pool_size=2)
    yield box
    box.close()


@pytest.fixture(params=["process", "docker"])
def sandbox(request: Any) -> Any:
    """Both backends."""
    return request.getfixturevalue(f"{request.param}_box")
