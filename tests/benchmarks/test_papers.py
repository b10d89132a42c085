"""The papers benchmark (benchmarks/papers/): every claim builds valid SFT and trainer configs, claims that
share a run folder agree on what they share, the driver packs runs into GPUs by memory, and the report
reads tool calls and collapse events off run folders (synthetic metrics; the CPU smoke of the whole
pipeline is `python benchmarks/papers/run.py run --claims all --quick --device cpu --runs /tmp/p`)."""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from papers import curves, report, run  # noqa: E402
from papers.claims import CLAIMS  # noqa: E402

from toolgym.trainers.grpo_config import GRPOConfig  # noqa: E402
from toolgym.trainers.ppo_config import PPOConfig  # noqa: E402
from toolgym.trainers.sft import SFTConfig  # noqa: E402

ISSUE_CLAIMS = {
    "gigpo_household", "branching_chain", "branching_search", "igpo_search", "replay_web", "tir_stability",
    "epo_household",
}  # fmt: skip


def test_every_claim_of_the_issue_is_there() -> None:
    assert set(CLAIMS) >= ISSUE_CLAIMS


@pytest.mark.parametrize("name", sorted(CLAIMS))
@pytest.mark.parametrize("quick", [False, True])
def test_a_claim_builds_valid_configs(name: str, quick: bool, tmp_path: Path) -> None:
    claim = CLAIMS[name]
    arms = [a.name for a in claim.arms]
    assert len(set(arms)) == len(arms) and claim.baseline in arms
    assert claim.paper and claim.departures and claim.level_note
    sft = run.sft_config(claim, tmp_path, "smollm2-135m", "cpu", quick)
    sft.pop("algorithm", None)
    SFTConfig.from_dict(sft)
    for arm in claim.arms:
        data: dict[str, Any] = dict(run.run_config(claim, arm.name, 1, tmp_path, "cpu", 0.1, quick))
        algorithm = data.pop("algorithm", "grpo")
        data.pop("init")
        (PPOConfig if algorithm == "ppo" else GRPOConfig).from_dict(data)


def test_claims_sharing_a_folder_share_its_warm_start_setting_and_arms() -> None:
    for claim in CLAIMS.values():
        if not claim.folder:
            continue
        host = CLAIMS[claim.folder]
        assert (claim.env_id, claim.env_kwargs, claim.eval_env_kwargs) == (
            host.env_id,
            host.env_kwargs,
            host.eval_env_kwargs,
        )
        assert claim.sft == host.sft and claim.rl == host.rl
        host_arms = {a.name: a.overrides for a in host.arms}
        for arm in claim.arms:
            if arm.name in host_arms:  # one run serves both claims: it must be the same run
                assert arm.overrides == host_arms[arm.name], (claim.name, arm.name)


def test_shared_arms_run_once_and_the_least_advanced_go_first(tmp_path: Path) -> None:
    claims = [CLAIMS["gigpo_household"], CLAIMS["epo_household"]]
    jobs = run.jobs_of(claims, 2, tmp_path, quick=False)
    names = [j.name for j in jobs]
    assert len(names) == len(set(names)) == 2 * 4  # grpo, gigpo, ppo, epo x 2 seeds
    d = tmp_path / "gigpo_household" / "epo_s2"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text(json.dumps({"step": 7}) + "\n")
    assert run.jobs_of(claims, 2, tmp_path, quick=False)[-1].name == "gigpo_household/epo_s2"


def test_doctests_of_the_driver_and_curves() -> None:
    for mod in (run, curves):
        assert doctest.testmod(mod).failed == 0


def test_missing_needs_are_named() -> None:
    assert run.missing(()) == []
    assert all(":" in m for m in run.missing(("bm25s", "bwrap", "chromium")))


