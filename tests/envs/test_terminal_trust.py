"""Terminal-v0 against an adversarial policy: what the agent does in its container cannot set the reward.

One test per attack on the verifier: background writers and leftover processes, replaced interpreters and
test runners, pre-written rewards and tests, permission tricks, a fork bomb, a broken verifier. Each either
plays an unsolved built-in task (the attack must not turn its 0 into a 1) or a probe task whose verifier
scores 1 only when it finds no agent process, the system's own python3 and root's uid (the attack must not
make a solved episode fail or end in an env_error).
"""

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from tests.envs.terminal_probe import ID, SUBMIT, probe_env, shell
from toolgym.envs.terminal.container import TaskContainer, check_workdir
from toolgym.errors import ConfigError

pytestmark = pytest.mark.docker

PROBE_TEST = """#!/bin/bash
mkdir -p /logs/verifier
left=$(ps -eo uid=,stat=,args= | awk '($1 == ENVIRON["TOOLGYM_AGENT_UID"] || /innocent|sleep 1000|verifier.reward/) && $2 !~ /^Z/ && !/awk/')
echo "left: $left" > /logs/verifier/checks.log
echo "path: $PATH home: $HOME uid: $(id -u)" >> /logs/verifier/checks.log
if [ -z "$left" ] && [ "$(cat /app/done.txt)" = done ] && [ "$(python3 -c 'print(6 * 7)')" = 42 ] \\
    && [ "$(id -u)" = 0 ] && [ "$(bash -c 'echo ok')" = ok ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


@pytest.fixture(scope="module")
def builtin():
    e = gym.make(ID, command_timeout_s=5)
    yield e
    e.close()


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    e = probe_env(tmp_path_factory.mktemp("tasks"), PROBE_TEST, verifier_timeout_s=30.0, command_timeout_s=5)
    yield e
    e.close()


def play(env, commands, **reset):
    """Runs ``commands`` (each must not end the episode), submits; the outputs, the reward and the info."""
    env.reset(seed=0, **reset)
    outputs = []
    for command in commands:
        obs, _, term, trunc, info = env.step(shell(command))
        assert not (term or trunc), info
        outputs.append(obs[0]["content"])
    _, reward, term, trunc, info = env.step(SUBMIT)
    assert term and not trunc and info.get("truncation") != "env_error", info
    return outputs, reward, info


WRITER = "while :; do echo 1 > /logs/verifier/reward.txt; echo 1 > /tmp/r; sleep 0.01; done"


def test_agent_is_unprivileged_and_cannot_write_the_verifier_folders(builtin):
    outputs, reward, _ = play(
        builtin,
        [
            "id -u; echo $HOME; touch /app/mine && echo workdir-ok",
            "touch /logs/verifier/reward.txt",
            "touch /tests/test.sh",
            "touch /usr/bin/x",
            "mount -t tmpfs none /logs",
        ],
        options={"task": "count-errors"},
    )
    uid = outputs[0].split("\n")[0]
    assert int(uid) >= 200000 and outputs[0].startswith(f"{uid}\n/home/agent\nworkdir-ok")
    assert all("[exit code 0]" not in out for out in outputs[1:]), outputs
    assert reward == 0.0


def test_background_writers_cannot_set_the_reward(builtin):
    """Writers left in the background (nohup, setsid, ignoring signals) on an unsolved task: still 0."""
    _, reward, info = play(
        builtin,
        [
            f"nohup sh -c '{WRITER}' >/dev/null 2>&1 &",
            f"setsid sh -c '{WRITER}' >/dev/null 2>&1 < /dev/null &",
            f"(trap '' TERM HUP INT; {WRITER}) >/dev/null 2>&1 &",
            "sleep 1; cat /tmp/r",
        ],
        options={"task": "count-errors"},
    )
    assert reward == 0.0 and info["success"] is False


def test_leftover_processes_are_killed_before_the_verifier(probe):
    """Daemons, setsid'd sleepers and signal-ignoring loops are gone when the verifier looks (it scores 1
    only then), and they cannot make a solved episode fail."""
    _, reward, info = play(
        probe,
        [
            "echo done > /app/done.txt",
            f"setsid sh -c '{WRITER}' >/dev/null 2>&1 < /dev/null &",
            "(trap '' TERM HUP INT; exec -a innocent sleep 1000) >/dev/null 2>&1 &",
            "sh -c 'sh -c \"sleep 1000\" & exit' >/dev/null 2>&1",  # a double-forked daemon
            "ps -eo uid= | grep -c $(id -u)",
        ],
    )
    assert reward == 1.0, info["verifier_output"]
    assert (
        "path: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin home: /root uid: 0"
        in (info["verifier_output"])
    )


def test_replaced_interpreters_and_test_runners_do_not_reach_the_verifier(builtin, probe):
    fakes = [
        "cp /bin/true /usr/bin/python3",  # refused: root's
        "mkdir -p ~/.local/bin /app/fake && for d in ~/.local/bin /app/fake; do "
        "printf '#!/bin/sh\\necho 3.0\\n' > $d/python3; cp $d/python3 $d/bash; chmod +x $d/*; done",
        "site=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p $site && "
        "printf 'print(\"3.0\"); raise SystemExit(0)\\n' | tee $site/usercustomize.py > $site/sitecustomize.py",
        "echo 'export PATH=/app/fake:$PATH' >> ~/.bashrc; export PATH=/app/fake:$PATH; python3 stats.py 1 2 6",
    ]
    outputs, reward, _ = play(builtin, fakes, options={"task": "fix-mean"})
    assert "[exit code 0]" not in outputs[0] and "3.0" in outputs[-1]  # the agent's own python is fake
    assert reward == 0.0
    # a test runner of the agent's in the tests' folder, a conftest that passes everything, tests emptied
    runner = [
        "printf 'raise SystemExit(0)\\n' > /app/calc/pytest.py",
        "printf 'import pytest\\n@pytest.hookimpl(tryfirst=True)\\ndef pytest_sessionfinish(session):\\n"
        "    session.exitstatus = 0\\n' > /app/calc/conftest.py; echo > /app/calc/tests/test_calc.py",
    ]
    _, reward, info = play(builtin, runner, options={"task": "run-pytest"})
    assert reward == 0.0, info["verifier_output"]
    # the probe's verifier (root) still gets the system's python3 and bash though the agent planted fakes
    _, reward, info = play(probe, ["echo done > /app/done.txt", *fakes[1:3]])
    assert reward == 1.0, info["verifier_output"]


def test_pre_written_rewards_and_tests_are_ignored(builtin):
    _, reward, _ = play(
        builtin,
        [
            "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > "
            "/logs/verifier/reward.json; echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh",
            "echo 1 > /app/reward.txt; ln -s /app/reward.txt /logs/verifier/reward.txt",
            "mkdir -p /app/logs/verifier && echo 1 > /app/logs/verifier/reward.txt && cd /app/logs",
        ],
        options={"task": "count-errors"},
    )
    assert reward == 0.0


def test_permission_tricks_fail(builtin):
    outputs, reward, _ = play(
        builtin,
        [
            "chmod -R 777 /logs /tests /usr/bin /etc/passwd",
            "chown -R 1000 /logs",
            "cp /bin/bash /app/sh && chmod u+s /app/sh && /app/sh -p -c 'echo 1 > /logs/verifier/reward.txt'",
            "echo 'agent2:x:0:0::/root:/bin/bash' >> /etc/passwd",
            "chmod 000 /app",  # its own folder: the checks (as the agent's uid) fail, so 0, not an error
        ],
        options={"task": "count-errors"},
    )
    assert all("[exit code 0]" not in out for out in outputs[:4]), outputs
    assert reward == 0.0


def test_fork_bomb_does_not_stop_the_verifier(probe):
    """A fork bomb fills the container's process slots: the agent's commands fail or time out, never an
    env_error; the warden kills it with builtins and the verifier of the solved task scores 1."""
    _, reward, info = play(
        probe,
        [
            "echo done > /app/done.txt",
            "bash -c 'b() { b | b & }; b' >/dev/null 2>&1 &",
            "sleep 2; echo still here",
        ],
    )
    assert reward == 1.0, info["verifier_output"]


def test_a_verifier_the_agent_broke_scores_zero(tmp_path, probe, monkeypatch):
    """The agent breaks what the verifier needs (its folder's files; a verifier that then writes no
    reward), or an agent process could not be killed (the verifier does not run): 0, never an env_error."""
    task = tmp_path / "fragile"
    for sub in ("environment", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text("Keep /app/lib.sh.\n")
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n")
    (task / "environment" / "Dockerfile").write_text(
        "FROM toolgym-terminal:latest\nWORKDIR /app\nRUN echo 'echo 1' > /app/lib.sh\n"
    )
    (task / "tests" / "test.sh").write_text(
        "set -e\nr=$(bash /app/lib.sh)\necho $r > /logs/verifier/reward.txt\n"
    )
    env = gym.make(ID, tasks=str(task))
    try:
        _, reward, info = play(env, [])
        assert reward == 1.0, info["verifier_output"]
        _, reward, info = play(env, ["echo 'exit 3' > /app/lib.sh"])
        assert reward == 0.0 and "wrote no reward (exit 3)" in info["verifier_output"]
    finally:
        env.close()
    monkeypatch.setattr(TaskContainer, "kill_agent", lambda self: 2)  # two agent processes survived
    _, reward, info = play(probe, ["echo done > /app/done.txt"])
    assert reward == 0.0 and "could not be killed" in info["verifier_output"]


def test_a_system_working_folder_is_refused():
    for workdir in ("/", "/usr/src", "/root", "/etc", "/tests", "app", "/app/../usr"):
        with pytest.raises(ConfigError, match="working folder"):
            check_workdir(workdir)
    check_workdir("/app")
    check_workdir("/var/www")


def test_a_full_tmp_does_not_stop_the_verifier(probe):
    """The agent fills what it can fill without touching the host's disk (the size-capped /tmp): the
    verifier's folders are root's own tmpfs mounts, so the reward is still written."""
    outputs, reward, info = play(
        probe,
        [
            "echo done > /app/done.txt",
            "dd if=/dev/zero of=/tmp/fill bs=1M count=400 2>&1 | tail -1; df -h /tmp",
        ],
    )
    assert "No space left" in outputs[1] or "100%" in outputs[1], outputs[1]
    assert reward == 1.0, info["verifier_output"]


def test_the_agent_cannot_fill_the_hosts_disk(probe):
    """Every folder the agent can write is a size-capped tmpfs counted in the container's memory: nothing of
    the container's disk layer (the host's disk: the other episodes' containers and the trainer's checkpoints
    live there) is writable by it, and with its folders full the solved episode still scores 1."""
    from toolgym.envs.terminal.container import Resources

    outputs, reward, info = play(
        probe,
        [
            "echo done > /app/done.txt",
            "find / -xdev \\( -type f -o -type d \\) -writable ! -path '/proc/*' 2>/dev/null | "
            'while read -r p; do mountpoint -q "$p" || echo "$p"; done | head -5; echo end',
            "df --output=fstype /app /home/agent /var/tmp /run/lock /solution | sort | uniq -c",
            "for d in /app /home/agent; do dd if=/dev/zero of=$d/fill bs=1M count=600 status=none 2>/dev/null; done; "
            "du -smc /app/fill /home/agent/fill | tail -1",
        ],
    )
    assert outputs[1].strip().startswith("end"), outputs[1]  # (was /app, /home/agent, /var/tmp, /run/lock…)
    assert "5 tmpfs" in outputs[2], outputs[2]
    assert int(outputs[3].split()[0]) <= Resources().disk_mb * 2, outputs[3]
    assert reward == 1.0, info["verifier_output"]


def test_the_images_own_working_folder_fits_its_tmpfs():
    """The image's files copied into the working folder's tmpfs come on top of the agent's room (a task image
    with a big /app would otherwise fail every start: an env_error of every episode)."""
    from toolgym.envs.terminal.container import Resources, _kwargs

    res = Resources()
    small, big = _kwargs("img", res, "/app"), _kwargs("img", res, "/app", seed_bytes=700 << 20)
    assert f"size={res.disk_mb}m" in small["tmpfs"]["/app"]
    assert f"size={res.disk_mb + 700}m" in big["tmpfs"]["/app"]
    assert big["mem_limit"] != small["mem_limit"]


HIJACK = r"""import ctypes, os, time


