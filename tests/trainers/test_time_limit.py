"""The time limit (`time_limit_s`, trainers/preemption.py) in-process, on a clock moved by hand: a run stopped by
its limit and resumed with none ends bit for bit as a run never stopped (GRPO, PPO, SFT); its interplay with
`save_every`, `eval_every`, `resume` (true and auto) and a limit already spent; the values a config may hold.
Each step boundary (`Preemption.check`) moves the clock by `STEP_S`; nothing else does (preemption.py reads
its own `time`, replaced here, so no other code sees a frozen clock)."""

from __future__ import annotations

import contextlib
import json
import signal
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.errors import ConfigError
from toolgym.trainers import checkpoint, preemption
from toolgym.trainers.config import parse_time_limit
from toolgym.trainers.preemption import EXIT_SIGTERM, EXIT_TIME_LIMIT, Preempted, Preemption

STEP_S = 10.0
# Checks at 10, 20, 30 s (the first runs; then the next step is estimated at 12.5 s): 20 + 12.5 fits in 35,
# 30 + 12.5 does not, so a 35 s limit stops after step 2.
LIMIT_S = 35.0
CALC = "toolgym/Calculator-v0"
SFT_OPTS: dict[str, Any] = dict(
    env_ids=[CALC], env_kwargs={"prompt_format": "text", "max_turns": 3}, episodes=4, batch_size=2, steps=4,
    warmup_steps=2, pack_tokens=4096, lr=1e-2, device="cpu", tensorboard=False, progress=False,
    eval_episodes=1, max_new_tokens=2,
)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ticking(monkeypatch: pytest.MonkeyPatch, step_s: float = STEP_S) -> Clock:
    """preemption.py's clock, moved `step_s` at every step boundary (before the check reads it)."""
    clock = Clock()
    monkeypatch.setattr(preemption, "time", types.SimpleNamespace(monotonic=clock))
    check = Preemption.check

    def tick(self: Preemption, *args: Any, **kwargs: Any) -> None:
        clock.now += step_s
        check(self, *args, **kwargs)

    monkeypatch.setattr(Preemption, "check", tick)
    return clock


def count_saves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps `checkpoint.save` writes, in order."""
    saves: list[int] = []
    save = checkpoint.save

    def counted(folder: Path, modules: Any, optimizer: Any, progress: Any, *args: Any, **kw: Any) -> None:
        saves.append(progress.step)
        save(folder, modules, optimizer, progress, *args, **kw)

    monkeypatch.setattr(checkpoint, "save", counted)
    return saves


def rl(algorithm: str, out: Path, tokenizer: Any, seed: int = 0, **kw: Any) -> Any:
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo
    from toolgym.trainers.ppo import PPOConfig
    from toolgym.trainers.ppo import train as train_ppo

    register_fake_env()
    model = tiny_model(len(tokenizer), seed=seed)
    opts = dict(SMALL, output_dir=str(out), **kw)
    if algorithm == "grpo":
        train_grpo(GRPOConfig(**opts), model, tokenizer)
    else:
        train_ppo(PPOConfig(**opts), model, tokenizer)
    return model


def same_weights(a: Any, b: Any) -> None:
    for (n, p1), p2 in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p1, p2), n


def same_records(a: Path, b: Path) -> None:
    ra, rb = records(a), records(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb, strict=True):
        skip = ("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s")
        assert {k: v for k, v in x.items() if not k.startswith(skip)} == {
            k: v for k, v in y.items() if not k.startswith(skip)
        }


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_run_stopped_by_its_time_limit_resumes_bit_for_bit(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    straight = rl(algorithm, tmp_path / "straight", tokenizer, steps=4)
    ticking(monkeypatch)
    saves = count_saves(monkeypatch)
    with pytest.raises(Preempted) as info:
        rl(algorithm, tmp_path / "split", tokenizer, steps=4, time_limit_s=LIMIT_S)
    assert info.value.step == 2 and info.value.exit_code == EXIT_TIME_LIMIT and info.value.signum is None
    assert "time limit: stopped at step 2 (30 s gone of 35 s; the next step would take ~12 s)" in str(
        info.value
    )
    assert saves == [2] and checkpoint.saved_step(tmp_path / "split" / "checkpoint") == 2
    # no limit now, another initialisation: everything comes from the checkpoint
    resumed = rl(algorithm, tmp_path / "split", tokenizer, seed=123, steps=4, resume=True)
    same_weights(straight, resumed)
    same_records(tmp_path / "straight", tmp_path / "split")


def test_sft_stopped_by_its_time_limit_resumes_bit_for_bit(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.trainers.sft import SFTConfig
    from toolgym.trainers.sft import train as train_sft

    def run(out: Path, seed: int = 0, **kw: Any) -> tuple[Any, dict[str, Any]]:
        model = tiny_model(len(tokenizer), seed=seed)
        return model, train_sft(SFTConfig(output_dir=str(out), **SFT_OPTS, **kw), model, tokenizer)

    straight, s1 = run(tmp_path / "straight")
    with monkeypatch.context() as m:
        ticking(m)
        with pytest.raises(Preempted) as info:
            run(tmp_path / "split", time_limit_s="0:35")  # SLURM's MM:SS
    assert info.value.step == 2 and info.value.exit_code == EXIT_TIME_LIMIT
    assert not (tmp_path / "split" / "model").exists()
    resumed, s2 = run(tmp_path / "split", seed=123, resume="auto")
    same_weights(straight, resumed)
    for key in ("success_before", "success_after", "trained_tokens", "steps"):
        assert s1[key] == s2[key], key


def test_the_limit_does_not_save_a_step_save_every_saved(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticking(monkeypatch)
    saves = count_saves(monkeypatch)
    with pytest.raises(Preempted) as info:
        rl("grpo", tmp_path, tokenizer, steps=4, save_every=2, time_limit_s=LIMIT_S)
    assert info.value.step == 2 and saves == [2]  # the loop's save of step 2, not a second one
    with pytest.raises(Preempted) as info:
        rl("grpo", tmp_path / "b", tokenizer, steps=4, save_every=3, time_limit_s=LIMIT_S)
    assert info.value.step == 2 and saves == [2, 2]  # step 2 was not due: the stop saved it


def test_a_long_evaluation_counts_in_the_estimate(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval_every 1 with evaluations of 20 s: the step-1 cycle is 30 s (estimate 37.5 s), so a 60 s limit
    stops after step 1 (without the evaluation it would run 4 steps)."""
    from toolgym.trainers import grpo

    clock = ticking(monkeypatch)
    evaluate = grpo.evaluate

    def slow(*args: Any, **kw: Any) -> dict[str, float]:
        clock.now += 20
        return evaluate(*args, **kw)

    monkeypatch.setattr(grpo, "evaluate", slow)
    with pytest.raises(Preempted) as info:
        rl("grpo", tmp_path, tokenizer, steps=4, eval_every=1, eval_episodes=1, time_limit_s=60)
    # (the step-0 evaluation comes before the first check: setup, not a step)
    assert info.value.step == 1 and "the next step would take ~38 s" in str(info.value)