def _write_run(folder: Path, calls: float, grad: list[float], success: list[float]) -> None:
    folder.mkdir(parents=True)
    recs = [{"step": 0, "eval/success": 0.2, "eval/tool_calls": 3.0}]
    for i, (g, s) in enumerate(zip(grad, success, strict=True), start=1):
        rec = {"step": i, "rollout/generated_tokens": 100.0, "rollout/episodes": 8.0, "charts/tool_calls": calls,
               "charts/success": s, "losses/grad_norm": g, "losses/entropy": 1.0}  # fmt: skip
        if i % 5 == 0:
            rec |= {"eval/success": 0.2 + 0.02 * i, "eval/tool_calls": calls}
        recs.append(rec)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_report_reads_tool_calls_and_collapse_events(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "out"
    flat = [1.0] * 10
    for seed in (1, 2):
        _write_run(runs / "branching_search" / f"grpo_s{seed}", 3.0 + seed * 0.1, flat, [0.5] * 10)
        _write_run(runs / "branching_search" / f"arpo_s{seed}", 1.5, flat, [0.5] * 10)
        spiky = [1.0] * 7 + [40.0, 1.0, 1.0]
        _write_run(runs / "tir_stability" / f"grpo_s{seed}", 2.0, spiky, [0.6] * 5 + [0.1] * 5)
        _write_run(runs / "tir_stability" / f"llds_s{seed}", 2.0, flat, [0.6] * 10)
    sys.argv = ["report.py", "--runs", str(runs), "--out", str(out)]
    report.main()
    data = json.loads((out / "papers.json").read_text())
    search = data["branching_search"]
    assert search["tool_calls"]["arpo"]["1"]["train_calls_to_t"] == pytest.approx(1.5 * 8 * 10)
    assert search["tool_calls_gain"]["arpo"]["train_calls_to_t_ratio"] == pytest.approx(1.5 / 3.15, abs=1e-3)
    assert search["gains"]["arpo"]["seeds"] == 2 and "gain_ci95" in search["gains"]["arpo"]
    assert "igpo_search" in data  # shares the folder: its grpo baseline is branching_search's
    tir = data["tir_stability"]
    assert tir["collapse"]["grpo"]["1"]["grad_spikes"] == [8]
    assert tir["collapse"]["grpo"]["1"]["success_collapse_step"] == 9
    assert tir["collapse"]["llds"]["1"]["grad_spikes"] == []
    md = (out / "papers.md").read_text()
    assert "Tool calls" in md and "Collapse events" in md and (out / "papers_tir_stability.png").is_file()


def test_the_driver_packs_runs_by_memory_and_starts_a_folder_after_its_warm_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fake GPUs and processes: warm starts first, then every run of both household claims once (the shared
    grpo once), never more memory on a card than it has."""
    import subprocess

    started: list[tuple[str, int | None]] = []

    def fake_launch(cmd: list[str], log: Path, gpu: int | None = None) -> subprocess.Popen[bytes]:
        cfg = Path(cmd[cmd.index("--config") + 1])
        if cmd[3] == "sft":
            (cfg.parent / "sft").mkdir(parents=True, exist_ok=True)
            (cfg.parent / "sft" / "summary.json").write_text(json.dumps({"success_after": 0.3}))
        started.append((cfg.stem, gpu))
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])

    monkeypatch.setattr(run, "launch", fake_launch)
    monkeypatch.setattr(run, "gpu_memory_gb", lambda device: [40.0, 40.0])
    monkeypatch.setattr(run, "missing", lambda needs: [])
    args = ["run", "--claims", "gigpo_household", "epo_household", "--seeds", "1", "--runs", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["run.py", *args, "--seconds", "60"])
    run.main()
    names = [n for n, _ in started]
    assert names[0] == "sft" and sorted(names[1:]) == ["epo_s1", "gigpo_s1", "grpo_s1", "ppo_s1"]
    assert all(g in (0, 1) for _, g in started)
    summary = json.loads((tmp_path / "gigpo_household" / "summary.json").read_text())
    assert summary["calls"][-1]["not_started"] == [] and set(summary["rl_rc"]) == {
        "grpo_s1",
        "gigpo_s1",
        "ppo_s1",
        "epo_s1",
    }


def test_igpo_gold_is_the_first_alias_not_the_lists_repr() -> None:
    """Search-v0's task.answer is a list of aliases: IGPO teacher-forces the first, not "['a', 'b']"."""
    from types import SimpleNamespace

    from toolgym.trainers.rollout import _gold

    assert _gold(SimpleNamespace(task=SimpleNamespace(answer=["5 May 1849", "May 5, 1849"]))) == "5 May 1849"
    assert _gold(SimpleNamespace(task=SimpleNamespace(answer=42))) == "42"
    assert _gold(SimpleNamespace(task=SimpleNamespace(answer=[]))) is None


@pytest.mark.parametrize(
    "group",
    [
        ("gigpo_household", "epo_household"),
        ("branching_search", "igpo_search"),
        ("branching_chain", "tir_stability"),
    ],
)
def test_each_plan_group_fits_four_h100s_at_once(
    group: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PLAN.md's sessions: every run of a group starts at once on 4 x H100 (90% of 79.1 GiB a card) by the
    claims' memory estimates, none left waiting."""
    import subprocess

    for name in group:
        sft = tmp_path / CLAIMS[name].dir / "sft"
        sft.mkdir(parents=True, exist_ok=True)
        (sft / "summary.json").write_text(json.dumps({"success_after": 0.3}))

    def fake_launch(cmd: list[str], log: Path, gpu: int | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

    monkeypatch.setattr(run, "launch", fake_launch)
    monkeypatch.setattr(run, "gpu_memory_gb", lambda device: [0.9 * 79.1] * 4)
    monkeypatch.setattr(run, "missing", lambda needs: [])
    args = ["run", "--claims", *group, "--seeds", "3", "--runs", str(tmp_path), "--seconds", "8"]
    monkeypatch.setattr(sys, "argv", ["run.py", *args])
    run.main()
    call = json.loads((tmp_path / CLAIMS[group[0]].dir / "summary.json").read_text())["calls"][-1]
    assert call["not_started"] == []


def test_a_later_session_runs_the_seeds_after_the_first(tmp_path: Path) -> None:
    """`--first-seed 3 --seeds 1`: the third seed of every arm alone (a machine too small for the whole group
    ran seeds 1-2); run folders keep their seed, so report.py reads the three together."""
    claims = [CLAIMS["gigpo_household"], CLAIMS["epo_household"]]
    jobs = run.jobs_of(claims, 1, tmp_path, quick=False, first_seed=3)
    assert {j.name for j in jobs} == {f"gigpo_household/{a}_s3" for a in ("grpo", "gigpo", "ppo", "epo")}
