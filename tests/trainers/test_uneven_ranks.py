"""Ranks whose batches differ (rows filtered, env errors) must not hang under torchrun: every rank runs the same
number of minibatches and micro-batches (a rank short of rows runs zero-loss dummies, whose backward still
takes part in DDP's all-reduce / FSDP2's reduce-scatter), and the step is the one a single process takes on
all the rows (the token-mean's denominator counts every rank's kept tokens, the dummies add nothing).
2 gloo ranks on CPU under DDP and FSDP2; a hang fails the test at its timeout (ranks ended with it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.processes import run
from tests.trainers import uneven_worker
from tests.trainers.test_distributed import free_port

WORKER = Path(__file__).with_name("uneven_worker.py")
PARALLEL = ("ddp", "fsdp2")


def torchrun(*args: str, timeout: float = 300) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(WORKER), *args]  # fmt: skip
    proc = run(cmd, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})  # TimeoutError on a hang
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def updates(tmp_path_factory: Any) -> dict[str, Path]:
    """Every case of `uneven_worker.CASES` on 2 ranks, one torchrun per layout."""
    root = tmp_path_factory.mktemp("uneven")
    out = {}
    for parallel in PARALLEL:
        (root / parallel).mkdir()
        torchrun("update", str(root / parallel), parallel)
        out[parallel] = root / parallel
    return out


def one_process(case: str, tmp_path: Path) -> dict[str, Any]:
    from toolgym.trainers.distributed import Dist

    torch.manual_seed(0)
    return uneven_worker.update_case(str(tmp_path), "ddp", case, Dist())


@pytest.mark.slow
@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize(
    "case", [c for c, (_, _, _, kw) in uneven_worker.CASES.items() if "minibatches" not in kw]
)
def test_uneven_ranks_take_the_one_process_step(
    updates: dict[str, Path], parallel: str, case: str, tmp_path: Path
) -> None:
    """One minibatch: the 2-rank step equals one process's on all the kept rows (SGD: the weights moved by the
    gradient of the global token-mean), with the same number of optimizer steps and gradient norm."""
    got = torch.load(updates[parallel] / f"{case}.rank0.pt", weights_only=False)
    want = one_process(case, tmp_path)
    for name, w in want["weights"].items():
        torch.testing.assert_close(got["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    assert got["metrics"]["losses/updates"] == want["metrics"]["losses/updates"]
    if case == "none":
        assert want["metrics"]["losses/updates"] == 0.0  # no rows on any rank: no optimizer step
    else:
        assert want["metrics"]["losses/updates"] == 1.0
        assert got["metrics"]["losses/grad_norm"] == pytest.approx(
            want["metrics"]["losses/grad_norm"], rel=1e-5
        )


@pytest.mark.slow
@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("case", ["minibatches_empty", "minibatches_unequal"])
def test_uneven_ranks_run_every_minibatch(updates: dict[str, Path], parallel: str, case: str) -> None:
    """epochs 2 x minibatches 2 where rank 1 holds fewer rows (one minibatch, or none): rank 0's four optimizer
    steps run on both ranks, and the ranks end with the same weights."""
    r0, r1 = (torch.load(updates[parallel] / f"{case}.rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["metrics"]["losses/updates"] == 4.0
    for name, w in r0["weights"].items():
        assert torch.equal(r1["weights"][name], w), name
        assert torch.isfinite(w).all(), name


@pytest.mark.slow
@pytest.mark.parametrize("parallel", PARALLEL)
def test_grpo_step_with_no_rows_on_one_rank(parallel: str, tmp_path: Path) -> None:
    """Two GRPO steps where rank 1's first batch has no rows: both steps train and log (rank 0's rows)."""
    torchrun("train", str(tmp_path), parallel)
    rec = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec] == [1, 2]
    assert rec[0]["losses/updates"] == rec[1]["losses/updates"] == 1.0
    assert rec[0]["rollout/kept_rows"] < rec[1]["rollout/kept_rows"]  # (the mean over ranks: rank 1 kept 0)
    if parallel == "ddp":
        a, b = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
        for name, w in a.items():
            assert torch.equal(b[name], w), name
