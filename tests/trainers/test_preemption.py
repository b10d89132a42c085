"""Preemption (trainers/preemption.py): SIGTERM to a real `python -m toolgym train|sft` mid-run saves the last
completed step, exits 143, and `--resume` ends where a run never stopped ends; the handler and the ranks'
agreement in-process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.processes import running
from tests.trainers.conftest import tiny_model, tiny_tokenizer
from toolgym.trainers import checkpoint, preemption
from toolgym.trainers.preemption import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_TIME_LIMIT,
    REPEAT_S,
    Preempted,
    Preemption,
)

ROOT = Path(__file__).parents[2]
# started by every subprocess (PYTHONPATH): the test envs, one whose episodes take `SLOW_S` seconds more,
# and SFT micro-batches that take `SLOW_S` seconds more (so that a signal lands inside a run of tiny steps)
SITE = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
import gymnasium as gym
from tests.testing_env import VowelCountEnv, register
import toolgym.trainers.sft as sft
SLOW_S = float(os.environ.get("SLOW_S", "0"))
register()
class SlowVowel(VowelCountEnv):
    def check_answer(self, answer):
        time.sleep(SLOW_S)
        return super().check_answer(answer)
gym.register("tests/SlowVowel-v0", entry_point=SlowVowel, disable_env_checker=True)
_losses = sft.token_losses
def slow_losses(model, batch):
    time.sleep(SLOW_S)
    return _losses(model, batch)
sft.token_losses = slow_losses
"""
TRAIN = ["--env-ids", "tests/SlowVowel-v0", "--prompts-per-step", "2", "--budget", "4", "--max-new-tokens", "6",
         "--max-total-tokens", "256", "--lr", "1e-2", "--device", "cpu", "--threads", "1", "--no-tensorboard",
         "--no-progress", "--eval-episodes", "1", "--micro-batch-rows", "4"]  # fmt: skip
