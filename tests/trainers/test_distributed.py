"""Data parallel GRPO under torchrun with 2 gloo processes on CPU: ranks end with identical weights."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

from tests.processes import run, running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_train_in_step(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("dist_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run(cmd, timeout=300, env=env)  # a timeout ends torchrun's ranks too, not only torchrun
    assert proc.returncode == 0, proc.stderr[-3000:]
    init, r0, r1 = (torch.load(tmp_path / f, weights_only=True) for f in ("init.pt", "rank0.pt", "rank1.pt"))
    for name in init:
        assert torch.equal(r0[name], r1[name]), name  # DDP kept the ranks in step
        assert not torch.equal(init[name], r0[name]), name  # and every parameter moved
    rec = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == [1] and rec[0]["rollout/episodes"] == 4.0  # per-rank mean: 1 tree x 4


def test_a_failed_test_leaves_no_worker_behind(tmp_path: Path) -> None:
    """What a timeout of the test above does: torchrun and its ranks all end (a launcher with one worker,
    and an error raised while they run, as ``run``'s timeout raises)."""
    import time

    import pytest

    pid_file = tmp_path / "worker.pid"
    launcher = (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(w.pid))\n"
        "time.sleep(300)\n"
    )
    with pytest.raises(TimeoutError), running([sys.executable, "-c", launcher]):
        deadline = time.monotonic() + 120  # python starts slowly on a loaded machine
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the launcher did not start its worker"
            time.sleep(0.1)
        raise TimeoutError("the test failed while the ranks ran")
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
