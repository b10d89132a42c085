"""Tests start processes through tests/processes.py: a timeout ends the whole process group, grandchildren
included (``subprocess.run(timeout=…)`` kills only the direct child; a grandchild keeps the pipes open)."""

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import processes

TESTS = Path(__file__).resolve().parents[1]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_run_passes_input_and_captures_text():
    out = processes.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], 30, input="hi")
    assert out.returncode == 0 and out.stdout == "HI\n" and out.stderr == ""


def test_a_timeout_kills_the_grandchildren(tmp_path):
    pidfile = tmp_path / "pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run(["bash", "-c", script], timeout=1)
    assert time.monotonic() - t0 < 20
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_no_test_calls_subprocess_run_with_a_timeout():
    """``subprocess.run/check_output/check_call(..., timeout=…)`` in a test: use ``processes.run``."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func)
                in ("subprocess.run", "subprocess.check_output", "subprocess.check_call")
                and any(k.arg == "timeout" for k in node.keywords)
            ):
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert not found, found
