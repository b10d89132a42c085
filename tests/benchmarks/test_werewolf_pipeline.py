"""The Werewolf pipeline (benchmarks/werewolf_pipeline.py) on CPU with a tiny random model: every stage end to
end (SFT -> win rate -> self-play GRPO -> win rate -> an LSPO iteration -> win rate), a second call that
continues where the first stopped, the time budget (a unit that does not fit is not started; the watchdog
stops one that overruns), the GPU profile's configs, and the results' intervals."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from werewolf import GPU_COMMANDS, t_half_width  # noqa: E402
from werewolf_pipeline import EXIT_MORE, GPU, QUICK, Pipeline, Unit  # noqa: E402


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.trainers.conftest import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 8192  # the byte-level test tokenizer makes ~3000-token prompts
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def mini(model: Path) -> object:
    """The smoke's sizes, smaller still (one game a seed, 100 CFR iterations)."""
    return dataclasses.replace(
        QUICK, name="test", model=str(model), max_total_tokens=6000, sft_episodes=2, lspo_cfr_iterations=100,
        lspo_latent_games=10, estimates={"sft": 1, "eval": 1, "selfplay": 1, "lspo": 1},
    )  # fmt: skip


@pytest.mark.slow
def test_every_stage_end_to_end_and_a_second_call_continues(tiny_folder: Path, tmp_path: Path) -> None:
    runs, summary, out = tmp_path / "runs", tmp_path / "summary", str(tmp_path / "res")
    first = Pipeline(mini(tiny_folder), runs, 600, summary, out, baseline=None)
    assert first.run(max_units=2) == EXIT_MORE  # a call cut after two units: work left
    state = json.loads((runs / "pipeline.json").read_text())
    assert state["units"]["sft"]["done"] and state["units"]["eval_sft"]["done"]
    assert not state["units"].get("selfplay", {}).get("done")
    assert sorted(p.name for p in (runs / "eval" / "sft").iterdir()) == ["seed_0.json", "seed_1.json"]
    sft_mtime = (runs / "sft" / "model" / "config.json").stat().st_mtime

    second = Pipeline(mini(tiny_folder), runs, 600, summary, out, baseline=None)
    assert second.run() == 0
    assert (runs / "sft" / "model" / "config.json").stat().st_mtime == sft_mtime  # SFT was not run again
    state = json.loads((runs / "pipeline.json").read_text())
    assert [r["unit"] for r in state["calls"][1]["ran"]] == [
        "selfplay",
        "eval_selfplay",
        "lspo_1",
        "eval_lspo",
    ]
    assert all(u["done"] for u in state["units"].values())
    assert json.loads((runs / "selfplay" / "done.json").read_text())["steps"] == 1
    assert (runs / "selfplay" / "checkpoint" / "model.pt").is_file()
    assert (runs / "lspo" / "iter_1" / "summary.json").is_file()

    result = json.loads(Path(out + ".json").read_text())
    for stage in ("sft", "selfplay", "lspo"):
        lo, hi = result[f"win_rate_{stage}_ci95"]
        assert 0.0 <= lo <= result[f"win_rate_{stage}"] <= hi <= 1.0
        assert len(result[f"win_rate_{stage}_per_seed"]) == 2
    text = Path(out + ".md").read_text()
    assert text.startswith("# Werewolf pipeline: CPU smoke") and "NOT a result" in text
    assert all(f"| {s} |" in text for s in ("sft", "selfplay", "lspo"))
    # the summary folder: every small file, no weights
    copied = {p.relative_to(summary).as_posix() for p in summary.rglob("*") if p.is_file()}
    assert {"pipeline.json", "runs/sft/summary.json", "runs/selfplay/metrics.jsonl"} <= copied
    assert "runs/lspo/iter_1/summary.json" in copied and "runs/eval/lspo/seed_1.json" in copied
    assert not [p for p in copied if p.endswith((".safetensors", ".pt", ".pkl"))]

    third = Pipeline(mini(tiny_folder), runs, 600, summary, out, baseline=None)
    assert third.run() == 0  # nothing left: a call that runs nothing
    assert json.loads((runs / "pipeline.json").read_text())["calls"][2]["ran"] == []


def test_a_unit_that_does_not_fit_is_not_started(tmp_path: Path) -> None:
    profile = dataclasses.replace(QUICK, name="test", model="unused", margin_s=1.0)
    pipe = Pipeline(profile, tmp_path / "runs", 30, None, str(tmp_path / "res"), baseline=None)
    assert pipe.run() == EXIT_MORE  # sft's estimate (60 s) does not fit in 30 s
    call = json.loads((tmp_path / "runs" / "pipeline.json").read_text())["calls"][0]
    assert call["ran"] == [] and call["stopped"].startswith("sft: estimate 60 s")


def test_the_watchdog_stops_a_unit_that_overruns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = dataclasses.replace(QUICK, name="test", model="unused", margin_s=1.0, estimates={"sft": 0})
    pipe = Pipeline(profile, tmp_path / "runs", 2.5, None, str(tmp_path / "res"), baseline=None)
    marks: list[str] = []

    def slow() -> None:
        time.sleep(30)
        marks.append("finished")  # never: the watchdog's SIGTERM stops the unit first

    monkeypatch.setattr(pipe, "units", lambda: [Unit("sft", "sft", lambda: bool(marks), slow)])
    t0 = time.monotonic()
    assert pipe.run() == EXIT_MORE
    assert time.monotonic() - t0 < 10 and not marks
    state = json.loads((tmp_path / "runs" / "pipeline.json").read_text())
    assert state["calls"][0]["ran"][0]["stopped"] == "time" and state["units"]["sft"]["failures"] == 0


def test_the_gpu_profile_builds_valid_configs(tmp_path: Path) -> None:
    from toolgym.trainers.checkpoint import resolve_resume

    pipe = Pipeline(GPU, tmp_path / "runs", 540, None, str(tmp_path / "res"))
    pipe.sft_model().mkdir(parents=True)  # (GRPOConfig checks that the snapshot folder exists)
    sft, grpo, lspo = pipe.sft_config(), pipe.grpo_config(), pipe.lspo_config(GPU.lspo_iterations)
    assert sft.episodes == 600 and sft.env_kwargs["opponents"] == "strong" and sft.model == "smollm2-135m"
    assert grpo.model == str(pipe.sft_model()) and grpo.save_every and grpo.resume == sft.resume == "auto"
    assert not resolve_resume(grpo).resume and not resolve_resume(sft).resume  # no checkpoint yet: fresh
    assert grpo.selfplay["snapshot"] == str(pipe.sft_model())  # a folder: the same opponent after a resume
    lspo.validate()
    assert lspo.model == str(pipe.sft_model()) and lspo.iterations == GPU.lspo_iterations
    assert [u.name for u in pipe.units()] == [
        "sft", "eval_sft", "selfplay", "eval_selfplay", "lspo_1", "lspo_2", "eval_lspo",
    ]  # fmt: skip
    job = (BENCH / "jobs" / "werewolf.txt").read_text()
    assert "benchmarks/werewolf.py --pipeline" in job and "benchmarks/jobs/werewolf.txt" in GPU_COMMANDS


def test_seed_interval_uses_the_t_quantile() -> None:
    assert t_half_width([0.4, 0.5, 0.6]) == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)
    assert t_half_width([0.4, 0.6]) == pytest.approx(12.706 * math.sqrt(0.02) / math.sqrt(2), rel=1e-3)
    assert math.isnan(t_half_width([0.5]))
