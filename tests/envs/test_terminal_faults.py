"""Terminal-v0: out-of-memory kills and killed root processes, told apart by whose doing they are.

The agent's own memory hog reaches the container's limit and is killed there (its processes go first):
an observation, the episode goes on. A process killed by the host (an OOM kill while the container stayed
within its own limit), the warden killed, or the verifier killed before its time limit by something outside
the episode are faults of the machinery: ``env_error``, never the model's score. Nothing the agent's commands
do reads as one of those.
"""

import subprocess
import threading
import time

import pytest

import toolgym  # noqa: F401
from tests.envs.terminal_probe import SUBMIT, probe_env, shell
from toolgym.envs.terminal.container import MemoryEvents, host_oom_kills

pytestmark = pytest.mark.docker
SLOW_TEST = """#!/bin/bash
sleep 6
if [ "$(cat /app/done.txt)" = done ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
# a verifier whose last command is the agent's program (dropped to its uid): whatever it does, its own end
AGENT_LAST_TEST = """#!/bin/bash
set -e
cd /app
u=$TOOLGYM_AGENT_UID
python3 -c 'import os, sys; u = int(sys.argv[1]); os.setgroups([]); os.setresgid(u, u, u); os.setresuid(u, u, u); os.execvp("bash", ["bash", "/app/check.sh"])' "$u"
echo 1 > /logs/verifier/reward.txt
"""
HOG = "python3 -c 'x = bytearray(8 << 30); x[::4096] = b\"x\" * len(x[::4096])'; echo status $?"


def test_host_oom_is_told_from_the_containers_own():
    at = MemoryEvents
    assert host_oom_kills(at(0, 0), at(0, 1)) == 1  # killed while under its own limit: the host's
    assert host_oom_kills(at(3, 0), at(5, 2)) == 0  # the container reached its limit: the agent's hog
    assert host_oom_kills(at(0, 0), at(0, 0)) == 0
    assert host_oom_kills(at(-1, 0), at(-1, 1)) == 0  # cgroup v1: it reached its limit once, whose kill?
    assert host_oom_kills(None, at(0, 4)) == 0 and host_oom_kills(at(0, 0), None) == 0  # no cgroup to read


def _play(env, commands):
    outs = []
    for command in commands:
        obs, _, term, trunc, info = env.step(shell(command))
        assert not (term or trunc), info
        outs.append(obs[0]["content"])
    return outs


def test_the_agents_memory_hog_is_an_observation(tmp_path):
    env = probe_env(
        tmp_path, SLOW_TEST.replace("sleep 6\n", ""), verifier_timeout_s=10.0, command_timeout_s=60
    )
    try:
        env.reset(seed=0)
        box = env.unwrapped._box
        outs = _play(env, ["echo done > /app/done.txt", HOG, "echo alive"])
        assert "status 137" in outs[1] or "MemoryError" in outs[1], outs
        assert outs[2].startswith("alive"), outs
        assert box.memory is None or box.memory.oom_kills >= 1 or "MemoryError" in outs[1], box.memory
        _, reward, term, _, info = env.step(SUBMIT)
        assert term and reward == 1.0 and "infra_error" not in info, info
    finally:
        env.close()


def test_the_verifier_killed_from_outside_is_an_env_error(tmp_path):
    env = probe_env(tmp_path, SLOW_TEST, verifier_timeout_s=30.0, command_timeout_s=5)
    try:
        env.reset(seed=0)
        cid = env.unwrapped._box.container.id
        _play(env, ["echo done > /app/done.txt"])

        def kill() -> None:  # the host's OOM killer (or an operator) takes the verifier's shell
            time.sleep(2.5)
            subprocess.run(
                ["docker", "exec", cid, "pkill", "-KILL", "-f", "^/bin/bash /tests/test.sh"], check=False
            )

        threading.Thread(target=kill, daemon=True).start()
        t0 = time.monotonic()
        _, _, _, trunc, info = env.step(SUBMIT)
        assert trunc and info["truncation"] == "env_error", info
        assert "verifier was killed" in info["infra_error"] and time.monotonic() - t0 < 6, info
    finally:
        env.close()


def test_the_warden_killed_is_an_env_error(tmp_path):
    env = probe_env(tmp_path, SLOW_TEST, verifier_timeout_s=30.0, command_timeout_s=5)
    try:
        env.reset(seed=0)
        box = env.unwrapped._box
        _play(env, ["echo done > /app/done.txt"])
        subprocess.run(["docker", "exec", box.container.id, "kill", "-9", str(box.warden.pid)], check=True)
        _, _, _, trunc, info = env.step(shell("echo hi"))
        assert trunc and info["truncation"] == "env_error", info
    finally:
        env.close()


@pytest.mark.parametrize(
    "check", ["kill -9 $$", "exit 137", "kill -9 $PPID 2>/dev/null; exit 1", HOG + "; exit 137"]
)
def test_the_agent_cannot_make_the_verifier_an_env_error(tmp_path, check):
    """The verifier's last command is the agent's program: killing itself, exiting 137, hogging memory
    scores the episode (0 here), never an env_error."""
    env = probe_env(tmp_path, AGENT_LAST_TEST, verifier_timeout_s=60.0, command_timeout_s=5)
    try:
        env.reset(seed=0)
        _play(env, [f"printf '%s\\n' '{check}' > /app/check.sh"])
        _, reward, term, trunc, info = env.step(SUBMIT)
        assert term and not trunc and "infra_error" not in info and reward == 0.0, info
    finally:
        env.close()