def hijack(target):  # the checks' bash leaves its wait with exit_group(0): set -e sees no failure
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(16, target, None, None) != 0:  # PTRACE_ATTACH
        return
    os.waitpid(target, 0x40000000)
    regs = (ctypes.c_ulonglong * 27)()
    libc.ptrace(12, target, None, ctypes.byref(regs))  # GETREGS
    regs[15], regs[10], regs[14], regs[16] = 2**64 - 1, 231, 0, regs[16] - 2  # orig_rax, rax, rdi, rip
    libc.ptrace(13, target, None, ctypes.byref(regs))  # SETREGS
    libc.ptrace(17, target, None, None)  # DETACH


if os.environ.get("HOME") == "/nonexistent":  # run by the verifier's checks
    target = os.getppid()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(0.05)
            hijack(target)
        os._exit(0)
print("wrong")
"""


def test_a_program_the_checks_run_cannot_hijack_them(builtin):
    """The checks run the agent's program (fix-mean: python3 stats.py); it leaves a process that ptraces the
    checks' shell into exit(0) (was: reward 1 for an unsolved task, the checks and the program sharing a uid
    and the shell being dumpable). The checks now run with a real uid that is not the agent's (the effective
    uid stays the agent's): every process of theirs is non-dumpable and out of the agent's reach."""
    import base64
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the hijack's registers are x86_64's")
    blob = base64.b64encode(HIJACK.encode()).decode()
    outputs, reward, info = play(
        builtin,
        [f"echo {blob} | base64 -d > /app/stats.py; python3 /app/stats.py 1 2 6"],
        options={"task": "fix-mean"},
    )
    assert "wrong" in outputs[0]
    assert reward == 0.0, info["verifier_output"]
