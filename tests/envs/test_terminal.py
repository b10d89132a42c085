"""Terminal-v0: a real shell in a real container, Harbor task folders both ways, the verifier's contract."""

import json

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.envs.terminal.harbor import load_harbor, load_harbor_dir, write_harbor
from toolgym.envs.terminal.image import KNOWN_BASES
from toolgym.envs.terminal.tasks import BY_NAME, CATEGORIES, TASKS
from toolgym.errors import ConfigError

pytestmark = pytest.mark.docker
ID = "toolgym/Terminal-v0"


def shell(command):
    return "<tool_call>" + json.dumps({"name": "shell", "arguments": {"command": command}}) + "</tool_call>"


SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def env():
    e = gym.make(ID, command_timeout_s=3)
    yield e
    e.close()


@pytest.fixture(scope="module")
def expert_env():
    e = gym.make(ID)
    yield e
    e.close()


def play_expert(env, **reset):
    env.reset(seed=0, **reset)
    inner = env.unwrapped
    for _ in range(inner.max_turns):
        _, reward, term, trunc, info = env.step(inner.expert_action())
        if term or trunc:
            return reward, info
    raise AssertionError("the expert did not finish")


def test_builtin_tasks_cover_the_categories():
    assert len(TASKS) >= 20
    assert set(CATEGORIES) == {"files", "text", "git", "build", "packaging"}
    assert len(BY_NAME) == len(TASKS)


@pytest.mark.parametrize(
    "name", ["sort-by-extension", "top-ips", "revert-bad-commit", "fix-makefile", "console-script"]
)
def test_expert_solves(expert_env, name):
    reward, info = play_expert(expert_env, options={"task": name})
    assert reward == 1.0 and info["success"], info["verifier_output"]


def test_shell_state_exit_codes_and_limits(env):
    obs, info = env.reset(seed=1, options={"task": "count-errors"})
    assert info["tools"][0]["function"]["name"] == "shell" and info["task_name"] == "count-errors"
    assert "Call submit" in obs[1]["content"]
    out = env.step(shell("cd /tmp && export X=7; pwd"))[0][0]["content"]
    assert out == "/tmp\n\n[exit code 0]"
    assert env.step(shell("echo $X; ls /nope"))[0][0]["content"].endswith("[exit code 2]")
    assert "7" in env.step(shell("echo $X"))[0][0]["content"]
    # an unterminated quote is a bash error, not a hung protocol
    assert "[exit code 2]" in env.step(shell('echo "open'))[0][0]["content"]
    killed = env.step(shell("sleep 60"))[0][0]["content"]
    assert "killed: the command ran past the 3 s limit" in killed
    assert env.step(shell("pwd"))[0][0]["content"].startswith("/tmp")  # the shell survived the kill
    stuck = env.step(shell("while :; do :; done"))[0][0]["content"]
    assert "a new shell was started" in stuck
    assert env.step(shell("pwd"))[0][0]["content"].startswith("/app")
    assert "a new shell was started" in env.step(shell("exit 4"))[0][0]["content"]
    long = env.step(shell("seq 1 100000"))[0][0]["content"]
    assert "characters cut" in long and long.startswith("1\n2\n") and "100000" in long
    _, reward, term, _, info = env.step(SUBMIT)
    assert term and reward == 0.0 and info["success"] is False


def test_planted_reward_is_ignored_and_no_network(env):
    env.reset(seed=0, options={"task": "count-errors"})
    env.step(shell("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt; echo 1 > /tests/test.sh"))
    net = env.step(shell("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\""))
    assert "[exit code 1]" in net[0][0]["content"]
    _, reward, term, _, _info = env.step(SUBMIT)
    assert term and reward == 0.0


def test_invalid_action_is_feedback(env):
    env.reset(seed=0)
    _, reward, term, trunc, info = env.step("let me think")
    assert info["invalid_action"] and reward == -0.1 and not (term or trunc)
    _, reward, term, trunc, info = env.step(shell("ls") + SUBMIT)
    assert info["parse_error"] == "mixed"


def test_dead_container_is_env_error(env):
    env.reset(seed=0, options={"task": "count-errors"})
    env.unwrapped._box.container.remove(force=True)
    _, reward, term, trunc, info = env.step(shell("ls"))
    assert trunc and not term and info["truncation"] == "env_error" and reward == 0.0


def test_harbor_round_trip(tmp_path):
    """A built-in task written as a Harbor folder, read back, built from its Dockerfile and solved."""
    folder = write_harbor(BY_NAME["merge-feature"], tmp_path)
    assert {p.name for p in folder.iterdir()} == {
        "instruction.md",
        "task.toml",
        "environment",
        "tests",
        "solution",
    }
    assert (folder / "environment" / "Dockerfile").read_text().startswith("FROM toolgym-terminal:latest")
    task = load_harbor(folder)
    assert task.image.startswith("toolgym-terminal-task:") and task.base_substituted is None
    assert task.instruction == BY_NAME["merge-feature"].instruction and "test.sh" in task.tests
    env = gym.make(ID, tasks=str(tmp_path))
    try:
        reward, info = play_expert(env)
        assert reward == 1.0, info["verifier_output"]
    finally:
        env.close()


def test_registry_base_runs_on_ours_or_is_refused(tmp_path):
    task = tmp_path / "hello"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Write hello to /app/out.txt.\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n[environment]\nmemory = "1G"\nworkdir = "/app"\n'
    )
    (task / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nRUN echo ready > /app/ready\n"
    )
    (task / "tests" / "test.sh").write_text(
        "mkdir -p /logs/verifier\ngrep -qx hello /app/out.txt && echo 1 > /logs/verifier/reward.txt "
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\ncat /app/ready\ncp /solution/out.txt /app/out.txt\n"
    )
    (task / "solution" / "out.txt").write_text("hello\n")  # solve.sh finds its folder at /solution
    loaded = load_harbor_dir(tmp_path)[0]
    assert loaded.base_substituted == "ubuntu:24.04" and loaded.resources.memory_mb == 1024
    env = gym.make(ID, tasks=str(task))
    try:
        reward, _info = play_expert(env)
        assert reward == 1.0
        assert "ready" in env.unwrapped.transcript[3]["content"]
    finally:
        env.close()
    (task / "environment" / "Dockerfile").write_text("FROM registry.example.com/private/img:3\n")
    with pytest.raises(ConfigError, match="no registry can be reached"):
        load_harbor(task)
    assert KNOWN_BASES.match("python:3.12-slim") and not KNOWN_BASES.match("node:20")


def test_bad_arguments():
    with pytest.raises(ConfigError, match="categories"):
        gym.make(ID, categories=["cooking"])
    with pytest.raises(ConfigError, match="Harbor"):
        gym.make(ID, tasks="/nonexistent/folder")


def test_verifier_without_a_reward_scores_zero(tmp_path):
    """A verifier that runs out of time (say, on a program the agent left hanging) is the episode's failure
    (reward 0), not an env_error a policy could hide behind."""
    task = tmp_path / "hang"
    for sub in ("environment", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 2.0\n")
    (task / "environment" / "Dockerfile").write_text("FROM toolgym-terminal:latest\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text("sleep 30\necho 1 > /logs/verifier/reward.txt\n")
    env = gym.make(ID, tasks=str(task))
    try:
        env.reset(seed=0)
        _, reward, term, trunc, info = env.step(SUBMIT)
        assert term and not trunc and reward == 0.0 and info["success"] is False
        assert "killed at the time limit" in info["verifier_output"]
    finally:
        env.close()
