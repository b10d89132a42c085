"""Terminal tasks in the Harbor task format (Terminal-Bench 2.0's), and the converter both ways.

A Harbor task is a folder::

    instruction.md          what the agent is asked
    task.toml               [agent] timeout_sec, [verifier] timeout_sec, [environment] cpus / memory_mb /
                            docker_image, [metadata] …
    environment/Dockerfile  the agent's container (and its build context)
    tests/test.sh           the verifier: copied to /tests after the episode and run with bash; it writes
                            the reward (a number) to /logs/verifier/reward.txt, or {"reward": x} to
                            /logs/verifier/reward.json
    solution/solve.sh       a reference solution (optional; our scripted expert runs it)

``load_harbor(folder)`` reads one into a ``TerminalTask`` (building its image: see ``image.py``);
``write_harbor(task, folder)`` writes one of ours out, so the built-in tasks run under Harbor too.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.envs.terminal.container import SOLUTION_DIR, Resources, check_workdir
from toolgym.envs.terminal.image import BASE_IMAGE
from toolgym.errors import ConfigError
from toolgym.optional import require


@dataclass(frozen=True)
class TerminalTask:
    """One task. ``files`` (paths relative to ``workdir``) are copied in and ``setup`` runs (bash, as root,
    in ``workdir``) at reset, on top of ``image``, and then ``workdir`` is the agent's (an unprivileged
    user's: a task whose solution needs root elsewhere cannot be solved); ``tests`` is the verifier's folder (``test.sh`` required);
    ``solution`` is the expert's commands, one shell call each; ``solution_files`` (a Harbor task's
    ``solution/`` folder) are staged root-owned in ``/solution`` when the expert plays, and its one command
    runs ``solve.sh`` there (a script of any size: no action carries it). File contents are bytes end to end
    (a binary fixture, an archive, a compiled library stay as they are); text given as ``str`` is UTF-8."""

    name: str
    instruction: str
    tests: dict[str, bytes]
    solution: tuple[str, ...] = ()
    files: dict[str, bytes] = field(default_factory=dict)
    setup: str = ""
    category: str = "general"
    image: str = BASE_IMAGE
    workdir: str = "/app"
    agent_timeout_s: float = 900.0
    verifier_timeout_s: float = 120.0
    resources: Resources = field(default_factory=Resources)
    base_substituted: str | None = None  # the registry base a Harbor Dockerfile named, replaced by ours
    source: str = "builtin"
    solution_files: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tests", "files", "solution_files"):  # (the built-in tasks write their files as text)
            object.__setattr__(self, name, _as_bytes(getattr(self, name)))
        if "test.sh" not in self.tests:
            raise ConfigError(f"task {self.name}: tests must hold test.sh (the verifier)")
        check_workdir(self.workdir)


def _as_bytes(files: dict[str, str] | dict[str, bytes]) -> dict[str, bytes]:
    return {rel: data.encode() if isinstance(data, str) else bytes(data) for rel, data in files.items()}


def _toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover (3.10)
        tomllib = require("tomli", why="reading task.toml on Python 3.10")
    try:
        return tomllib.loads(path.read_text())
    except Exception as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc


def _table(config: dict[str, Any], key: str, where: Path) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [{key}] must be a table, got {value!r:.80}")
    return value


def _number(table: dict[str, Any], key: str, default: float, where: str) -> float:
    """A positive number of task.toml (``where``: its table, for the message)."""
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where}.{key} must be a positive number, got {value!r:.80}")
    return float(value)


def _workdir(dockerfile: str) -> str:
    found = re.findall(r"^\s*WORKDIR\s+(\S+)", dockerfile, re.M | re.I)
    return found[-1] if found else "/app"


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, as bytes (a binary test fixture must reach the container unchanged)."""
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def load_harbor(folder: str | Path, build: bool = True) -> TerminalTask:
    """A Harbor task folder as a ``TerminalTask``; its Dockerfile is built into a cached image (``build``)."""
    root = Path(folder)
    instruction = root / "instruction.md"
    if not instruction.is_file():
        raise ConfigError(f"{root} is not a Harbor task folder: it has no instruction.md")
    config = _toml(root / "task.toml")
    toml_path = root / "task.toml"
    env_cfg = _table(config, "environment", toml_path)
    agent_cfg, verifier_cfg = _table(config, "agent", toml_path), _table(config, "verifier", toml_path)
    meta, task_cfg = _table(config, "metadata", toml_path), _table(config, "task", toml_path)
    tests = _files(root / "tests")
    if "test.sh" not in tests:
        raise ConfigError(f"{root}: tests/test.sh (the verifier) is missing")
    dockerfile_path = root / "environment" / "Dockerfile"
    image, substituted, workdir = BASE_IMAGE, None, "/app"
    if dockerfile_path.is_file():
        workdir = _workdir(dockerfile_path.read_text())
        if build:
            from toolgym.envs.terminal.image import task_image

            image, substituted = task_image(root / "environment")
    elif env_cfg.get("docker_image"):
        image = str(env_cfg["docker_image"])
    else:
        raise ConfigError(f"{root}: environment/Dockerfile is missing and task.toml names no docker_image")
    workdir = str(env_cfg.get("workdir") or workdir)
    memory = _number(env_cfg, "memory_mb", _memory_mb(env_cfg.get("memory")) or 2048, "environment")
    resources = Resources(memory_mb=int(memory), cpus=_number(env_cfg, "cpus", 1, "environment"))
    return TerminalTask(
        name=str(task_cfg.get("name") or root.name),
        instruction=instruction.read_text(errors="replace").strip(),
        tests=tests,
        solution=_solution(root / "solution", workdir),
        solution_files=_files(root / "solution") if (root / "solution" / "solve.sh").is_file() else {},
        category=str(meta.get("category", "general")),
        image=image,
        workdir=workdir,
        agent_timeout_s=_number(agent_cfg, "timeout_sec", 900.0, "agent"),
        verifier_timeout_s=_number(verifier_cfg, "timeout_sec", 120.0, "verifier"),
        resources=resources,
        base_substituted=substituted,
        source=str(root),
    )


