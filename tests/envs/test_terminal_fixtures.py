"""Terminal-v0 with Harbor task folders that carry bytes: binary test fixtures reach the verifier unchanged,
and a reference solution larger than a model's action (a big ``solve.sh`` and a binary file beside it) is
played by the scripted expert from the staged ``/solution``."""

import hashlib
import os
import subprocess

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from tests.envs.terminal_probe import ID
from toolgym.envs.terminal.harbor import load_harbor, write_harbor
from toolgym.parsing import MAX_ACTION_CHARS

pytestmark = pytest.mark.docker


def _binary_task(root):
    fixture = b"\x1f\x8b\x08\x00" + os.urandom(50_000) + b"\xff\xfe\x00\x80"  # not UTF-8 anywhere
    blob = os.urandom(30_000)
    task = root / "binary"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text("Put the blob in /app.\n")
    (task / "environment" / "Dockerfile").write_text("FROM toolgym-terminal:latest\nWORKDIR /app\n")
    (task / "tests" / "fixture.tar.gz").write_bytes(fixture)
    # programs without a .sh name stay runnable: a script, and an ELF program (the image's own `true`)
    (task / "tests" / "checker").write_text("#!/bin/sh\nexec /tests/bin/ok\n")
    (task / "tests" / "bin").mkdir()
    elf = subprocess.run(
        ["docker", "run", "--rm", "toolgym-terminal:latest", "cat", "/usr/bin/true"],
        capture_output=True,
        check=True,
    ).stdout
    (task / "tests" / "bin" / "ok").write_bytes(elf)
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        "/tests/checker && "
        f"[ \"$(sha256sum < /tests/fixture.tar.gz)\" = '{hashlib.sha256(fixture).hexdigest()}  -' ] && "
        f"[ \"$(sha256sum < /app/blob.bin)\" = '{hashlib.sha256(blob).hexdigest()}  -' ] && "
        '[ "$(stat -c %U /app/blob.bin)" = agent ] && echo 1 > /logs/verifier/reward.txt || '
        "echo 0 > /logs/verifier/reward.txt\n"
    )
    (task / "solution" / "blob.bin").write_bytes(blob)
    padding = "".join(f"# {i:08d} padding: a long solve.sh\n" for i in range(2 * MAX_ACTION_CHARS // 30))
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\nset -e\n{padding}cp /solution/blob.bin /app/blob.bin\n"
        "if touch /solution/mine 2>/dev/null; then echo writable; exit 1; fi\n"
    )
    assert (task / "solution" / "solve.sh").stat().st_size > MAX_ACTION_CHARS
    return task, fixture


def test_binary_fixtures_load_as_bytes_and_round_trip(tmp_path):
    folder, fixture = _binary_task(tmp_path)
    task = load_harbor(folder, build=False)
    assert task.tests["fixture.tar.gz"] == fixture and isinstance(task.tests["test.sh"], bytes)
    assert task.solution_files["blob.bin"] == (folder / "solution" / "blob.bin").read_bytes()
    assert all(len(c) < 1000 for c in task.solution)  # the expert's command runs the staged solve.sh
    again = load_harbor(write_harbor(task, tmp_path / "out"), build=False)
    assert again.tests == task.tests and again.solution_files == task.solution_files


def test_expert_plays_a_big_solution_and_the_verifier_gets_binary_fixtures(tmp_path):
    folder, _ = _binary_task(tmp_path)
    env = gym.make(ID, tasks=str(folder))
    try:
        env.reset(seed=0)
        inner = env.unwrapped
        # a model's episode never has the solution: it is staged only when the expert plays
        out = inner._box.run("ls -A /solution | wc -l", 10)
        assert out.output.strip() == "0", out
        reward, term, info = 0.0, False, {}
        for _ in range(4):
            action = inner.expert_action()
            assert len(action) < MAX_ACTION_CHARS
            _, reward, term, trunc, info = env.step(action)
            assert info.get("truncation") != "env_error", info
            if term or trunc:
                break
        assert term and reward == 1.0, info["verifier_output"]
    finally:
        env.close()


def test_text_tasks_still_work(tmp_path):
    env = gym.make(ID, categories=["text"])
    try:
        env.reset(seed=0, options={"task": "fix-mean"})
        inner = env.unwrapped
        reward, term = 0.0, False
        while not term:
            _, reward, term, trunc, info = env.step(inner.expert_action())
            assert not trunc, info
        assert reward == 1.0
    finally:
        env.close()
