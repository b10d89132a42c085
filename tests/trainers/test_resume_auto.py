"""Resume follow-ups: the KL reference read from the previous save (checkpoint.old), the step-0 evaluation logged
once after a resume from step 0, ``resume: auto`` (SLURM requeue), SIGUSR1 handled as SIGTERM."""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.errors import ConfigError
from toolgym.trainers import checkpoint
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.preemption import EXIT_SIGUSR1, Preempted, Preemption, resume_command


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()


def test_load_reads_optional_modules_from_the_previous_save(tmp_path: Path) -> None:
    """A save cut between its two renames leaves checkpoint.old only: `load` reads every file there, the
    optional reference included (GRPO looked for it in checkpoint/ and dropped it)."""
    model, ref = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    folder = tmp_path / "checkpoint"
    checkpoint.save(folder, {"model": model, "reference": ref}, opt, checkpoint.Progress(step=2, data_pos=4))
    folder.rename(tmp_path / "checkpoint.old")
    fresh = torch.nn.Linear(2, 2)
    got = checkpoint.load(folder, {"model": torch.nn.Linear(2, 2), "reference": fresh}, opt, ("reference",))
    assert got.step == 2 and got.missing == ()
    assert torch.equal(fresh.weight, ref.weight)
    checkpoint.save(folder, {"model": model}, opt, checkpoint.Progress(step=3))  # saved with kl_coef = 0
    kept = fresh.weight.detach().clone()
    got = checkpoint.load(folder, {"model": model, "reference": fresh}, opt, ("reference",))
    assert got.missing == ("reference",) and torch.equal(fresh.weight, kept)


def test_grpo_resumes_its_kl_reference_from_checkpoint_old(tmp_path: Path, tokenizer: Any) -> None:
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    opts = dict(SMALL, kl_coef=0.1)
    m1 = tiny_model(len(tokenizer))
    train_grpo(GRPOConfig(steps=2, output_dir=str(straight), **opts), m1, tokenizer)
    train_grpo(GRPOConfig(steps=1, output_dir=str(cut), **opts), tiny_model(len(tokenizer)), tokenizer)
    (cut / "checkpoint").rename(cut / "checkpoint.old")  # stopped between _swap's renames
    m2 = tiny_model(len(tokenizer), seed=123)  # everything, the reference too, must come from checkpoint.old
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="the checkpoint holds no KL reference")
        train_grpo(GRPOConfig(steps=2, output_dir=str(cut), resume=True, **opts), m2, tokenizer)
    assert records(straight)[-1]["losses/kl_ref"] == records(cut)[-1]["losses/kl_ref"] > 0
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2), n


def test_auto_starts_fresh_then_resumes_from_step_0_with_one_step_0_evaluation(
    tmp_path: Path, tokenizer: Any, monkeypatch: Any
) -> None:
    """resume: auto in an empty folder starts (true would fail); a SIGUSR1 right after the step-0 evaluation
    stops the run with the step-0 checkpoint; auto again resumes it, and the log holds step 0 once (it was
    evaluated and logged twice)."""
    from toolgym.trainers.metrics_log import MetricsLog

    opts = dict(SMALL, steps=1, eval_every=1, output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="no checkpoint"):
        train_grpo(GRPOConfig(**opts, resume=True), tiny_model(len(tokenizer)), tokenizer)
    log = MetricsLog.log

    def log_then_signal(self: MetricsLog, step: int, metrics: dict[str, float]) -> None:
        log(self, step, metrics)
        if step == 0:
            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(MetricsLog, "log", log_then_signal)
    cfg = GRPOConfig(**opts, resume="auto")
    with pytest.raises(Preempted) as info:
        train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert info.value.step == 0 and info.value.exit_code == EXIT_SIGUSR1 == 138
    assert checkpoint.saved_step(tmp_path / "checkpoint") == 0 and cfg.resume == "auto"  # (not rewritten)
    monkeypatch.setattr(MetricsLog, "log", log)
    train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert [r["step"] for r in records(tmp_path)] == [0, 1]


def test_resume_values_and_flags(tmp_path: Path) -> None:
    from toolgym.cli import build_parser
    from toolgym.trainers.sft import SFTConfig

    assert GRPOConfig(resume="true").resume is True and GRPOConfig(resume="auto").resume == "auto"
    with pytest.raises(ConfigError, match="resume must be true, false or auto"):
        GRPOConfig(resume="maybe")
    parse = build_parser().parse_args
    assert parse(["train", "grpo", "--resume"]).resume is True
    assert parse(["train", "ppo", "--resume", "auto"]).resume == "auto"
    assert parse(["train", "grpo", "--no-resume"]).resume is False
    assert parse(["sft", "--resume", "auto"]).resume == "auto"
    sft = SFTConfig(resume="auto", output_dir=str(tmp_path))
    assert checkpoint.resolve_resume(sft).resume is False and sft.resume == "auto"
    (tmp_path / "checkpoint.old").mkdir()  # a save cut between its renames still counts
    (tmp_path / "checkpoint.old" / "state.pt").write_bytes(b"")
    assert checkpoint.resolve_resume(sft).resume is True
    assert checkpoint.resolve_resume(SFTConfig(resume=True, output_dir=str(tmp_path / "x"))).resume is True


def test_sigusr1_is_handled_as_sigterm(tmp_path: Path, monkeypatch: Any) -> None:
    saves: list[int] = []
    before = signal.getsignal(signal.SIGUSR1)
    with Preemption(resumed=False, saved=lambda s: False) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)  # handled: the default action would end the process
        time.sleep(0.01)
        with pytest.raises(Preempted) as info:
            stop.check(None, 4, tmp_path, lambda: saves.append(4))
    assert saves == [4] and info.value.exit_code == EXIT_SIGUSR1
    assert "(SIGUSR1)" in str(info.value) and signal.getsignal(signal.SIGUSR1) is before
    monkeypatch.setattr("sys.argv", ["toolgym", "train", "grpo", "--resume", "auto", "--steps", "3"])
    assert resume_command() == "toolgym train grpo --steps 3 --resume"
    monkeypatch.setattr("sys.argv", ["toolgym", "sft", "--resume=auto", "--resume", "--no-resume", "x"])
    assert resume_command() == "toolgym sft x --resume"
