"""Builds the default sandbox image (python3, numpy, sympy) for `toolgym sandbox build`.

Two ways, same content: ``dockerfile`` builds ``sandboxes/docker/Dockerfile`` (needs a registry for the
Debian base image); ``debootstrap`` builds a minimal Debian root file system from the Debian mirror apt
already uses and ``docker import``s it (no registry needed: our machines and air-gapped users). ``auto``
uses the Dockerfile when the base image is present or can be pulled, else debootstrap. The image carries the label
``toolgym.sandbox.version``; a build is skipped when an image with the current version exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError, InfrastructureError

IMAGE_VERSION = "1"  # bump when the image's content changes; older images are then rebuilt
VERSION_LABEL = "toolgym.sandbox.version"
PACKAGES = ("python3", "python3-numpy", "python3-sympy")
SUITE = "bookworm"
BASE_IMAGE = "debian:bookworm-slim"
DOCKERFILE_DIR = Path(__file__).with_name("docker")
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale")


def image_version(cli: Any, tag: str) -> str | None:
    """The version label of ``tag``, or None when the image is absent."""
    try:
        image = cli.images.get(tag)
    except Exception:
        return None
    return str((image.labels or {}).get(VERSION_LABEL, "?"))


def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 ``.sources`` or one-line ``sources.list``)."""
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = m.group(1)
            if "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def registry_reachable(cli: Any, log: Callable[[str], None], wait_s: float = 30.0) -> bool:
    """Whether the Dockerfile's base image is here or can be pulled within ``wait_s`` seconds."""
    if image_version(cli, BASE_IMAGE) is not None:
        return True
    outcome: list[str] = []

    def pull() -> None:
        try:
            repo, _, tag = BASE_IMAGE.partition(":")
            cli.images.pull(repo, tag=tag)
            outcome.append("")
        except Exception as exc:
            outcome.append(str(exc).splitlines()[0][:200])

    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    worker.join(wait_s)
    if outcome and not outcome[0]:
        return True
    log(
        f"no registry ({outcome[0] if outcome else f'pull of {BASE_IMAGE} still running after {wait_s:g} s'}); "
        "building offline with debootstrap"
    )
    return False


def build_debootstrap(cli: Any, tag: str, log: Callable[[str], None], mirror: str | None = None) -> None:
    if not shutil.which("debootstrap"):
        raise InfrastructureError(
            "debootstrap is missing: apt-get install debootstrap (or use --from-dockerfile)"
        )
    if os.geteuid() != 0:
        raise InfrastructureError("debootstrap needs root: run `sudo toolgym sandbox build`")
    mirror = mirror or apt_mirror()
    with tempfile.TemporaryDirectory(prefix="toolgym-rootfs-") as tmp:
        root = Path(tmp) / "root"
        log(f"debootstrap {SUITE} from {mirror} (about a minute)")
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(root),
            mirror,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise InfrastructureError(f"debootstrap failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        for rel in TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        tarball = Path(tmp) / "root.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(tarball), "."], check=True)
        repo, _, version = tag.partition(":")
        log(f"docker import -> {tag}")
        cli.api.import_image_from_file(
            str(tarball),
            repository=repo,
            tag=version or "latest",
            changes=[
                f"LABEL {VERSION_LABEL}={IMAGE_VERSION}",
                "USER 65534:65534",
                "WORKDIR /tmp",
                "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8",
            ],
        )


def build_dockerfile(cli: Any, tag: str, log: Callable[[str], None]) -> None:
    log(f"docker build {DOCKERFILE_DIR} -> {tag}")
    cli.images.build(
        path=str(DOCKERFILE_DIR),
        tag=tag,
        buildargs={"TOOLGYM_IMAGE_VERSION": IMAGE_VERSION},
        rm=True,
        pull=False,
    )


def build(
    tag: str = "toolgym-sandbox:latest",
    method: str = "auto",
    force: bool = False,
    mirror: str | None = None,
    log: Callable[[str], None] = print,
) -> str:
    """Builds ``tag`` unless an image of the current version exists; returns what was done."""
    if method not in ("auto", "dockerfile", "debootstrap"):
        raise ConfigError(f"unknown build method {method!r}; choose auto, dockerfile or debootstrap")
    from toolgym.sandboxes.docker_backend import client

    try:
        cli = client(timeout=600)
        cli.ping()
    except Exception as exc:
        raise InfrastructureError(f"no docker daemon answers ({exc}); start dockerd first") from exc
    have = image_version(cli, tag)
    if have == IMAGE_VERSION and not force:
        return f"{tag} is up to date (version {IMAGE_VERSION}); nothing to do"
    if method == "auto":
        method = "dockerfile" if registry_reachable(cli, log) else "debootstrap"
    if method == "dockerfile":
        build_dockerfile(cli, tag, log)
    else:
        build_debootstrap(cli, tag, log, mirror)
    smoke = cli.containers.run(
        tag,
        ["python3", "-c", "import numpy, sympy; print(sympy.__version__)"],
        network_mode="none",
        remove=True,
        user="65534:65534",
    )
    log(f"smoke test: numpy and sympy import (sympy {smoke.decode().strip()})")
    return f"built {tag} (version {IMAGE_VERSION}) with {method}"