def _solution(folder: Path, workdir: str) -> tuple[str, ...]:
    """The expert's one command for a Harbor task: run ``solve.sh`` (staged with the rest of ``solution/``
    in ``/solution``, as Harbor's oracle gets it, when the expert plays) from the working folder."""
    if not (folder / "solve.sh").is_file():
        return ()
    return (f"cd {shlex.quote(workdir)} && bash {SOLUTION_DIR}/solve.sh",)


def _memory_mb(text: Any) -> int | None:
    """``"4G"`` / ``"512M"`` (task.toml's ``memory``) in MiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GgMm])[Bb]?\s*", str(text or ""))
    if not m:
        return None
    return int(float(m.group(1)) * (1024 if m.group(2) in "Gg" else 1))


def load_harbor_dir(folder: str | Path, build: bool = True) -> list[TerminalTask]:
    """Every Harbor task under ``folder`` (the folder itself when it is one), sorted by folder name."""
    root = Path(folder)
    if (root / "instruction.md").is_file():
        return [load_harbor(root, build)]
    if not root.is_dir():
        raise ConfigError(f"{root} is neither a Harbor task folder nor a folder of them")
    tasks = [load_harbor(p, build) for p in sorted(root.iterdir()) if (p / "instruction.md").is_file()]
    if not tasks:
        raise ConfigError(f"no Harbor task folders (with instruction.md) under {root}")
    return tasks


def write_harbor(task: TerminalTask, folder: str | Path) -> Path:
    """Writes ``task`` as a Harbor task folder (``folder/<name>``) and returns its path."""
    out = Path(folder) / task.name.replace("/", "-")
    (out / "environment").mkdir(parents=True, exist_ok=True)
    (out / "instruction.md").write_text(task.instruction.rstrip() + "\n")
    (out / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\n'
        f'category = "{task.category}"\nsource = "toolgym"\n\n'
        f"[verifier]\ntimeout_sec = {task.verifier_timeout_s}\n\n[agent]\ntimeout_sec = {task.agent_timeout_s}\n\n"
        f"[environment]\ncpus = {task.resources.cpus:g}\nmemory_mb = {task.resources.memory_mb}\n"
        "allow_internet = false\n"
    )
    lines = [f"FROM {task.image}", f"WORKDIR {task.workdir}"]
    for rel, data in task.files.items():
        path = out / "environment" / "files" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if task.files:
        lines.append(f"COPY files/ {task.workdir}/")
    if task.setup.strip():
        (out / "environment" / "setup.sh").write_text(task.setup)
        lines += ["COPY setup.sh /opt/setup.sh", "RUN bash /opt/setup.sh && rm /opt/setup.sh"]
    (out / "environment" / "Dockerfile").write_text("\n".join(lines) + "\n")
    for rel, data in task.tests.items():
        path = out / "tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for rel, data in task.solution_files.items():
        path = out / "solution" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if task.solution and not task.solution_files:
        (out / "solution").mkdir(exist_ok=True)
        body = "\n".join(task.solution)
        (out / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\ncd {task.workdir}\n{body}\n")
    return out
