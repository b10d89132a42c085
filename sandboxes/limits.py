"""Every limit a sandbox enforces, with its default. `docs/sandboxes.md` lists the same table."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from toolgym.errors import ConfigError

# The environment of a box's supervisor and code (both backends): nothing of the host's.
BOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8:backslashreplace",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}


@dataclass(frozen=True)
class Limits:
    """Limits and settings shared by both backends (the process backend enforces a subset, see its module)."""

    timeout_s: float = 10.0  # wall clock per call when the caller gives none
    memory_mb: int = 512  # container memory = memory+swap (no swap); process backend: RLIMIT_AS
    cpus: float = 1.0  # CPU quota per container (docker only)
    pids: int = 128  # processes + threads per box (docker pids cap; process: RLIMIT_NPROC of the box's uid)
    tmp_mb: int = 64  # size of the writable tmpfs /tmp (docker: counts against memory_mb)
    tmp_inodes: int = 16384  # files in /tmp (docker)
    nofile: int = 256  # open file descriptors per process
    fsize_mb: int = 64  # largest file a process may write
    output_bytes: int = 1 << 20  # stdout and stderr are each cut here (truncated=True)
    payload_bytes: int = 16 << 20  # code + stdin + files per call; bigger calls get an error result
    pool_size: int = 0  # warm sandboxes kept (0: number of CPUs, at least 2)
    grace_s: float = 3.0  # host-side slack on top of a call's timeout before the sandbox is replaced
    preload: tuple[str, ...] = ()  # modules imported once per sandbox, shared by every run (e.g. "numpy")
    image: str = "toolgym-sandbox:latest"  # docker image (`toolgym sandbox build`)
    user: str = "box"  # docker: "box" = a uid of its own per box (`uids`), or a fixed "uid:gid" for the code
    network: bool = False  # network_mode "none" (docker) or an empty network namespace (process) unless True
    runtime: str | None = None  # docker runtime, e.g. "runsc" (gVisor) where installed; None: the default

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "cpus", "pids", "tmp_mb", "tmp_inodes", "nofile", "fsize_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")

    @property
    def size(self) -> int:
        import os

        return self.pool_size or max(2, os.cpu_count() or 2)

    def updated(self, **overrides: Any) -> Limits:
        """A copy with overrides; unknown names are a ConfigError that lists the known ones.

        >>> Limits().updated(memory_mb=256).memory_mb
        256
        """
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown sandbox setting(s) {unknown}; known: {sorted(known)}")
        if isinstance(overrides.get("preload"), str):
            overrides["preload"] = (overrides["preload"],)
        return replace(self, **overrides)