def test_a_spent_limit_still_runs_one_step_and_a_resumed_run_checks_from_its_step(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit smaller than one step: every call (fresh, then resumed with `resume: auto` and the same limit)
    makes one step and saves it; the first check of a resumed run is at the step it resumed from (nothing
    saved twice)."""
    ticking(monkeypatch)
    saves = count_saves(monkeypatch)
    for call in (1, 2, 3):
        with pytest.raises(Preempted) as info:
            rl("grpo", tmp_path, tokenizer, steps=4, time_limit_s=1, resume="auto")
        assert info.value.step == call and info.value.exit_code == EXIT_TIME_LIMIT
    assert saves == [1, 2, 3]
    rl("grpo", tmp_path, tokenizer, steps=4, time_limit_s=1, resume="auto")  # step 4: the last one
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3, 4] and saves == [1, 2, 3, 4]


def test_a_signal_and_the_clock_at_the_same_boundary_stop_as_the_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(preemption, "time", types.SimpleNamespace(monotonic=clock))
    stop = Preemption(resumed=False, saved=lambda s: False, time_limit_s=5.0)
    stop.check(None, 0, tmp_path, lambda: None)
    clock.now += 100
    stop.signum = signal.SIGTERM
    with pytest.raises(Preempted) as info:
        stop.check(None, 1, tmp_path, lambda: None)
    assert info.value.exit_code == EXIT_SIGTERM


# ----- the values a config may hold ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None), ("", None), ("none", None), ("None", None), ("null", None), (0, None), ("0", None),
        (0.0, None), ("0:00", None), (90, 90.0), (90.5, 90.5), ("90", 90.0), (" 90 ", 90.0), ("1.5", 1.5),
        ("1:00", 60.0), ("90:00", 5400.0), ("1:30:00", 5400.0), ("1-00:00:00", 86400.0), ("2-12", 216000.0),
        ("1-02:03", 93780.0),
    ],
)  # fmt: skip
def test_time_limit_values(value: Any, seconds: float | None) -> None:
    assert parse_time_limit(value) == seconds


@pytest.mark.parametrize(
    "value", ["-1", -1, -0.5, "abc", "1:2:3:4", "1-", "1h", "1:xx", True, False, float("nan"), "nan", "inf"]
)
def test_bad_time_limits_are_config_errors(value: Any) -> None:
    with pytest.raises(ConfigError, match="time_limit_s"):
        parse_time_limit(value)


def test_yaml_forms_of_a_time_limit(tmp_path: Path) -> None:
    """YAML reads ``1:30:00`` as a base-60 integer (5400) and ``1-00:00:00`` as text: the same seconds."""
    import yaml

    from toolgym.trainers.grpo import GRPOConfig

    for text, seconds in (("5400", 5400.0), ("5400.5", 5400.5), ("1:30:00", 5400.0), ('"1:30:00"', 5400.0),
                          ("1-00:00:00", 86400.0), ("null", None), ("0", None), ("none", None)):  # fmt: skip
        raw = yaml.safe_load(f"time_limit_s: {text}")
        cfg = GRPOConfig(env_ids=["x"], time_limit_s=raw["time_limit_s"])
        assert cfg.time_limit_s == seconds and cfg.time_limit() == seconds, text
        assert json.loads(json.dumps(cfg.to_dict()))["time_limit_s"] == seconds  # config.json


def test_the_commands_take_the_flag_and_dpo_refuses_it(capsys: pytest.CaptureFixture[str]) -> None:
    from toolgym.cli import main

    for args in (["train", "grpo"], ["train", "ppo"], ["sft"]):
        assert main([*args, "--time-limit-s", "1-00:00:00", "--print-config"]) == 0
        assert json.loads(capsys.readouterr().out)["time_limit_s"] == 86400.0
    assert main(["train", "grpo", "--time-limit-s", "soon", "--print-config"]) == 2
    assert "time_limit_s must be seconds" in capsys.readouterr().err
    assert main(["dpo", "--time-limit-s", "60", "--data", "x.jsonl"]) == 2
    assert "toolgym dpo keeps no checkpoint" in capsys.readouterr().err


def test_an_asynchronous_run_stops_for_time_and_its_worker_with_it(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_staleness 1 (the rollout worker thread runs a batch ahead): the limit stops the run after step 2, no
    thread is left running, and the run resumes to its end."""
    import threading

    ticking(monkeypatch)
    before = set(threading.enumerate())
    with pytest.raises(Preempted) as info:
        rl("grpo", tmp_path, tokenizer, steps=4, max_staleness=1, time_limit_s=LIMIT_S)
    assert info.value.step == 2 and info.value.exit_code == EXIT_TIME_LIMIT
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert checkpoint.saved_step(tmp_path / "checkpoint") == 2
    rl("grpo", tmp_path, tokenizer, steps=4, max_staleness=1, resume=True)
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3, 4]


