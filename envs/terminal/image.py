"""Images for Terminal-v0: the terminal base image, and one image per Harbor task with its own Dockerfile.

No registry is needed. The base, ``toolgym-terminal``, is built ``FROM`` the sandbox image
(``toolgym sandbox build``: debootstrap + ``docker import``) with a shell toolbox installed by apt from the
Debian mirror apt already uses (the same thing the sandbox image needs): git, make, gcc, pip and venv, jq.
A Harbor task's ``environment/Dockerfile`` is built as written when its ``FROM`` image is on this machine;
when it names a registry image this machine cannot pull (``ubuntu:24.04``, ``python:3.12-slim``, Terminal-
Bench's ``t-bench`` bases…) and that image is a known Debian/Ubuntu/Python base, the build runs on
``toolgym-terminal`` instead (recorded in the task's ``base_substituted``); any other base is refused with a
``ConfigError`` that names it. Images are tagged by a hash of their build context, so each builds once.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError

BASE_IMAGE = "toolgym-terminal:latest"
SANDBOX_IMAGE = "toolgym-sandbox:latest"
IMAGE_VERSION = "1"  # bump when PACKAGES or the Dockerfile below change: older images are rebuilt
VERSION_LABEL = "toolgym.terminal.version"
PARENT_LABEL = "toolgym.terminal.parent"  # the sandbox image id it was built on
PACKAGES = (
    "bash",
    "coreutils",
    "procps",
    "git",
    "make",
    "gcc",
    "libc6-dev",
    "python3-pip",
    "python3-venv",
    "python3-setuptools",
    "python3-wheel",
    "python3-pytest",
    "jq",
    "bc",
    "patch",
    "file",
    "xz-utils",
    "unzip",
    "zip",
)
# a Harbor Dockerfile FROM one of these (a registry image) runs on BASE_IMAGE when it cannot be pulled
KNOWN_BASES = re.compile(
    r"^(docker\.io/)?(library/)?(ubuntu|debian|python|buildpack-deps)(:[\w.\-]+)?$"
    r"|^ghcr\.io/laude-institute/t-bench/[\w.\-]+(:[\w.\-]+)?$"
)
_DOCKERFILE = f"""FROM {SANDBOX_IMAGE}
USER 0:0
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    {" ".join(PACKAGES)} && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man
RUN git config --system user.email agent@toolgym.invalid && git config --system user.name agent \\
    && git config --system init.defaultBranch main && git config --system advice.detachedHead false \\
    && mkdir -p /app /tests /logs/verifier /solution
ENV HOME=/root PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
LABEL {VERSION_LABEL}={IMAGE_VERSION}
WORKDIR /app
"""
_build_lock = threading.Lock()


def _client() -> Any:
    from toolgym.sandboxes.docker_backend import client, docker_problem

    problem = docker_problem(SANDBOX_IMAGE)
    if problem is not None:
        raise InfrastructureError(f"Terminal-v0 builds on the sandbox image: {problem}")
    return client(timeout=900)


def _labels(cli: Any, tag: str) -> dict[str, str] | None:
    try:
        return dict(cli.images.get(tag).labels or {})
    except Exception:
        return None


def _build(cli: Any, context: bytes, tag: str, log: Callable[[str], None]) -> None:
    """``docker build`` of a tar context; the build's network is the host's (apt and pip mirrors only)."""
    try:
        _, lines = cli.images.build(
            fileobj=io.BytesIO(context),
            custom_context=True,
            tag=tag,
            rm=True,
            pull=False,
            network_mode="host",
        )
        for line in lines:
            if "stream" in line and line["stream"].strip():
                log(line["stream"].rstrip())
    except Exception as exc:
        raise InfrastructureError(f"docker build of {tag} failed: {exc}") from exc


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(files[name]), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


def ensure_base(force: bool = False, log: Callable[[str], None] = lambda s: None) -> str:
    """Builds ``toolgym-terminal`` unless an image of the current version exists; returns its tag."""
    with _build_lock:
        cli = _client()
        labels = _labels(cli, BASE_IMAGE)
        # rebuilt when our packages change or the sandbox image under it was rebuilt
        parent = str(cli.images.get(SANDBOX_IMAGE).id)
        current = labels is not None and labels.get(VERSION_LABEL) == IMAGE_VERSION
        if current and labels is not None and labels.get(PARENT_LABEL) == parent and not force:
            return BASE_IMAGE
        log(f"building {BASE_IMAGE} from {SANDBOX_IMAGE} (apt: {', '.join(PACKAGES)}; about a minute)")
        dockerfile = _DOCKERFILE + f'LABEL {PARENT_LABEL}="{parent}"\n'
        _build(cli, _tar({"Dockerfile": dockerfile.encode()}), BASE_IMAGE, log)
        return BASE_IMAGE


def from_line(dockerfile: str) -> tuple[int, str]:
    """The index of the (last, for multi-stage) ``FROM`` line and the image it names."""
    lines = dockerfile.splitlines()
    found = [(i, line.split()[1]) for i, line in enumerate(lines) if line.strip().upper().startswith("FROM ")]
    if not found:
        raise ConfigError("the Dockerfile has no FROM line")
    if len(found) > 1:
        raise ConfigError("multi-stage Dockerfiles are not supported by Terminal-v0 (one FROM line)")
    return found[0]


def task_image(environment: Path, log: Callable[[str], None] = lambda s: None) -> tuple[str, str | None]:
    """The image of a Harbor task's ``environment/`` folder (its Dockerfile and build context), built once;
    and the registry base it replaced with ``toolgym-terminal`` (None when the base was used as written)."""
    dockerfile_path = environment / "Dockerfile"
    if not dockerfile_path.is_file():
        raise ConfigError(f"{environment} has no Dockerfile (docker-compose environments are not supported)")
    dockerfile = dockerfile_path.read_text()
    index, base = from_line(dockerfile)
    cli = _client()
    substituted: str | None = None
    if base in (BASE_IMAGE, BASE_IMAGE.split(":")[0]):
        ensure_base(log=log)  # ours: built here, kept up to date
    if _labels(cli, base) is None:
        if not KNOWN_BASES.match(base):
            raise ConfigError(
                f"{environment}: FROM {base} is not on this machine and no registry can be reached here; "
                f"build or load it first (docker load), or base the task on {BASE_IMAGE}"
            )
        ensure_base(log=log)
        lines = dockerfile.splitlines()
        lines[index] = f"FROM {BASE_IMAGE}"
        dockerfile, substituted = "\n".join(lines) + "\n", base
    files = {"Dockerfile": dockerfile.encode()}
    for path in sorted(environment.rglob("*")):
        rel = path.relative_to(environment).as_posix()
        if path.is_file() and rel != "Dockerfile":
            files[rel] = path.read_bytes()
    context = _tar(files)
    # the base's id is part of the name: a rebuilt base (or sandbox image) gives new task images
    base_id = str(cli.images.get(BASE_IMAGE if substituted else base).id)
    tag = f"toolgym-terminal-task:{hashlib.sha256(context + base_id.encode()).hexdigest()[:16]}"
    with _build_lock:
        if _labels(cli, tag) is None:
            log(f"building {tag} from {environment}")
            _build(cli, context, tag, log)
    return tag, substituted
