"""benchmarks/async.py: the speed parts' warm start (run once into the work folder, reused by every arm and by a
later call), the report from results written before the warm start existed, and the CPU smoke of both speed
parts (tiny random model: it learns no tool call in a few CPU steps, so the smoke checks the plumbing, not
that the warm start searches; the GPU call's record shows that)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import processes
from tests.script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "async.py"


def bench() -> ModuleType:
    """The script as a module (`async` is a keyword: no plain import)."""
    return load_script(SCRIPT, "async_bench", register=True)


# The H200 call of 2026-11-27 (before the warm start): no warm_start, step_s_sd or success fields.
OLD_RUN = {
    "max_staleness": 0, "layout": "sync", "steps_timed": 12, "episodes": 1536.0, "seconds": 49.7,
    "samples_per_s": 30.89, "step_s": 4.14, "generate_s": 1.97, "env_s": 0.09, "staleness_mean": 0.0,
    "staleness_max": 0.0, "rollout_wait_s": 0.0, "weight_publish_s": 0.0, "is_masked_fraction": 0.0,
    "turns": 3.92, "tool_calls": 0.011,
}  # fmt: skip
OLD = {
    "commands": ["python benchmarks/async.py --part speed --out /root/jobs/async_speed"],
    "device": "NVIDIA H200 x1",
    "async_speedup_1gpu": 1.39,
    "speed_runs": {"k0": OLD_RUN, "k2": OLD_RUN | {"max_staleness": 2, "samples_per_s": 42.83}},
    "speed_setup": {"model": "smollm2-135m", "steps": 14, "warmup": 2},
}


def args_of(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(
        **({"sft_episodes": 512, "quick": False, "seed": 0, "wait_warm_start": 0.0} | kw)
    )


def base_of() -> dict[str, Any]:
    return {
        "env_ids": ["toolgym/Search-v0"], "env_kwargs": {"retriever_url": "http://x/retrieve", "max_turns": 4},
        "model": "smollm2-135m", "max_new_tokens": 128, "max_total_tokens": 2048,
    }  # fmt: skip


def test_report_and_merge_read_results_from_before_the_warm_start(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps(OLD))
    out = tmp_path / "async"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--merge", str(old), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    md = out.with_suffix(".md").read_text()
    assert "the untrained model (no warm start)" in md
    assert (
        "| 0 | sync | 30.89 | 4.14 | 1.97 | 0.09 | 0.00 | - | - | 0.01 | 3.92 | - |" in md
    )  # no sd, no success: "-"
    assert "async_speedup_1gpu = 1.39x" in md
    subprocess.run(
        [sys.executable, str(SCRIPT), "--report", "--out", str(out)], check=True, capture_output=True
    )
    assert out.with_suffix(".md").read_text() == md


def test_report_names_the_warm_start() -> None:
    mod = bench()
    warm = {
        "model": "/w/warm_start/model", "base_model": "smollm2-135m", "reused": False, "episodes": 512,
        "batch_size": 16, "lr": 5e-5, "conversations": 489, "steps": 31, "trained_tokens": 357000,
        "train_seconds": 71.0, "seconds": 83.0, "success": 0.41, "tool_calls": 1.97, "eval_episodes": 32,
    }  # fmt: skip
    run = OLD_RUN | {"step_s_sd": 0.12, "success": 0.38, "tool_calls": 2.05, "env_s": 0.61}
    data = OLD | {"speed_runs": {"k0": run}, "speed_setup": {"model": "smollm2-135m", "warm_start": warm}}
    lines = "\n".join(mod.policy_lines(data["speed_setup"]))
    assert "SFT of smollm2-135m on 512 Search-v0 expert episodes (489 kept, 31 steps of 16" in lines
    assert "success 0.41, 1.97 searches an episode" in lines
    assert "83 s with process start" in lines
    assert "reused" in "\n".join(mod.policy_lines({"warm_start": warm | {"reused": True}}))


def test_warm_start_is_skipped_when_the_work_folder_has_it(tmp_path: Path, monkeypatch: Any) -> None:
    mod = bench()
    folder = tmp_path / "warm_start"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text("{}")
    summary = {
        "conversations": 490,
        "steps": 31,
        "seconds": 70.0,
        "success_after": 0.5,
        "tool_calls_after": 2.0,
    }
    (folder / "summary.json").write_text(json.dumps(summary))

    def no_child(*a: Any, **kw: Any) -> None:
        raise AssertionError("the warm start ran again")

    monkeypatch.setattr(mod, "run_child", no_child)
    got = mod.warm_start(args_of(), base_of(), tmp_path)
    assert got["reused"] and got["model"] == str(folder / "model") and got["base_model"] == "smollm2-135m"
    assert (got["tool_calls"], got["success"], got["steps"]) == (2.0, 0.5, 31)
    assert mod.warm_start(args_of(sft_episodes=0), base_of(), tmp_path) is None  # the untrained model


def test_warm_start_trains_on_the_timed_env_once(tmp_path: Path, monkeypatch: Any) -> None:
    mod = bench()
    calls: list[tuple[dict[str, Any], str]] = []

    def fake_child(cfg: dict[str, Any], tiny: bool, gpus: str | None = None, algorithm: str = "grpo") -> list:
        calls.append((cfg, algorithm))
        out = Path(cfg["output_dir"])
        (out / "model").mkdir(parents=True)
        (out / "model" / "config.json").write_text("{}")
        (out / "summary.json").write_text(json.dumps({"steps": 31, "tool_calls_after": 1.5}))
        return []

    monkeypatch.setattr(mod, "run_child", fake_child)
    first = mod.warm_start(args_of(), base_of(), tmp_path)
    second = mod.warm_start(args_of(), base_of(), tmp_path)
    assert len(calls) == 1 and calls[0][1] == "sft"
    cfg = calls[0][0]
    assert (
        cfg["env_ids"] == ["toolgym/Search-v0"] and cfg["env_kwargs"]["retriever_url"] == "http://x/retrieve"
    )
    assert (cfg["episodes"], cfg["batch_size"], cfg["epochs"], cfg["model"]) == (512, 16, 1, "smollm2-135m")
    assert cfg["max_new_tokens"] == 128  # the arms' turn length in its evaluation
    assert not first["reused"] and second["reused"] and first["tool_calls"] == 1.5


@pytest.mark.slow
def test_quick_speed_then_speed2_reuse_one_warm_start(tmp_path: Path) -> None:
    """`--quick --part speed`, then `--quick --part speed2` with the same work folder: the second call
    trains no second warm start, and every arm's record and the report carry the tool numbers (the tiny
    model's are 0: it learns no search in 2 CPU steps)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    work, out = tmp_path / "work", tmp_path / "res" / "async"
    base = [sys.executable, str(SCRIPT), "--quick", "--work", str(work), "--out", str(out)]
    done = processes.run([*base, "--part", "speed"], 900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    warm = data["speed_setup"]["warm_start"]
    assert warm["model"] == str(work / "warm_start" / "model") and not warm["reused"]
    assert warm["steps"] == 2 and isinstance(warm["tool_calls"], float) and isinstance(warm["success"], float)
    assert data["speed_setup"]["model"] == "smollm2-135m"
    for run in data["speed_runs"].values():
        assert run["steps_timed"] == 2 and {"tool_calls", "env_s", "success", "step_s_sd"} <= set(run)
    assert json.loads((work / "speed_k0" / "config.json").read_text())["model"] == warm["model"]
    sft_model = (work / "warm_start" / "model" / "config.json").stat().st_mtime

    # (through the slow proxy: the env's searches reach the retriever through it)
    done = processes.run([*base, "--part", "speed2", "--tool-latency-s", "0.01"], 900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    setup = data["speed2_setup_lat0.01"]  # a variant (the added latency): its own keys beside the headline's
    assert setup["warm_start"]["reused"] and setup["tool_latency_s"] == 0.01
    assert (work / "warm_start" / "model" / "config.json").stat().st_mtime == sft_model
    assert (
        set(data["speed2_runs_lat0.01"]) == {"sync_1gpu", "split_2gpu"} and "speed_runs" in data
    )  # both kept
    assert "async_speedup_2gpu_lat0.01" in data and "async_speedup_2gpu" not in data
    md = out.with_suffix(".md").read_text()
    assert md.count("Policy: a warm start") == 2 and "searches / episode" in md
    assert md.count("Each search also waits 0.01 s") == 1  # speed2's only
    assert (
        "### Variant `lat0.01` (batch admission; 0.01 s added to each search; 16-row update micro-batches)"
        in md
    )

    # rollouts on a server: `toolgym serve --agent engine:WARM --weight-updates` in its own process, the
    # learner pushing its weights there by disk after every step
    done = processes.run([*base, "--part", "servers", "--servers-sync"], 900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert set(data["servers_runs"]) == {"sync_1gpu", "servers_k0", "servers_k2"}
    assert data["servers_setup"]["server_model"] == warm["model"] and data["async_speedup_2gpu_servers"] > 0
    assert data["servers_runs"]["servers_k2"]["weight_publish_s"] > 0  # (a disk push every step)
    assert "rollouts on a server (`async_speedup_2gpu_servers`)" in out.with_suffix(".md").read_text()


def test_slow_proxy_delays_each_search_and_passes_answers_and_refusals(tmp_path: Path) -> None:
    import http.server
    import threading
    import time
    import urllib.error
    import urllib.request

    class Upstream(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, data = (400, b'{"error": "no"}') if body.get("bad") else (200, json.dumps(body).encode())
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    proxy, url = bench().slow_proxy(f"http://127.0.0.1:{up.server_address[1]}/retrieve", 0.2)
    try:

        def post(payload: dict[str, Any]) -> tuple[int, bytes]:
            req = urllib.request.Request(url, data=json.dumps(payload).encode())
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()

        t0 = time.perf_counter()
        got: list[tuple[int, bytes]] = []
        threads = [threading.Thread(target=lambda: got.append(post({"queries": ["a"]}))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - t0
        assert got == [(200, b'{"queries": ["a"]}')] * 4
        assert 0.2 <= took < 0.7  # each waited, side by side (not 4 x 0.2 in a row)
        assert post({"bad": True}) == (400, b'{"error": "no"}')
    finally:
        proxy.shutdown()
        proxy.server_close()
        up.shutdown()
        up.server_close()


def test_child_gpus_go_through_the_job_lines_gpus() -> None:
    """gpu_jobs.sh gives each job line its GPUs: the script's "0" is that line's first, not the machine's."""
    mod = bench()
    assert mod.visible("0", None) == "0" and mod.visible("0,1", "") == "0,1"
    assert (
        mod.visible("0", "2") == "2" and mod.visible("0,1", "2,3") == "2,3" and mod.visible("1", "2,3") == "3"
    )
    with pytest.raises(SystemExit, match="needs GPUs 0,1"):
        mod.visible("0,1", "3")


def _run(mode: str, seed: int, success: list[float]) -> dict[str, Any]:
    return {
        "mode": mode, "max_staleness": 0 if mode == "sync" else 2, "seed": seed, "steps_done": 10,
        "minutes": [float(i) for i in range(len(success))], "steps": list(range(len(success))), "success": success,
    }  # fmt: skip


def test_learning_summary_over_seeds() -> None:
    mod = bench()
    runs = {
        "sync_s0": _run("sync", 0, [0.0, 0.2, 0.6, 0.7, 0.7]),
        "sync_s1": _run("sync", 1, [0.0, 0.1, 0.3, 0.6, 0.6]),
        "async_s0": _run("async", 0, [0.0, 0.6, 0.7, 0.7, 0.7]),
        "async_s1": _run("async", 1, [0.0, 0.0, 0.1, 0.2, 0.2]),
    }
    s = mod.learning_summary(runs)
    best = [max(mod.smoothed(r["success"])) for r in (runs["sync_s0"], runs["sync_s1"])]
    assert best == pytest.approx([0.7, 0.6])
    assert s["target_success"] == pytest.approx(0.65 - (0.005**0.5))  # mean minus the seeds' sd (0.0707)
    assert s["minutes_to_target_per_run"]["async_s1"] is None
    assert s["minutes_to_target"]["async"] is None and not s["async_faster"]  # a seed that never got there
    assert s["seeds"] == {"sync": [0, 1], "async": [0, 1]}
    del runs["async_s1"]
    assert mod.learning_summary(runs)["async_faster"]


def test_results_keyed_by_mode_alone_read_as_seed_zero() -> None:
    mod = bench()
    old = {"sync": _run("sync", 0, [0.1]) | {"mode": None}, "async": _run("async", 0, [0.2])}
    del old["sync"]["mode"]
    got = mod.learning_runs(old)
    assert set(got) == {"sync_s0", "async_s0"} and got["sync_s0"]["mode"] == "sync"


def test_learning_runs_of_two_envs_get_a_summary_each() -> None:
    mod = bench()
    runs = {
        "sync_s0": _run("sync", 0, [0.0, 0.5, 0.6]),
        "async_s0": _run("async", 0, [0.0, 0.6, 0.6]),
        "search_sync_s0": _run("sync", 0, [0.5, 0.55, 0.6]) | {"env": "search"},
        "search_async_s0": _run("async", 0, [0.5, 0.5, 0.5]) | {"env": "search"},
    }
    runs = {k: r | {"minutes_budget": 7.0, "micro_batch_rows": 16} for k, r in runs.items()}
    got = mod.summaries(runs)
    assert set(got) == {"async_learning_summary_7min", "async_learning_summary_search_7min"}
    assert got["async_learning_summary_7min"]["best_success"]["sync"] == pytest.approx(0.55)  # smoothed
    assert got["async_learning_summary_search_7min"]["best_success"]["async"] == pytest.approx(0.5)
    assert (
        mod.run_key("search", "async", 1) == "search_async_s1"
        and mod.run_key("calculator", "sync", 0) == "sync_s0"
    )
    assert set(mod.learning_runs(runs)) == set(runs)


def _set(run: dict[str, Any], minutes: float | None, rows: int | None) -> dict[str, Any]:
    return run | {"env": "calculator", "minutes_budget": minutes, "micro_batch_rows": rows}


def test_summaries_compare_only_runs_of_one_setting(tmp_path: Path) -> None:
    """7- and 15-minute runs and 64-row runs of the same seeds: a summary each, each with its own target
    from its own synchronous runs; the report has one subsection per setting, calculator first, then by minutes
    and rows."""
    mod = bench()
    runs = {
        "sync_s0": _set(_run("sync", 0, [0.0, 0.2, 0.3, 0.3]), 7.0, 16),
        "async_s0": _set(_run("async", 0, [0.0, 0.3, 0.3, 0.3]), 7.0, 16),
        "sync_s4": _set(_run("sync", 4, [0.0, 0.4, 0.8, 0.8]), 15.0, 16),
        "async_s4": _set(_run("async", 4, [0.0, 0.8, 0.8, 0.8]), 15.0, 16) | {"wall_minutes": 12.8},
        "sync_s0_mb64": _set(_run("sync", 0, [0.0, 0.6, 0.6, 0.6]), 12.0, 64),
        "async_s0_mb64": _set(_run("async", 0, [0.0, 0.1, 0.6, 0.6]), 12.0, 64),
        "search_sync_s0": _set(_run("sync", 0, [0.5, 0.5, 0.5]), 7.0, 16) | {"env": "search"},
        "search_async_s0": _set(_run("async", 0, [0.5, 0.5, 0.5]), 7.0, 16) | {"env": "search"},
    }
    assert set(mod.learning_runs(runs)) == set(runs)
    got = mod.summaries(runs)
    assert list(got) == [
        "async_learning_summary_7min", "async_learning_summary_12min_mb64", "async_learning_summary_15min",
        "async_learning_summary_search_7min",
    ]  # fmt: skip
    targets = {k: s["target_success"] for k, s in got.items()}
    assert targets["async_learning_summary_7min"] == pytest.approx(0.3 - 0.05)
    assert targets["async_learning_summary_15min"] == pytest.approx(0.8 - 0.05)
    assert targets["async_learning_summary_12min_mb64"] == pytest.approx(0.6 - 0.05)
    assert got["async_learning_summary_15min"]["minutes_to_target_per_run"] == {
        "sync_s4": 3.0,
        "async_s4": 2.0,
    }
    assert got["async_learning_summary_12min_mb64"]["seeds"] == {"sync": [0], "async": [0]}
    data = {"async_learning": runs} | got
    mod.write_md(data, tmp_path / "a.md")
    md = (tmp_path / "a.md").read_text()
    heads = [ln for ln in md.splitlines() if ln.startswith("### ")]
    assert heads == [
        "### calculator, 7 min a run, 16-row micro-batches", "### calculator, 12 min a run, 64-row micro-batches",
        "### calculator, 15 min a run, 16-row micro-batches", "### search, 7 min a run, 16-row micro-batches",
    ]  # fmt: skip
    sections = md.split("### ")[1:]
    assert [sec.count("Target: ") for sec in sections] == [1, 1, 1, 1]
    assert "Target: 0.75" in sections[2] and "- sync_s4 " in sections[2] and "- sync_s0 " not in sections[2]
    assert "- sync_s0_mb64 " in sections[1] and "- sync_s0 " not in sections[1]
    assert "its steps ended it at 12.8 of 15 min" in sections[2]  # (the YAML's 400 steps, before its minutes)
    mod.plot(data, tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("env", "minutes", "rows", "key"),
    [("calculator", 7.0, 16, "async_learning_summary_7min"), ("calculator", 15.0, 16, "async_learning_summary_15min"),
     ("calculator", 12.0, 64, "async_learning_summary_12min_mb64"),
     ("search", 7.0, 16, "async_learning_summary_search_7min"), ("search", 7.5, 8, "async_learning_summary_search_7.5min_mb8"),
     ("calculator", None, 16, "async_learning_summary_unknown_min")],
)  # fmt: skip
def test_summary_keys_name_the_setting(env: str, minutes: float | None, rows: int, key: str) -> None:
    assert bench().summary_key((env, minutes, rows)) == key


def test_run_keys_name_non_default_micro_batches() -> None:
    """A 64-row run of seed 0 sits beside the 16-row run of seed 0 (its own key, folder and ledger)."""
    mod = bench()
    assert mod.run_key("calculator", "sync", 0, 64) == "sync_s0_mb64"
    assert mod.run_key("search", "async", 1, 8) == "search_async_s1_mb8"
    assert mod.run_key("calculator", "sync", 0, 16) == mod.run_key("calculator", "sync", 0) == "sync_s0"
    runs = {"sync_s0": _set(_run("sync", 0, [0.1]), 7.0, 16), "x": _set(_run("sync", 0, [0.2]), 12.0, 64)}
    assert set(mod.learning_runs(runs)) == {"sync_s0", "sync_s0_mb64"}


def test_records_without_minutes_or_rows_are_read_not_lumped(tmp_path: Path) -> None:
    """Records from before minutes_budget and micro_batch_rows were recorded: no rows reads as 16, no minutes
    is a setting of its own ("? min"), beside the runs that have them."""
    mod = bench()
    runs = {
        "sync_s0": _run("sync", 0, [0.0, 0.5]) | {"env": "calculator"},
        "async_s0": _run("async", 0, [0.0, 0.5]) | {"env": "calculator"},
        "sync_s1": _set(_run("sync", 1, [0.0, 0.9]), 7.0, None),
        "async_s1": _set(_run("async", 1, [0.0, 0.9]), 7.0, 16),
    }
    got = mod.summaries(runs)
    assert list(got) == ["async_learning_summary_7min", "async_learning_summary_unknown_min"]
    assert got["async_learning_summary_7min"]["seeds"] == {"sync": [1], "async": [1]}
    mod.write_md({"async_learning": runs} | got, tmp_path / "a.md")
    md = (tmp_path / "a.md").read_text()
    assert "### calculator, ? min a run, 16-row micro-batches" in md and "wall minutes not recorded" in md


def test_the_results_file_has_a_setting_for_every_run() -> None:
    """benchmarks/results/async.json: every learning run records its minutes and rows (the 7-minute runs of
    seeds 0-3 were backfilled from their commands)."""
    data = json.loads((SCRIPT.parent / "results" / "async.json").read_text())
    for key, run in data["async_learning"].items():
        assert run.get("minutes_budget") and run.get("micro_batch_rows"), key


def test_a_learning_run_with_minutes_is_not_capped_by_the_yamls_steps(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """With a wall budget the minutes end the run (the YAML's 400 steps ended async runs early), and a later
    invocation builds the same config, so its ledger continues the run instead of starting it over."""
    pytest.importorskip("yaml")
    mod = bench()
    seen: list[tuple[dict[str, Any], Any]] = []

    def fake(config: dict[str, Any], tiny: bool, minutes: float | None = None, **kw: Any) -> list[Any]:
        seen.append((config, minutes))
        Path(config["output_dir"]).mkdir(parents=True, exist_ok=True)  # (as run_child makes it)
        ledger = kw["ledger"]
        ledger.minutes, ledger.invocations = ledger.minutes + 5.0, ledger.invocations + 1
        ledger.write()
        return []

    monkeypatch.setattr(mod, "run_child", fake)
    args = argparse.Namespace(
        learning_env="calculator", model=None, micro_batch_rows=64, quick=False, seed=0, mode="sync",
        learning_staleness=2, minutes=12.0, tool_latency_s=0.0,
    )  # fmt: skip
    first = mod.learning(args, tmp_path)["async_learning"]
    second = mod.learning(args, tmp_path)["async_learning"]
    assert set(first) == set(second) == {"sync_s0_mb64"}
    (cfg, minutes), (again, _) = seen
    assert cfg["steps"] == mod.LEARNING_STEPS and minutes == 12.0 and cfg == again
    assert cfg["micro_batch_rows"] == 64 and cfg["output_dir"] == str(tmp_path / "learning_sync_s0_mb64")
    assert second["sync_s0_mb64"]["wall_minutes"] == 10.0 and second["sync_s0_mb64"]["invocations"] == 2
    quick = mod.learning(argparse.Namespace(**vars(args) | {"quick": True}), tmp_path / "q")
    assert (
        seen[-1][0]["steps"] == 10
        and seen[-1][1] is None
        and set(quick["async_learning"]) == {"sync_s0_mb64"}
    )


@pytest.mark.slow
def test_quick_learning_run_stopped_part_way_continues_from_its_checkpoint(tmp_path: Path) -> None:
    """A learning run whose invocation gets SIGTERM (its whole group, as `timeout` at a device call's deadline)
    saves, writes what it has and exits 143; the same command continues it from the checkpoint (the earlier
    records kept, the steps and wall stamps going on), and once more starts no child."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import time

    work, out = tmp_path / "work", tmp_path / "res" / "async"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--part", "learning", "--mode", "sync", "--work", str(work),
           "--out", str(out), "--micro-batch-rows", "8"]  # fmt: skip
    # (8 rows, not the YAML's 16: the run's key, folder and ledger say so)
    log = work / "learning_sync_s0_mb8" / "metrics.jsonl"
    ledger = work / "learning_sync_s0_mb8.wall.json"
    proc = processes.start(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (log.is_file() and '"step": 1,' in log.read_text()):  # step 1 of 10 is done
            assert proc.poll() is None and time.monotonic() < deadline, "no step 1"
            time.sleep(0.1)
        processes.stop(proc, grace_s=60)  # SIGTERM to the group: the child finishes its step and saves
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        processes.stop(proc)
    assert proc.returncode == 143, err[-3000:]
    first = json.loads(out.with_suffix(".json").read_text())["async_learning"]["sync_s0_mb8"]
    assert not first["complete"] and first["invocations"] == 1 and first["micro_batch_rows"] == 8
    assert 1 <= first["steps_done"] < 10 and first["steps"] == [0]
    assert "Unfinished (sync_s0_mb8)" in out.with_suffix(".md").read_text()
    kept = log.read_text().splitlines()
    stamps = json.loads(ledger.read_text())["stamps"]
    assert (work / "learning_sync_s0_mb8" / "checkpoint").is_dir() and len(stamps) == len(kept)

    done = processes.run(cmd, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(out.with_suffix(".json").read_text())["async_learning"]["sync_s0_mb8"]
    assert run["complete"] and run["invocations"] == 2 and run["steps_done"] == 10
    lines = log.read_text().splitlines()
    assert lines[: len(kept)] == kept  # the first invocation's records, as they were (no step 0 again)
    assert [json.loads(ln)["step"] for ln in lines] == list(range(11))
    assert run["steps"] == [0, 3, 6, 9, 10] and run["minutes"][0] == first["minutes"][0]
    assert run["minutes"] == sorted(run["minutes"]) and run["wall_minutes"] > first["wall_minutes"]
    after = json.loads(ledger.read_text())
    assert all(after["stamps"][k] == v for k, v in stamps.items())  # earlier stamps kept
    assert min(v for k, v in after["stamps"].items() if k not in stamps) > first["wall_minutes"]
    assert "Runs over several invocations (sync_s0_mb8)" in out.with_suffix(".md").read_text()

    again = processes.run(cmd, 300)  # over: no child, the same records
    assert again.returncode == 0, again.stderr[-3000:]
    assert log.read_text().splitlines() == lines and json.loads(ledger.read_text())["invocations"] == 2
    assert json.loads(out.with_suffix(".json").read_text())["async_learning"]["sync_s0_mb8"] == run


def test_ledger_budget_and_a_changed_config_start_over(tmp_path: Path) -> None:
    mod = bench()
    cfg = {"output_dir": str(tmp_path / "run"), "steps": 5, "env_kwargs": {"retriever_url": "http://a:1"}}
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    path = tmp_path / "run.wall.json"
    book = mod.Ledger.open(path, cfg)  # no ledger: a fresh start (a folder of an earlier, other run)
    assert (
        not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    )
    book.minutes, book.invocations = 14.9, 1
    book.write()
    (tmp_path / "run" / "checkpoint").mkdir()
    other_port = cfg | {"env_kwargs": {"retriever_url": "http://a:2"}}  # the same run (the retriever's port)
    again = mod.Ledger.open(path, other_port)
    assert (again.minutes, again.invocations) == (14.9, 1) and (tmp_path / "run" / "checkpoint").is_dir()
    assert not again.done(15.0) and again.done(14.9) and not again.done(None)
    assert mod.Ledger.open(path, cfg | {"steps": 6}).minutes == 0.0  # another config: over
    assert not (tmp_path / "run" / "checkpoint").exists()


@pytest.mark.parametrize(
    ("admission", "latency", "rows", "tag"),
    [("batch", 0.0, None, ""), ("batch", 0.0, 16, ""), ("tree", 0.1, None, "_tree_lat0.1"),
     ("batch", 0.1, 64, "_lat0.1_mb64"), ("tree", 0.0, 256, "_tree_mb256")],
)  # fmt: skip
def test_a_speed_variants_keys_name_what_differs_from_the_headline(
    admission: str, latency: float, rows: int | None, tag: str
) -> None:
    """A run with other micro-batches merges beside the headline's keys instead of replacing them."""
    args = args_of(admission=admission, tool_latency_s=latency, micro_batch_rows=rows)
    assert bench().variant_tag(args) == tag