# ----- the ranks' agreement, the note for requeue scripts, the exit under torchrun -------------------------------
class ManyRanks:
    """`world` ranks as seen by rank 0: the other ranks add `others` to the all_reduce."""

    def __init__(self, world: int, others: float) -> None:
        self.world, self.others, self.main, self.sharded, self.rank = world, others, True, False, 0

    def sum(self, value: float) -> float:
        return value + self.others

    def barrier(self) -> None:
        pass


@pytest.mark.parametrize("world", [2, 999, 1000, 5000])
def test_every_ranks_clock_is_no_signal_at_any_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    """A clock counts 1, a signal more than every clock together: with 1000 or more ranks all out of time the
    stop is still the time limit's (75; a fixed 1000 for a signal read it as SIGTERM), and one other rank's
    signal among them still wins (143)."""
    clock = Clock()
    monkeypatch.setattr(preemption, "time", types.SimpleNamespace(monotonic=clock))
    clocks = float(world - 1)  # every other rank's clock says stop
    for others, code in ((clocks, EXIT_TIME_LIMIT), (clocks - 1 + world + 1, EXIT_SIGTERM)):
        stop = Preemption(resumed=False, saved=lambda s: False, time_limit_s=5.0)
        stop.check(ManyRanks(world, 0.0), 0, tmp_path / "checkpoint", lambda: None)
        clock.now += 10
        with pytest.raises(Preempted) as info:
            stop.check(ManyRanks(world, others), 1, tmp_path / "checkpoint", lambda: None)
        assert info.value.exit_code == code


