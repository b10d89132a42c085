"""Data parallel GRPO under torchrun with 2 gloo processes on CPU: ranks end with identical weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_train_in_step(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("dist_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    init, r0, r1 = (torch.load(tmp_path / f, weights_only=True) for f in ("init.pt", "rank0.pt", "rank1.pt"))
    for name in init:
        assert torch.equal(r0[name], r1[name]), name  # DDP kept the ranks in step
        assert not torch.equal(init[name], r0[name]), name  # and every parameter moved
    rec = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == [1] and rec[0]["rollout/episodes"] == 4.0  # per-rank mean: 1 tree x 4
