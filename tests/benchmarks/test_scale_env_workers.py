"""benchmarks/scale.py env_workers (issue 32) and its GPU-machine staging (benchmarks/ray_stage.py,
benchmarks/ray_device.sh), without starting Ray: the md/json writer reads results of every version, the
settings are checked before any work, the device script's benchmark flags parse, and the parts that
ray_stage.py cuts are joined back byte for byte by the device script (its dry run: no pip install)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import processes
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
DEVICE = BENCH / "ray_device.sh"


def load(name: str) -> ModuleType:
    return load_script(BENCH / f"{name}.py", f"bench_{name}")


# the 2-core run of 2026-11-27, as committed (before sandbox, nodes, node_cpus, command, the load at the end)
ROW = {"env_id": "toolgym/Coding-v0", "threads": [11.3, 12.72, 19.9], "ray": [8.8, 7.4, 8.12],
       "threads_first_round_s": 3.8, "ray_first_round_s": 13.9, "threads_eps": 12.72, "ray_eps": 8.12,
       "speedup": 0.638}  # fmt: skip
OLD = {
    "envs": 8, "episodes": 32, "repeats": 3, "workloads": {"coding": ROW}, "cluster_start_s": 13.7,
    "total_s": 83.7, "machine": {"host": "vm", "cpus": 2, "load_1min_at_start": 8.469, "python": "3.11.7",
                                 "ray": "2.60.0"},
}  # fmt: skip


def test_an_old_result_still_makes_its_md_and_key(tmp_path: Path) -> None:
    scale = load("scale")
    (tmp_path / "scale.json").write_text(json.dumps({"other_key": 1}))
    scale.write_env_workers(OLD, results=tmp_path)
    md = (tmp_path / "scale_env_workers.md").read_text()
    assert "Command: `python benchmarks/scale.py env_workers --envs 8 --episodes 32 --repeats 3`" in md
    assert "`coding` on the docker sandbox" in md and "`ray start --num-cpus 1` each" in md
    assert "| coding | `toolgym/Coding-v0` | 12.7 | 8.1 | 0.64 |" in md
    assert "1-min load 8.47 at the start)" in md and "Reading: on this machine" in md
    data = json.loads((tmp_path / "scale.json").read_text())
    assert data["other_key"] == 1
    assert data["env_workers_speedup"]["coding"]["speedup"] == 0.638
    assert data["env_workers_speedup"]["sandbox"] == "docker"
    assert json.loads((tmp_path / "scale_env_workers.json").read_text()) == OLD  # rewritten unchanged


def test_a_new_result_records_the_sandbox_nodes_and_load(tmp_path: Path) -> None:
    scale = load("scale")
    new = OLD | {
        "sandbox": "process", "nodes": 2, "node_cpus": 6,
        "machine": {"host": "gpu", "cpus": 16, "cpus_usable": 16, "load_1min_at_start": 0.5,
                    "load_1min_at_end": 7.25, "python": "3.12.3", "ray": "2.60.0", "bwrap": "bubblewrap 0.8.0"},
    }  # fmt: skip
    cmd = "python benchmarks/scale.py env_workers --sandbox process --node-cpus 6"
    scale.write_env_workers(new, cmd, results=tmp_path)
    md = (tmp_path / "scale_env_workers.md").read_text()
    assert f"Command: `{cmd}`" in md
    assert "16 CPU cores (shared with other work: 1-min load 0.50 at the start, 7.25 at the end)" in md
    assert (
        "`coding` on the process sandbox (bubblewrap 0.8.0)" in md and "`ray start --num-cpus 6` each" in md
    )
    assert "Reading: on this machine" not in md  # the 2-core reading is not this host's
    saved = json.loads((tmp_path / "scale_env_workers.json").read_text())
    assert saved["command"] == cmd and saved["node_cpus"] == 6
    key = json.loads((tmp_path / "scale.json").read_text())["env_workers_speedup"]
    assert key["sandbox"] == "process" and key["ray_nodes"] == "2 x 6 CPU" and key["machine_cpus"] == 16


@pytest.mark.parametrize(
    "kw", [{"sandbox": "gvisor"}, {"node_cpus": 0}, {"nodes": 0}, {"workloads": ("coding", "browser")}]
)
def test_bad_settings_are_refused_before_ray_starts(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        load("scale").env_workers_speedup(envs=1, episodes=1, repeats=1, **kw)


def test_the_recorded_command_leaves_out_where_the_files_went() -> None:
    scale = load("scale")
    argv = ["env_workers", "--results", "/out/r", "--envs", "8", "--results=/x", "--sandbox", "process"]
    assert scale._without_results(argv) == ["env_workers", "--envs", "8", "--sandbox", "process"]


def device_bench_args() -> list[str]:
    """The benchmark flags ray_device.sh passes by default (its RAY_BENCH_ARGS)."""
    found = re.search(r"RAY_BENCH_ARGS=\$\{RAY_BENCH_ARGS:-(.*)\}", DEVICE.read_text())
    assert found, "no RAY_BENCH_ARGS default in ray_device.sh"
    return shlex.split(found.group(1))


def test_the_device_scripts_flags_parse() -> None:
    args = device_bench_args()
    assert "--sandbox" in args and args[args.index("--sandbox") + 1] == "process"  # no docker there
    request = [{"mode": "parse", "script": "benchmarks/scale.py",
                "argv": ["env_workers", *args, "--results", "/tmp/out/results"]}]  # fmt: skip
    done = processes.run(
        [sys.executable, str(REPO / "tests/benchmarks/parse_only.py")],
        120,
        input=json.dumps(request),
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)[0]["ok"], done.stdout


def test_stale_wheels_are_other_versions_and_unwanted_packages(tmp_path: Path) -> None:
    stage = load("ray_stage")
    for name in ("a-1.0-py3-none-any.whl", "a-2.0-py3-none-any.whl", "gymnasium-1.0-py3-none-any.whl",
                 "gymnasium-1.4-py3-none-any.whl", "c-1.0-py3-none-any.whl", "bm25s-0.3-py3-none-any.whl"):  # fmt: skip
        (tmp_path / name).write_bytes(b"x")
    got = {"a": {"wheel": str(tmp_path / "a-1.0-py3-none-any.whl")}, "c": {"wheel": ""}}
    assert sorted(p.name for p in stage.stale(tmp_path, got)) == [
        "a-2.0-py3-none-any.whl", "bm25s-0.3-py3-none-any.whl", "gymnasium-1.0-py3-none-any.whl"
    ]  # fmt: skip


def device(cwd: Path, steps: str, tmp: Path) -> Any:
    env = {**os.environ, "RAY_DEVICE_DRY": "1", "PARTS": str(tmp / "parts"), "WHEELS": str(tmp / "wheels"),
           "OUT": str(tmp / "out")}  # fmt: skip
    return processes.run(["bash", str(DEVICE), *steps.split()], 60, cwd=cwd, env=env)


def test_parts_cut_here_are_joined_there_byte_for_byte(tmp_path: Path) -> None:
    stage = load("ray_stage")
    src, bwrap, tree = tmp_path / "src", tmp_path / "bwrap", tmp_path / "tree"
    for d in (src, bwrap, tree):
        d.mkdir()
    sizes = {"big-1.0-cp312-cp312-manylinux2014_x86_64.whl": 2_500_000, "small-1.0-py3-none-any.whl": 40_000}
    for name, n in sizes.items():
        (src / name).write_bytes(os.urandom(n))
    for f in stage.BWRAP_FILES:
        (bwrap / f).write_bytes(b"ELF" + f.encode())
    folders = stage.split(src, tree, part_mb=3, bwrap=bwrap)  # 2 MiB of wheels a part: the big one in two
    assert [f.name for f in folders] == [".rayA", ".rayB"]
    assert all(stage.folder_bytes(f) <= 3 << 20 for f in folders)
    assert (tree / ".rayB" / "bwrap" / "bwrap").read_bytes() == b"ELFbwrap"

    # the first transfer carries .rayA only: install must say a part is missing, not install half a wheel
    hidden = tmp_path / "later"
    (tree / ".rayB").rename(hidden)
    first = device(tree, "take install", tmp_path)
    assert first.returncode == 1 and "missing or incomplete" in first.stderr + first.stdout
    (tree / ".rayA").rename(tmp_path / "gone")  # the next transfer's tree has .rayB instead
    hidden.rename(tree / ".rayB")
    second = device(tree, "take install", tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "dry run" in second.stdout
    for name in sizes:
        joined = (tmp_path / "wheels" / name).read_bytes()
        assert hashlib.sha256(joined).digest() == hashlib.sha256((src / name).read_bytes()).digest()
    assert (tmp_path / "parts" / "bwrap" / "libcap.so.2").is_file()


def test_pin_plan_gives_each_node_its_own_cores() -> None:
    scale = load("scale")
    trainer, nodes = scale.pin_plan(list(range(16)), 2, 6)
    assert trainer == [0, 1, 2, 3] and nodes == [[4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15]]
    with pytest.raises(ValueError, match="leave the trainer none"):
        scale.pin_plan([0, 1], 2, 1)
    assert scale._cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pinning_a_session_reaches_its_processes_and_their_children() -> None:
    scale = load("scale")
    core = min(os.sched_getaffinity(0))
    # a session leader with a child (a node's `ray start` and its raylet), both pinned after they started
    with processes.running(["bash", "-c", "sleep 30 & sleep 30"]) as leader:  # (a new session)
        for _ in range(50):
            pids = scale.session_pids(leader.pid)
            if len(pids) >= 2:
                break
            time.sleep(0.05)
        assert leader.pid in pids and len(pids) >= 2
        for pid in pids:
            scale.pin_process(pid, [core])
        assert all(os.sched_getaffinity(pid) == {core} for pid in scale.session_pids(leader.pid))
    scale.pin_process(2**22 + 12345, [core])  # a process gone meanwhile: no error


def test_the_md_says_where_pinning_did_not_hold(tmp_path: Path) -> None:
    scale = load("scale")
    pinned = OLD | {"nodes": 1, "node_cpus": 1, "pin": {"trainer": [0], "nodes": [[1]], "seen": [[0, 1]]}}
    scale.write_env_workers(pinned, results=tmp_path)
    md = (tmp_path / "scale_env_workers.md").read_text()
    assert "the trainer, its env threads and their sandboxes on cores 0; node 0 on cores 1" in md
    assert "(but the nodes' processes were seen on 0-1)" in md and "Reading: on this machine" not in md


def test_the_pinned_device_run_parses_too() -> None:
    request = [{"mode": "parse", "script": "benchmarks/scale.py",
                "argv": ["env_workers", *device_bench_args(), "--pin", "--results", "/tmp/out/results_pinned"]}]  # fmt: skip
    done = processes.run(
        [sys.executable, str(REPO / "tests/benchmarks/parse_only.py")],
        120,
        input=json.dumps(request),
        cwd=REPO,
    )
    assert done.returncode == 0 and json.loads(done.stdout)[0]["ok"], done.stdout + done.stderr[-2000:]