def test_a_stop_leaves_a_note_the_next_run_removes(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    stop = Preemption(resumed=False, saved=lambda s: False)
    stop.signum = signal.SIGUSR1
    with pytest.raises(Preempted):
        stop.check(None, 0, folder, lambda: None)
    note = json.loads((tmp_path / preemption.STOP_FILE).read_text())
    assert note == {"step": 0, "exit_code": 138, "signal": int(signal.SIGUSR1), "reason": ""}
    Preemption(resumed=True, saved=lambda s: False).check(None, 0, folder, lambda: None)
    assert not (tmp_path / preemption.STOP_FILE).exists()  # the next run went on: the note is stale


def test_under_torchrun_a_stopped_rank_ignores_the_launchers_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun SIGTERMs the ranks still running once one exits: a rank that stopped keeps its code."""
    before = {s: signal.getsignal(s) for s in preemption.SIGNALS}
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    try:
        with pytest.raises(Preempted), Preemption(resumed=False, saved=lambda s: False) as stop:
            stop.signum = signal.SIGTERM
            stop.check(None, 0, tmp_path / "checkpoint", lambda: None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN == signal.getsignal(signal.SIGUSR1)
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
        with Preemption(resumed=False, saved=lambda s: False):  # no stop: every handler restored
            pass
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    with Preemption(resumed=False, saved=lambda s: False), contextlib.suppress(Preempted):
        raise Preempted(0, tmp_path, None)
    assert {s: signal.getsignal(s) for s in preemption.SIGNALS} == before  # off torchrun: restored


def test_a_follower_leaves_with_the_stop_the_learners_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split layout's rollout rank: a signal before the learners' stop only sets the flag (it serves on);
    one after it raises their stop (time limit: 75), whatever the signal."""
    said: list[Preempted] = []
    monkeypatch.setattr(preemption, "announced", lambda: said[0] if said else None)
    stop = Preemption(resumed=False, saved=lambda s: False, follow=True)
    stop._handle(signal.SIGTERM, None)
    assert stop.signum == signal.SIGTERM
    said.append(Preempted(3, tmp_path, None, "30 s gone of 35 s"))
    with pytest.raises(Preempted) as info:
        stop._handle(signal.SIGTERM, None)
    assert info.value.exit_code == EXIT_TIME_LIMIT and info.value.step == 3
    assert preemption.exit_status(info.value) == EXIT_TIME_LIMIT  # off torchrun: the code, no exit


def test_a_step_with_an_evaluation_due_is_estimated_by_the_last_one(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval_every 5 (more than the estimate's window of 3 steps) with evaluations of 60 s: steps 6-8 forget
    step 5's 70 s cycle, yet step 10 evaluates again. Before step 10 (160 s gone) the estimate is 87.5 s, not
    12.5 s, so a 228 s limit stops after step 9 instead of running step 10 to 230 s."""
    from toolgym.trainers import grpo

    clock = ticking(monkeypatch)
    evaluate, calls = grpo.evaluate, []

    def slow(*args: Any, **kw: Any) -> dict[str, float]:
        calls.append(1)
        clock.now += 60 if len(calls) > 1 else 0  # (the step-0 evaluation is setup: before the first check)
        return evaluate(*args, **kw)

    monkeypatch.setattr(grpo, "evaluate", slow)
    with pytest.raises(Preempted) as info:
        rl("grpo", tmp_path, tokenizer, steps=11, eval_every=5, eval_episodes=1, time_limit_s=228)
    assert info.value.step == 9 and "160 s gone of 228 s; the next step would take ~88 s" in str(info.value)


def test_heavy_steps_are_the_evaluated_and_saved_ones() -> None:
    from toolgym.trainers.grpo import GRPOConfig

    heavy = preemption.heavy_steps(GRPOConfig(env_ids=["x"], steps=12, eval_every=5, save_every=4))
    assert [s for s in range(1, 13) if heavy(s)] == [4, 5, 8, 10, 12]
    assert not any(map(preemption.heavy_steps(types.SimpleNamespace()), range(1, 9)))


def test_ctrl_c_then_a_machines_sigterm_saves_and_says_sigint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's Ctrl-C, then the scheduler's SIGTERM (or torchrun forwarding it): no escalation, the save
    happens and the code is the first signal's (130)."""
    exits: list[int] = []
    monkeypatch.setattr(preemption.os, "_exit", exits.append)
    monkeypatch.setattr(preemption, "REPEAT_S", 0.0)
    saves: list[int] = []
    with Preemption(resumed=False, saved=lambda s: False) as stop:
        stop._handle(signal.SIGINT, None)
        stop._handle(signal.SIGTERM, None)
        stop._handle(signal.SIGUSR1, None)
        with pytest.raises(Preempted) as info:
            stop.check(None, 4, tmp_path / "checkpoint", lambda: saves.append(4))
    assert exits == [] and saves == [4] and info.value.exit_code == 130


def test_the_resume_hint_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(
        sys, "argv", ["toolgym", "train", "grpo", "--time-limit-s", "1:00", "--resume", "auto"]
    )
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert preemption.resume_command() == "torchrun ... -m toolgym train grpo --time-limit-s 1:00 --resume"