SFT = ["--env-ids", "toolgym/Calculator-v0", "--env-kwargs", '{"prompt_format": "text", "max_turns": 3}',
       "--episodes", "4", "--batch-size", "1", "--lr", "1e-2", "--device", "cpu", "--threads", "1",
       "--no-tensorboard", "--no-progress", "--eval-episodes", "1", "--max-new-tokens", "2", "--no-eval-before"]  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the tiny model (tiny/) and the sitecustomize.py above."""
    folder = tmp_path_factory.mktemp("preempt")
    (folder / "sitecustomize.py").write_text(SITE)
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))  # type: ignore[arg-type]
    model.save_pretrained(folder / "tiny")  # type: ignore[attr-defined]
    tok.save_pretrained(folder / "tiny")  # type: ignore[attr-defined]
    return folder


def start(site: Path, args: list[str], slow_s: float) -> Any:
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SLOW_S": str(slow_s)}
    cmd = [sys.executable, "-m", "toolgym", *args, "--model", str(site / "tiny")]
    return running(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(out: Path, step: int, proc: Any, timeout: float = 120) -> None:
    """Until metrics.jsonl has a line for `step` (the run is then inside the next one)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        path = out / "metrics.jsonl"
        if path.is_file() and f'"step": {step},' in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no step {step} in {timeout} s")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's modules' tensors (the policy; PPO's value head too)."""
    out = {}
    for name in ("model", "value_head"):
        path = folder / "checkpoint" / f"{name}.pt"
        if path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=False)
            out |= {f"{name}.{k}": v for k, v in saved.items()}
    return out


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_sigterm_mid_run_saves_and_resume_ends_as_an_unstopped_run(
    site: Path, tmp_path: Path, algorithm: str
) -> None:
    steps = ["--steps", "4"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    with (
        start(site, ["train", algorithm, *TRAIN, *steps, "--output-dir", str(straight)], 0.0) as ref,
        start(site, ["train", algorithm, *TRAIN, *steps, "--output-dir", str(split)], 0.1) as proc,
    ):
        wait_for_step(split, 1, proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        proc.send_signal(
            signal.SIGTERM
        )  # a copy within REPEAT_S (torchrun forwarding it) is not a second one
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == EXIT_SIGTERM, err[-3000:]
        assert ref.wait(timeout=120) == 0
    stopped = checkpoint.saved_step(split / "checkpoint")
    assert stopped is not None and 1 <= stopped < 4  # the step in progress was finished, not the run
    assert (
        f"preempted at step {stopped} (SIGTERM): checkpoint in {split / 'checkpoint'}; resume with toolgym train"
        in err
    )
    assert "--resume" in err.splitlines()[-1]
    with start(
        site, ["train", algorithm, *TRAIN, *steps, "--output-dir", str(split), "--resume"], 0.0
    ) as again:
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err[-3000:]
    assert checkpoint.saved_step(split / "checkpoint") == 4
    a, b = weights(straight), weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
def test_sigterm_stops_sft_and_resume_matches(site: Path, tmp_path: Path) -> None:
    steps = ["--steps", "6", "--save-every", "0"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    with (
        start(site, ["sft", *SFT, *steps, "--output-dir", str(straight)], 0.0) as ref,
        start(site, ["sft", *SFT, *steps, "--output-dir", str(split)], 0.3) as proc,
    ):
        wait_for_step(split, 1, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == EXIT_SIGTERM, err[-3000:]
        assert ref.wait(timeout=120) == 0
    stopped = checkpoint.saved_step(split / "checkpoint")
    assert stopped is not None and 1 <= stopped < 6
    assert f"preempted at step {stopped} (SIGTERM)" in err and "toolgym sft" in err
    assert not (split / "model").exists()
    with start(site, ["sft", *SFT, *steps, "--output-dir", str(split), "--resume"], 0.0) as again:
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err[-3000:]
    from safetensors.torch import load_file

    a, b = (
        load_file(straight / "model" / "model.safetensors"),
        load_file(split / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
def test_a_second_ctrl_c_stops_at_once_and_a_second_sigterm_does_not(site: Path, tmp_path: Path) -> None:
    """Episodes of 1 s: the step in progress takes ~4 s more. A second SIGTERM (``timeout`` signalling its
    group, then a watchdog: machines repeat themselves) is ignored and the step's checkpoint is saved; a
    second Ctrl-C (a person) ends the run now, without a checkpoint of its own."""
    for first, second, code in (
        (signal.SIGTERM, signal.SIGTERM, EXIT_SIGTERM),
        (signal.SIGINT, signal.SIGINT, 130),
        (signal.SIGTERM, signal.SIGINT, 130),  # a person at the terminal after the scheduler's SIGTERM
    ):
        out = tmp_path / f"run{first}-{second}"
        args = ["train", "grpo", *TRAIN, "--budget", "2", "--steps", "3", "--output-dir", str(out)]
        with start(site, args, 1.0) as proc:
            wait_for_step(out, 1, proc, timeout=180)  # (step 1 logged: its first signal comes inside step 2)
            proc.send_signal(first)
            time.sleep(REPEAT_S + 0.5)
            t0 = time.monotonic()
            proc.send_signal(second)
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err[-3000:]
        if second == signal.SIGINT:
            assert time.monotonic() - t0 < 5
            assert "got SIGINT again: stopping now" in err and "preempted at step" not in err
        else:
            assert "again" not in err and "preempted at step 2 (SIGTERM)" in err
            assert checkpoint.saved_step(out / "checkpoint") == 2


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
@pytest.mark.parametrize("command", ["grpo", "sft"])
def test_a_time_limit_stops_at_a_step_boundary_with_a_checkpoint_and_exit_75(
    site: Path, tmp_path: Path, command: str
) -> None:
    """A limit shorter than the run: the first step always runs, then the run saves and exits 75 (before any
    signal); the same command with --resume and no limit ends the run."""
    out = tmp_path / "run"
    if command == "grpo":
        args = ["train", "grpo", *TRAIN, "--budget", "2", "--steps", "4", "--output-dir", str(out)]
    else:
        args = ["sft", *SFT, "--epochs", "2", "--output-dir", str(out)]
    with start(site, [*args, "--time-limit-s", "0:01"], 0.5) as proc:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_TIME_LIMIT == 75, err[-3000:]
    assert "time limit: stopped at step 1 (" in err and "resume with" in err
    assert checkpoint.saved_step(out / "checkpoint") == 1
    with start(site, [*args, "--resume"], 0.0) as again:
        _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]


WORKER = """
import os, sys
from pathlib import Path
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
Path(sys.argv[1], f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
from toolgym.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_under_torchrun_one_ranks_signal_stops_every_rank(site: Path, tmp_path: Path, parallel: str) -> None:
    """SIGTERM to rank 1 only (2 gloo ranks): both ranks stop at the same step boundary (no rank left blocked
    in a collective), rank 0 saves that step (both ranks under fsdp2: DCP shards) and says so, both exit 143."""
    from tests.trainers.test_distributed import free_port

    out, worker = tmp_path / "run", tmp_path / "worker.py"
    worker.write_text(WORKER)
    args = ["train", "grpo", *TRAIN, "--steps", "6", "--output-dir", str(out), "--model", str(site / "tiny"),
            "--parallel", parallel]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(out), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SLOW_S": "0.1", "OMP_NUM_THREADS": "1"}
    with running(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        wait_for_step(out, 1, proc, timeout=180)
        os.kill(int((out / "rank1.pid").read_text()), signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    stopped = checkpoint.saved_step(out / "checkpoint")
    assert stopped is not None and 1 <= stopped < 6, err[-3000:]
    assert f"preempted at step {stopped} (SIGTERM)" in err
    # every rank reports the stop's code (torchrun's SIGTERM to a rank still tearing down is ignored, and the
    # ranks end at once after the save); torchrun itself exits 1 when any rank does not exit 0
    codes = re.findall(r"exitcode\s+: (-?\d+)", err)
    assert proc.returncode == 1 and codes == ["143", "143"], err[-3000:]
    assert (out / "checkpoint" / "dcp").is_dir() == (parallel == "fsdp2")


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
def test_the_split_layout_stops_on_a_signal_to_every_process(site: Path, tmp_path: Path) -> None:
    """`rollout_ranks` 1 under torchrun, SIGTERM to the whole process group (what SLURM and Ctrl-C do; torchrun
    forwards it again): the rollout rank serves on while the learner finishes its step and saves it."""
    from tests.trainers.test_distributed import free_port

    out, worker = tmp_path / "run", tmp_path / "worker.py"
    worker.write_text(WORKER)
    args = ["train", "grpo", *TRAIN, "--steps", "6", "--max-staleness", "2", "--rollout-ranks", "1",
            "--output-dir", str(out), "--model", str(site / "tiny")]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(out), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SLOW_S": "0.1", "OMP_NUM_THREADS": "1"}
    with running(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        wait_for_step(out, 1, proc, timeout=180)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    stopped = checkpoint.saved_step(out / "checkpoint")
    assert stopped is not None and 1 <= stopped < 6, err[-3000:]
    assert f"preempted at step {stopped} (SIGTERM)" in err, err[-3000:]
    # (torchrun got the signal too: it reports no rank's code, and exits 1) the rollout rank learnt the
    # learners' stop from torchrun's store and left with it, not with a traceback of its lost connection
    assert proc.returncode == 1 and "[rank1]: Traceback" not in err, err[-3000:]
    assert json.loads((out / "preempted.json").read_text())["exit_code"] == EXIT_SIGTERM


def torchrun(site: Path, out: Path, args: list[str]) -> Any:
    from tests.trainers.test_distributed import free_port

    worker = out.parent / "worker.py"
    worker.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(out), "train", "grpo", *TRAIN, "--output-dir", str(out), "--model", str(site / "tiny"),
           *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SLOW_S": "0.1", "OMP_NUM_THREADS": "1"}
    return running(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # real subprocesses: 10-60 s on 2 busy cores
@pytest.mark.parametrize("layout", ["ddp", "fsdp2", "split"])
def test_under_torchrun_the_time_limit_stops_every_rank_with_75_and_resumes(
    site: Path, tmp_path: Path, layout: str
) -> None:
    """A limit shorter than a step (2 gloo ranks): step 1 runs, every rank (the split layout's rollout rank too)
    exits 75, the checkpoint holds step 1 (DCP shards under fsdp2), and the same command resumes to the end."""
    out = tmp_path / "run"
    args = ["--steps", "3"] + (
        ["--max-staleness", "2", "--rollout-ranks", "1"] if layout == "split" else ["--parallel", layout]
    )
    with torchrun(site, out, [*args, "--time-limit-s", "0:01", "--resume", "auto"]) as proc:
        _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err[-3000:]  # torchrun's own code: 1 when any rank did not exit 0
    assert re.findall(r"exitcode\s+: (-?\d+)", err) == ["75", "75"], err[-3000:]
    assert err.count("time limit: stopped at step 1 (") == 1
    stopped = json.loads((out / "preempted.json").read_text())  # what a requeue script reads under torchrun
    assert stopped["exit_code"] == 75 and stopped["step"] == 1 and stopped["signal"] is None
    assert checkpoint.saved_step(out / "checkpoint") == 1
    assert (out / "checkpoint" / "dcp").is_dir() == (layout == "fsdp2")
    with torchrun(site, out, [*args, "--resume", "auto"]) as again:
        _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err[-3000:]
    assert checkpoint.saved_step(out / "checkpoint") == 3 and not (out / "preempted.json").exists()


def test_an_asynchronous_run_stops_at_the_step_boundary(
    tmp_path: Path, tokenizer: Any, monkeypatch: Any
) -> None:
    """max_staleness 1 (the rollout worker thread runs ahead): SIGTERM right after step 1 stops the run there,
    the worker is stopped, and the run resumes to its end (not bit for bit: docs/trainer.md, asynchronous
    rollouts, item 5)."""
    import threading

    from tests.trainers.conftest import register_fake_env
    from tests.trainers.test_train import SMALL, records
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo
    from toolgym.trainers.metrics_log import MetricsLog

    register_fake_env()
    log = MetricsLog.log

    def log_then_signal(self: MetricsLog, step: int, metrics: dict[str, float]) -> None:
        log(self, step, metrics)
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(MetricsLog, "log", log_then_signal)
    before = set(threading.enumerate())
    opts = dict(SMALL, steps=3, max_staleness=1, output_dir=str(tmp_path))
    with pytest.raises(Preempted) as info:
        train_grpo(GRPOConfig(**opts), tiny_model(len(tokenizer)), tokenizer)
    assert info.value.step == 1 and info.value.exit_code == EXIT_SIGTERM
    assert checkpoint.saved_step(tmp_path / "checkpoint") == 1
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]  # the worker was stopped
    monkeypatch.setattr(MetricsLog, "log", log)
    train_grpo(GRPOConfig(**opts, resume=True), tiny_model(len(tokenizer), seed=5), tokenizer)
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3]


# ----- in-process: the handler and the agreement between ranks ------------------------------------------------
class FakeDist:
    """Two ranks as seen by one: `others` is what the other rank adds to the all_reduce."""

    def __init__(self, rank: int, others: float, sharded: bool = False) -> None:
        self.rank, self.world, self.others, self.sharded = rank, 2, others, sharded
        self.calls: list[str] = []

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, value: float) -> float:
        self.calls.append("all_reduce")
        return value + self.others

    def barrier(self) -> None:
        self.calls.append("barrier")


def test_a_signal_sets_the_flag_and_the_loop_saves_then_raises(tmp_path: Path) -> None:
    saves: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    with Preemption(resumed=False, saved=lambda s: s % 2 == 0) as stop:
        stop.check(None, 0, tmp_path, lambda: saves.append(0))  # no signal: nothing
        os.kill(os.getpid(), signal.SIGINT)  # handled: no KeyboardInterrupt
        time.sleep(0.01)
        with pytest.raises(Preempted) as info:
            stop.check(None, 3, tmp_path, lambda: saves.append(3))
    assert saves == [3] and info.value.exit_code == EXIT_SIGINT == 130
    assert signal.getsignal(signal.SIGINT) is before  # restored
    assert "preempted at step 3 (SIGINT)" in str(info.value)


def test_a_copy_of_the_signal_is_ignored_and_a_notebooks_second_interrupt_raises(monkeypatch: Any) -> None:
    import types

    from toolgym.trainers import preemption

    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    with Preemption(resumed=False, saved=lambda s: False) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # within REPEAT_S: the same signal forwarded
        time.sleep(0.01)
        assert stop.signum == signal.SIGINT
        monkeypatch.setattr(preemption, "REPEAT_S", 0.0)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)


@pytest.mark.parametrize(
    ("resumed", "first", "step", "on_disk"),
    [(False, True, 0, False), (True, True, 5, True), (False, False, 4, True), (False, False, 3, False)],
)
def test_no_second_save_of_a_checkpoint_on_disk(
    tmp_path: Path, resumed: bool, first: bool, step: int, on_disk: bool
) -> None:
    saves: list[int] = []
    stop = Preemption(resumed=resumed, saved=lambda s: s % 2 == 0)
    if not first:
        stop.check(None, step - 1, tmp_path, lambda: saves.append(-1))
    stop.signum = signal.SIGTERM
    with pytest.raises(Preempted) as info:
        stop.check(None, step, tmp_path, lambda: saves.append(step))
    assert saves == ([] if on_disk else [step]) and info.value.exit_code == EXIT_SIGTERM == 143


@pytest.mark.parametrize("sharded", [False, True])
def test_every_rank_stops_when_one_got_the_signal(tmp_path: Path, sharded: bool) -> None:
    """Rank 1 got no signal, rank 0 did (the all_reduce says 1): both stop at the same boundary; rank 0 saves
    (every rank when the model is sharded: DCP) and both wait at the barrier before exiting."""
    for rank in (0, 1):
        dist, saves = FakeDist(rank, others=1000.0 * (rank == 1), sharded=sharded), []
        stop = Preemption(resumed=False, saved=lambda s: False)
        if rank == 0:
            stop.signum = signal.SIGTERM
        with pytest.raises(Preempted) as info:
            stop.check(dist, 2, tmp_path, lambda saves=saves: saves.append(2))
        assert info.value.exit_code == EXIT_SIGTERM
        assert saves == ([2] if rank == 0 or sharded else [])
        assert dist.calls == ["all_reduce", "barrier"]
    quiet = FakeDist(0, others=0.0)
    Preemption(resumed=False, saved=lambda s: False).check(quiet, 2, tmp_path, lambda: None)
    assert quiet.calls == ["all_reduce"]  # no signal anywhere: one all_reduce a step, nothing else


def test_a_run_stopped_between_the_renames_resumes_from_the_previous_save(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    folder = tmp_path / "checkpoint"
    checkpoint.save(folder, {"model": model}, opt, checkpoint.Progress(step=3, data_pos=6))
    folder.rename(tmp_path / "checkpoint.old")  # _swap's first rename done, its second not
    assert checkpoint.saved_step(folder) == 3
    assert checkpoint.load(folder, {"model": model}, opt).step == 3


class Clock:
    """time.monotonic for preemption.py, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_time_limit_runs_the_first_step_then_stops_before_a_step_that_would_not_fit(
    tmp_path: Path, monkeypatch: Any
) -> None:
    clock = Clock()
    monkeypatch.setattr(preemption.time, "monotonic", clock)
    saves: list[int] = []
    stop = Preemption(resumed=False, saved=lambda s: False, time_limit_s=100.0)
    clock.now += 60  # setup (model, engine) counts
    stop.check(None, 0, tmp_path, lambda: saves.append(0))  # the first step runs: nothing to estimate it by
    clock.now += 10
    stop.check(None, 1, tmp_path, lambda: saves.append(1))  # 70 s gone; next ~12.5 s: fits
    clock.now += 20  # a slow step (an evaluation): the next one is estimated at 25 s, past 100
    with pytest.raises(Preempted) as info:
        stop.check(None, 2, tmp_path, lambda: saves.append(2))
    assert saves == [2] and info.value.exit_code == EXIT_TIME_LIMIT and info.value.signum is None
    assert "time limit: stopped at step 2 (90 s gone of 100 s; the next step would take ~25 s)" in str(
        info.value
    )


def test_the_first_step_runs_past_the_limit_and_no_limit_never_stops(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A requeued job whose setup alone used up its limit still makes a step of progress each call."""
    clock = Clock()
    monkeypatch.setattr(preemption.time, "monotonic", clock)
    stop = Preemption(resumed=True, saved=lambda s: False, time_limit_s=5.0)
    clock.now += 6
    saves: list[int] = []
    stop.check(None, 7, tmp_path, lambda: saves.append(7))
    clock.now += 1
    with pytest.raises(Preempted):
        stop.check(None, 8, tmp_path, lambda: saves.append(8))
    assert saves == [8]
    free = Preemption(resumed=False, saved=lambda s: False)
    for step in range(5):
        clock.now += 1e6
        free.check(None, step, tmp_path, lambda: None)


@pytest.mark.parametrize(
    ("mine", "others", "code"), [(0, 1.0, 75), (1, 0.0, 75), (1, 1000.0, 143), (0, 0.0, None)]
)
def test_ranks_agree_on_a_time_limit_and_a_signal_wins(
    tmp_path: Path, monkeypatch: Any, mine: int, others: float, code: int | None
) -> None:
    """`mine`: this rank's clock says stop; `others`: the other rank's share of the all_reduce (1: its clock,
    1000: a signal). Every rank stops with the same exit code."""
    clock = Clock()
    monkeypatch.setattr(preemption.time, "monotonic", clock)
    stop = Preemption(resumed=False, saved=lambda s: False, time_limit_s=10.0 if mine else None)
    stop.check(FakeDist(1, others=0.0), 2, tmp_path, lambda: None)  # the first step always runs
    clock.now += 20
    dist = FakeDist(1, others=others)
    if code is None:
        stop.check(dist, 3, tmp_path, lambda: None)
        return
    with pytest.raises(Preempted) as info:
        stop.check(dist, 3, tmp_path, lambda: None)
    assert info.value.exit_code == code


def test_repeated_sigterm_never_escalates(monkeypatch: Any) -> None:
    exits: list[int] = []
    monkeypatch.setattr(preemption.os, "_exit", exits.append)
    with Preemption(resumed=False, saved=lambda s: False) as stop:
        stop._handle(signal.SIGTERM, None)
        monkeypatch.setattr(preemption, "REPEAT_S", 0.0)
        stop._handle(signal.SIGTERM, None)
        stop._handle(signal.SIGUSR1, None)
        assert exits == [] and stop.signum == signal.SIGTERM
        stop._handle(signal.SIGINT, None)  # a person at the terminal after the scheduler's SIGTERM
    assert exits == [130]


def test_a_process_still_running_after_the_signal_writes_its_threads_stacks(
    monkeypatch: Any, capfd: Any
) -> None:
    # a step that never ends (a deadlock) says where each thread waits before the SIGKILL comes
    monkeypatch.setattr(preemption, "STACKS_AFTER_S", 0.05)
    with Preemption(resumed=False, saved=lambda s: False) as stop:
        stop._handle(signal.SIGTERM, None)
        time.sleep(0.5)
    err = capfd.readouterr().err
    assert "still running 0 s after SIGTERM; where each thread is:" in err
    assert "test_a_process_still_running_after_the_signal" in err  # this thread's frame
    with Preemption(resumed=False, saved=lambda s: False) as stop:  # a run that ends in time writes nothing
        stop._handle(signal.SIGTERM, None)
    time.sleep(0.3)
    assert "where each thread is" not in capfd.readouterr().err
