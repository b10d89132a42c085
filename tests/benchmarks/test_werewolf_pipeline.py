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
from typing import Any

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
        "lspo_1",
        "eval_lspo",
        "selfplay",
        "eval_selfplay",
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
    for stage in ("selfplay", "lspo"):  # paired game by game with SFT over the same deals
        assert result[f"gain_{stage}_vs_sft_games"] >= 2
        lo, hi = result[f"gain_{stage}_vs_sft_ci95"]
        assert -1.0 <= lo <= result[f"gain_{stage}_vs_sft"] <= hi <= 1.0
    call = json.loads((runs / "pipeline.json").read_text())["calls"][0]
    assert call["device"].startswith("CPU") and call["started"].startswith("20")
    text = Path(out + ".md").read_text()
    assert "minus sft" in text and " on CPU (" in text
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
    # sft's estimate (60 s, x1.25 before one was measured) does not fit in 30 s
    assert pipe.run() == EXIT_MORE
    call = json.loads((tmp_path / "runs" / "pipeline.json").read_text())["calls"][0]
    assert call["ran"] == [] and call["stopped"].startswith("sft: estimate 75 s")


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
        "sft",
        "eval_sft",
        "lspo_1",
        "lspo_2",
        "eval_lspo",
        "selfplay",
        "eval_selfplay",
    ]  # fmt: skip (the units that cannot stop midway first; self-play fills what is left)
    assert grpo.compile == "off" and grpo.selfplay["max_turns_per_seat"] == GPU.selfplay_max_turns
    assert grpo.time_limit_s is None and sft.time_limit_s is None  # (set per call, when the unit starts)
    pipe.time_limit = 321.0
    assert pipe.grpo_config().time_limit_s == pipe.sft_config().time_limit_s == 321.0
    job = (BENCH / "jobs" / "werewolf.txt").read_text()
    assert "benchmarks/werewolf.py --pipeline" in job and "benchmarks/jobs/werewolf.txt" in GPU_COMMANDS


def test_seed_interval_uses_the_t_quantile() -> None:
    assert t_half_width([0.4, 0.5, 0.6]) == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)
    assert t_half_width([0.4, 0.6]) == pytest.approx(12.706 * math.sqrt(0.02) / math.sqrt(2), rel=1e-3)
    assert math.isnan(t_half_width([0.5]))


def _fake(pipe: Pipeline, log: list[str], plan: dict[str, Any]) -> list[Unit]:
    """Stand-in units: A (an LSPO iteration), S (self-play: resumable, capped), E (eval of S); ``plan`` says what S does."""
    from toolgym.trainers.preemption import Preempted

    marks: set[str] = plan.setdefault("marks", set())

    def run(name: str) -> None:
        log.append(name)
        if name == "S":
            plan["limits"].append(pipe.time_limit)
            if plan["stop"]:  # the trainer's time limit: a checkpoint, then Preempted without a signal
                plan["steps"] = 3
                raise Preempted(3, pipe.runs, None, "limit")
        marks.add(name)

    def cap() -> bool:
        if not plan.get("steps"):
            return False
        marks.add("S")
        return True

    return [
        Unit("A", "lspo", lambda: "A" in marks, lambda: run("A")),
        Unit("S", "selfplay", lambda: "S" in marks, lambda: run("S"), ("A",), resumable=True, cap=cap),
        Unit("E", "eval", lambda: "E" in marks, lambda: run("E"), ("S",)),
    ]


def _profile(calls: int) -> Any:
    est = {"lspo": 5, "eval": 5, "selfplay_start": 2, "selfplay_step": 3}
    return dataclasses.replace(QUICK, name="test", model="unused", margin_s=2.0, calls=calls, estimates=est)


def test_a_resumable_unit_starts_when_one_step_fits_and_is_capped_on_the_last_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    log: list[str] = []
    plan: dict[str, Any] = {"stop": True, "limits": []}
    pipe = Pipeline(_profile(calls=1), tmp_path / "runs", 60, None, str(tmp_path / "res"), baseline=None)
    monkeypatch.setattr(pipe, "units", lambda: _fake(pipe, log, plan))
    # S's whole estimate (its start + grpo_steps steps) does not fit; its start and one step do; on the last
    # planned call its limit keeps E's estimate (5 s) and the margin, and its stop caps it: E still runs
    assert pipe.run() == 0
    assert log == ["A", "S", "E"]
    assert 60 - 2 - 5 - 3 < plan["limits"][0] <= 60 - 2 - 5
    state = json.loads((tmp_path / "runs" / "pipeline.json").read_text())
    assert state["units"]["S"]["capped"] and [r["stopped"] for r in state["calls"][0]["ran"]] == [
        None,
        "limit",
        None,
    ]


