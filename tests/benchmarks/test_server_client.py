"""benchmarks/server_client.py --quick: its stand-in server answers what ``ServerBackend`` checks, every client
row is measured, and the JSON carries the keys its results are quoted by. The timings' values are not checked
(shared machines are noisy), only that they were measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import processes

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server_client.py"
KEYS = (
    "client_cpu_ms_per_turn",
    "httpx_cpu_ms_per_turn",
    "openai_cpu_ms_per_turn",
    "learner_slowdown_ours",
    "learner_slowdown_httpx",
)


@pytest.mark.slow
def test_quick_run_writes_its_keys(tmp_path: Path) -> None:
    out = tmp_path / "server_client"
    done = processes.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert all(key in result for key in KEYS)
    assert result["turns"] == 32
    for key in KEYS:
        if key == "openai_cpu_ms_per_turn" and result[key] is None:
            assert "openai is not installed" in result["note"]
            continue
        assert result[key] > 0, key
    assert {row["key"] for row in result["rows"]} >= {"ours", "httpx"}
    for row in result["rows"]:
        assert row["wall_s"] > 0 and row["cpu_s"] > 0 and row["learner_beside_s"] > 0, row
    md = out.with_suffix(".md").read_text()
    assert "ServerBackend (urllib3)" in md and "--quick" in md
