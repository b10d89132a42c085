"""FSDP2 (`parallel: fsdp2`, trainers/fsdp.py) on CPU with gloo: one GRPO step on 2 ranks equals DDP's; the
rollout's copy holds the stepped weights on every rank; the DCP checkpoint of 2 ranks loads on 1 and on 2
with the same weights and AdamW state, and a 2-rank run resumed from it equals an uninterrupted one; CPU offload with activation
checkpointing and a sharded KL reference takes the same step; PPO's sharded value model equals plain PPO's."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.processes import run
from tests.trainers.test_distributed import free_port

WORKER = Path(__file__).with_name("fsdp_worker.py")
LR = 1e-2  # fsdp_worker's learning rate


def torchrun(*args: str, ranks: int = 2) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
           str(free_port()), str(WORKER), *args]  # fmt: skip
    proc = run(cmd, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def last_losses(out: Path) -> dict[str, float]:
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    return {k: v for k, v in rec.items() if k.startswith("losses/")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> Path:
    """One GRPO step under DDP and under FSDP2 (2 ranks each), and the FSDP2 checkpoint loaded on 2 ranks."""
    root = tmp_path_factory.mktemp("fsdp")
    torchrun("train", str(root / "ddp"), "ddp")
    torchrun("train", str(root / "fsdp"), "fsdp2")
    torchrun("load", str(root), str(root / "fsdp" / "checkpoint"))
    return root


@pytest.mark.slow
def test_fsdp2_step_equals_ddp(runs: Path) -> None:
    ddp, fsdp = last_losses(runs / "ddp"), last_losses(runs / "fsdp")
    assert ddp.keys() == fsdp.keys()
    for k in ddp:
        assert fsdp[k] == pytest.approx(ddp[k], rel=1e-5, abs=1e-6), k
    stepped = torch.load(runs / "ddp" / "checkpoint" / "model.pt", weights_only=True)
    copies = [torch.load(runs / "fsdp" / f"copy{r}.pt", weights_only=True) for r in (0, 1)]
    for name, w in stepped.items():
        # the rollout reads the stepped weights, whole, on both ranks (Adam's first step moved every one)
        assert torch.equal(copies[0][name], copies[1][name]), name
        # Adam's first step is lr * g / (|g| + eps): where a gradient is eps-sized the sums' other order under
        # FSDP2 (reduce-scatter vs DDP's all-reduce) moves it by up to a few 1e-4 of lr (torch 2.13: 3.5e-6 on
        # one of 2048); a wrong step would be off by ~lr (1e-2)
        torch.testing.assert_close(copies[0][name], w, rtol=0, atol=1e-3 * LR)


@pytest.mark.slow
def test_dcp_checkpoint_of_two_ranks_loads_on_one_and_two(runs: Path) -> None:
    sys.argv = ["fsdp_worker.py", "load", str(runs), str(runs / "fsdp" / "checkpoint")]
    from tests.trainers import fsdp_worker

    fsdp_worker.load(str(runs), str(runs / "fsdp" / "checkpoint"))  # this process: a group of one
    one, two = (torch.load(runs / f"loaded{n}.pt", weights_only=False) for n in (1, 2))
    copy = torch.load(runs / "fsdp" / "copy0.pt", weights_only=True)
    assert one["weights"].keys() == copy.keys()
    for name, w in one["weights"].items():
        assert torch.equal(w, two["weights"][name]) and torch.equal(w, copy[name]), name
    assert one["optimizer"].keys() == copy.keys()  # AdamW state per parameter name
    for name, st in one["optimizer"].items():
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        for k, t in st.items():
            assert torch.equal(t, two["optimizer"][name][k]), (name, k)
        assert float(st["step"]) == 1.0 and st["exp_avg_sq"].abs().sum() > 0, name


@pytest.mark.slow
def test_dcp_checkpoint_loads_without_a_process_group(runs: Path) -> None:
    """A plain single-process model (parallel=ddp, world 1) reads the sharded checkpoint too."""
    from tests.trainers.conftest import tiny_model, tiny_tokenizer
    from toolgym.trainers import checkpoint
    from toolgym.trainers.modeling import make_optimizer

    model = tiny_model(len(tiny_tokenizer()), seed=7)  # type: ignore[arg-type]
    opt = make_optimizer(model, 1e-2, 0.0)  # type: ignore[arg-type]
    progress = checkpoint.load(runs / "fsdp" / "checkpoint", {"model": model}, opt)
    assert progress.step == 1
    copy = torch.load(runs / "fsdp" / "copy0.pt", weights_only=True)
    for name, p in model.named_parameters():  # type: ignore[attr-defined]
        assert torch.equal(p.detach(), copy[name]), name
    assert all(float(opt.state[p]["step"]) == 1.0 for p in model.parameters())  # type: ignore[attr-defined]


@pytest.mark.slow
def test_two_ranks_resume_the_sharded_checkpoint_bit_for_bit(runs: Path, tmp_path: Path) -> None:
    """1 step, the DCP checkpoint, a second step resumed on 2 ranks == 2 steps straight (weights and metrics)."""
    # (a copy: the shared run's files stay those of its one step, whichever test reads them after this one)
    out, straight = tmp_path / "fsdp", tmp_path / "straight"
    shutil.copytree(runs / "fsdp", out)
    torchrun("train", str(out), "fsdp2", "steps=2", "resume")
    torchrun("train", str(straight), "fsdp2", "steps=2")
    a, b = (json.loads((d / "metrics.jsonl").read_text().splitlines()[-1]) for d in (straight, out))
    assert a["step"] == b["step"] == 2
    for k in a:
        if not k.startswith(("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s")):
            assert a[k] == b[k], k
    resumed, whole = (torch.load(d / "copy0.pt", weights_only=True) for d in (out, straight))
    for name, w in whole.items():
        assert torch.equal(resumed[name], w), name


@pytest.mark.slow
def test_cpu_offload_checkpointing_and_kl_reference_run(runs: Path, tmp_path: Path) -> None:
    torchrun("train", str(tmp_path), "fsdp2", "offload", "kl", "gc")
    losses = last_losses(tmp_path)
    assert (
        losses["losses/grad_norm"] > 0 and losses["losses/kl_ref"] == 0.0
    )  # the first step: policy = reference
    assert (tmp_path / "checkpoint" / "reference.pt").is_file()  # the sharded reference is in dcp/ too
    # the KL term has no gradient at the reference: the step equals the one without offload, reference and
    # activation checkpointing
    copy = torch.load(tmp_path / "copy0.pt", weights_only=True)
    for name, w in torch.load(runs / "fsdp" / "copy0.pt", weights_only=True).items():
        torch.testing.assert_close(copy[name], w, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_ppo_value_model_sharded_in_one_process(tmp_path: Path, tokenizer: Any) -> None:
    """PPO under parallel=fsdp2 (a group of one: trunk and value head sharded, rollout on the copy) takes the
    same step as plain PPO, and resumes from its DCP checkpoint."""
    from tests.trainers.conftest import register_fake_env, tiny_model
    from tests.trainers.test_train import SMALL
    from toolgym.trainers.ppo import PPOConfig
    from toolgym.trainers.ppo import train as train_ppo

    register_fake_env()
    runs = {}
    for parallel in ("ddp", "fsdp2"):
        out = tmp_path / parallel
        train_ppo(
            PPOConfig(output_dir=str(out), **SMALL, steps=1, parallel=parallel),
            tiny_model(len(tokenizer)),
            tokenizer,
        )
        runs[parallel] = last_losses(out)
    for k, v in runs["ddp"].items():
        assert runs["fsdp2"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert (tmp_path / "fsdp2" / "checkpoint" / "dcp").is_dir()
    cfg = PPOConfig(output_dir=str(tmp_path / "fsdp2"), **SMALL, steps=2, parallel="fsdp2", resume=True)
    train_ppo(cfg, tiny_model(len(tokenizer), seed=5), tokenizer)
    assert json.loads((tmp_path / "fsdp2" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2


@pytest.mark.slow
def test_ranks_with_unequal_micro_batches_run_in_lockstep(tmp_path: Path) -> None:
    torchrun("lockstep", str(tmp_path), "-")  # would hang (the test's timeout) without lockstep
    r0, r1 = (torch.load(tmp_path / f"lockstep{r}.pt") for r in (0, 1))
    assert r0 == [[0, 1], [2, 3], [4]] and r1 == [[0, 1], [], []]  # the most chunks any rank has: 3


@pytest.mark.slow
def test_our_engine_rolls_out_on_the_gathered_copy(tmp_path: Path, tokenizer: Any) -> None:
    """engine=fast under fsdp2 (one process): the engine packs from the rollout copy, re-packed after each
    step's gather; two steps equal the same two steps without sharding."""
    from tests.trainers.conftest import register_fake_env, tiny_model
    from tests.trainers.test_train import SMALL
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo

    register_fake_env()
    got = {}
    for parallel in ("ddp", "fsdp2"):
        out = tmp_path / parallel
        cfg = GRPOConfig(output_dir=str(out), **SMALL, steps=2, engine="fast", parallel=parallel)
        train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
        got[parallel] = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for k, v in got["ddp"].items():  # step 2 sampled from the weights step 1 made
        if k.startswith(("charts/", "losses/", "eval/")):
            assert got["fsdp2"][k] == pytest.approx(v, rel=1e-4, abs=1e-5), k


@pytest.mark.slow
def test_several_optimizer_steps_a_batch_equal_ddp(tmp_path: Path) -> None:
    """epochs 2 x minibatches 2: the old-logprob pass and four optimizer steps, each in lockstep."""
    for parallel in ("ddp", "fsdp2"):
        torchrun("train", str(tmp_path / parallel), parallel, "epochs=2", "minibatches=2")
    ddp, fsdp = last_losses(tmp_path / "ddp"), last_losses(tmp_path / "fsdp2")
    assert ddp["losses/updates"] == fsdp["losses/updates"] == 4.0
    for k in ddp:
        assert fsdp[k] == pytest.approx(ddp[k], rel=1e-4, abs=1e-5), k