def test_before_the_last_call_a_resumable_unit_takes_the_rest_and_is_not_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    log: list[str] = []
    plan: dict[str, Any] = {"stop": True, "limits": []}
    pipe = Pipeline(_profile(calls=2), tmp_path / "runs", 60, None, str(tmp_path / "res"), baseline=None)
    monkeypatch.setattr(pipe, "units", lambda: _fake(pipe, log, plan))
    assert pipe.run() == EXIT_MORE
    assert log == ["A", "S"] and 60 - 2 - 3 < plan["limits"][0] <= 60 - 2  # no reserve before the last call
    # the second (last planned) call: too little time for a step once E is kept -> S is capped, E runs
    pipe2 = Pipeline(_profile(calls=2), tmp_path / "runs", 10, None, str(tmp_path / "res"), baseline=None)
    monkeypatch.setattr(pipe2, "units", lambda: _fake(pipe2, log, plan))
    plan["stop"] = False
    assert pipe2.run() == 0
    assert log == ["A", "S", "E"]
    state = json.loads((tmp_path / "runs" / "pipeline.json").read_text())
    assert state["units"]["S"]["capped"] and state["units"]["E"]["done"]


def test_a_unit_cut_for_time_is_not_restarted_in_a_call_it_cannot_finish(tmp_path: Path) -> None:
    pipe = Pipeline(_profile(calls=3), tmp_path / "runs", 60, None, str(tmp_path / "res"), baseline=None)
    unit = Unit("eval_sft", "eval", lambda: False, lambda: None)
    assert pipe.estimate(unit) == 5 * 1.25  # no eval measured in this run yet: the profile's, with headroom
    pipe.state["units"]["eval_sft"] = {"kind": "eval", "seconds_partial": 40.0}
    assert pipe.estimate(unit) == 60.0
    pipe.state["units"]["eval_x"] = {"kind": "eval", "done": True, "seconds": 3.0}
    pipe.state["units"]["eval_sft"] = {"kind": "eval"}
    assert pipe.estimate(unit) == 3.0  # measured: as measured
    sft = Unit("sft", "sft", lambda: False, lambda: None, checkpointed=True)  # continues from its checkpoint
    pipe.state["units"]["sft"] = {"kind": "sft", "seconds_partial": 400.0}
    assert pipe.estimate(sft) == 1.25 * QUICK.estimates["sft"]


def test_the_evaluation_plays_every_seed_in_one_batch(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    import werewolf

    from toolgym.trainers import rollout
    from toolgym.trainers.episodes import EVAL_SEED0

    runs: list[list[int]] = []

    class Stub:  # plays nothing: a deal with an even seed is a win
        def __init__(self, policy: Any, branch: Any, cfg: Any, kwargs: dict[str, Any]) -> None:
            assert cfg.temperature == 0.0 and kwargs["opponents"] == "strong"

        def run(self, tasks: list[Any], seed: int) -> tuple[list[Any], Any]:
            runs.append([t.seed for t in tasks])
            ep = lambda t: {"success": t.seed % 2 == 0, "turns": 3}  # noqa: E731
            trees = [
                SimpleNamespace(meta={"seed": t.seed}, leaves=lambda: [0], nodes=[SimpleNamespace(info={"episode": ep(t)})])
                for t in tasks
            ]  # fmt: skip
            return trees, rollout.RolloutStats(generated_tokens=30, generate_s=1.5)

        def close(self) -> None:
            pass

    monkeypatch.setattr(rollout, "TreeRollout", Stub)
    cache = tmp_path / "eval"
    got = werewolf.learned_win_rates("sft", str(tiny_folder), 3, 4, 5, 8, "cpu", cache=cache)
    base = EVAL_SEED0 + 7_000_000
    assert runs == [[base + s * 100_000 + i for s in range(3) for i in range(4)]]  # one batch, same deals
    for s in range(3):
        record = json.loads((cache / f"seed_{s}.json").read_text())
        assert (record["seed"], record["games"], record["games_back"], record["wins"]) == (s, 4, 4, 2)
        assert record["batch"]["seeds"] == [0, 1, 2] and record["setup"]["policy"] == "HFPolicy"
    assert got["win_rate_sft"] == 0.5 and got["win_rate_sft_per_seed"] == [0.5, 0.5, 0.5]
    (cache / "seed_1.json").unlink()  # a lost seed file: only that seed plays again
    werewolf.learned_win_rates("sft", str(tiny_folder), 3, 4, 5, 8, "cpu", cache=cache)
    assert runs[-1] == [base + 100_000 + i for i in range(4)]


def test_the_evaluation_on_our_engine_plays_the_games_hf_plays(tiny_folder: Path, tmp_path: Path) -> None:
    """engine="fast" (what "auto" takes on CUDA) runs the batched evaluation continuously on our engine; greedy,
    the tiny model's games come out as HF's (same deals, turns and wins)."""
    import werewolf

    got = {}
    for engine in ("fast", "hf"):
        cache = tmp_path / engine
        werewolf.learned_win_rates(
            "sft", str(tiny_folder), 2, 2, 5, 8, "cpu", max_turns=3, max_total_tokens=6000, cache=cache,
            engine=engine,
        )  # fmt: skip
        records = [json.loads((cache / f"seed_{s}.json").read_text()) for s in range(2)]
        assert records[0]["setup"]["policy"] == {"fast": "EnginePolicy", "hf": "HFPolicy"}[engine]
        got[engine] = [(r["wins"], r["turns"], r["invalid_turns"], r["games_back"]) for r in records]
    assert got["fast"] == got["hf"]
