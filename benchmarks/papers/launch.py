"""Starting training runs side by side on a machine's GPUs and stopping them at a deadline (the seed-methods
and papers benchmarks' device side)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any


def write_yaml(path: Path, cfg: dict[str, Any]) -> None:
    """YAML, not JSON: PyYAML reads JSON's 1e-05 as a string (YAML 1.1 floats need a dot)."""
    import yaml

    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def launch(cmd: list[str], log: Path, gpu: int | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if gpu is not None:  # an index among the GPUs this process sees
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [v for v in visible.split(",") if v.strip()] if visible else []
        env["CUDA_VISIBLE_DEVICES"] = ids[gpu] if gpu < len(ids) else str(gpu)
    f = log.open("ab")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


def gpu_count(device: str) -> int:
    if device == "cpu":
        return 0
    try:
        import torch

        return int(torch.cuda.device_count())
    except ImportError:
        return 0


def wait(procs: dict[str, subprocess.Popen[bytes]], deadline: float) -> dict[str, int | None]:
    """Return codes; a process still running at the deadline is stopped (SIGTERM, then SIGKILL): None."""
    codes: dict[str, int | None] = {}
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            codes[name] = None
    return codes


def machine(device: str) -> str:
    try:
        import torch

        if device != "cpu" and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return platform.processor() or platform.machine() or "cpu"
