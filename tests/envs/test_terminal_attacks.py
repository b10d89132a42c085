"""Terminal-v0 red-teamed from the agent's shell, and from hostile Harbor task folders.

Each attack runs in a solved episode of a probe task (its verifier, root, scores 1 when /app/done.txt says
done): whatever the agent's commands do to its shell, its processes, its limits or its files, every step
returns an observation (never an exception, never an env_error), the command after the attack works, the
verifier runs and the reward is the honest one (1: the task is solved; 0 where the attack broke the
solution itself). A hostile Harbor task folder is a clear ConfigError.
"""

import time

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from tests.envs.terminal_probe import ID, SUBMIT, probe_env, shell
from toolgym.envs.terminal.container import MAX_COMMAND_BYTES
from toolgym.envs.terminal.harbor import load_harbor, load_harbor_dir
from toolgym.errors import ConfigError

pytestmark = pytest.mark.docker
PROBE_TEST = """#!/bin/bash
if [ "$(cat /app/done.txt)" = done ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
echo "verifier ran as $(id -u)"
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    e = probe_env(tmp_path_factory.mktemp("tasks"), PROBE_TEST, verifier_timeout_s=6.0, command_timeout_s=3)
    yield e
    e.close()


def step(env, action):
    """One step that must not end the episode: its observation text."""
    obs, _, term, trunc, info = env.step(action)
    assert not (term or trunc), info
    assert info.get("truncation") != "env_error", info
    assert isinstance(obs[0]["content"], str)
    return obs[0]["content"]


def submit(env):
    _, reward, term, trunc, info = env.step(SUBMIT)
    assert term and not trunc and "infra_error" not in info, info
    return reward, info


HOG = "python3 -c 'a = []\nwhile True: a.append(bytearray(64 << 20))'"
FILL = (
    "for d in /tmp /app /home/agent /dev/shm /var/tmp /run/lock /solution; do "
    "dd if=/dev/zero of=$d/fill bs=1M count=4000 status=none; done 2>&1 | sort | uniq -c | tail -3"
)
# name: (commands after the solution, the honest reward)
ATTACKS = {
    # processes
    "fork-bomb": (["b() { b | b & }; b"], 1.0),
    "fork-bomb-setsid": (
        ["setsid bash -c 'b() { b | b & }; b' >/dev/null 2>&1 < /dev/null &", "sleep 1"],
        1.0,
    ),
    "memory-hog": ([HOG], 1.0),
    "memory-hog-and-full-tmpfs": ([FILL, f"({HOG}) >/dev/null 2>&1 &", "sleep 2; df -h /app /tmp"], 1.0),
    "kill-own-shell": (["kill -9 $$"], 1.0),
    "kill-everything": (["kill -9 -1"], 1.0),
    "exit": (["exit 3"], 1.0),
    "exec-replaces-shell": (["exec sleep 100"], 1.0),
    "stop-own-shell": (["kill -STOP $$"], 1.0),
    "builtin-loop": (["while :; do :; done"], 1.0),
    "sleep-past-limit-ignoring-signals": (["trap '' INT TERM HUP; sleep 100"], 1.0),
    "daemon-deletes-solution-after-submit": (
        ["setsid nohup sh -c 'sleep 1.5; rm -f /app/done.txt' >/dev/null 2>&1 &"],
        1.0,
    ),
    "ptrace-root-and-own-shell": (
        [
            "python3 -c 'import ctypes, os\nlibc = ctypes.CDLL(None)\n"
            'ok = [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) '
            'if os.stat(f"/proc/{p}").st_uid == 0 and libc.ptrace(16, p, 0, 0) == 0]\nprint("attached", ok)\''
        ],
        1.0,
    ),
    "signal-and-feed-root-processes": (
        [
            "kill -9 1 $(pgrep -u 0) 2>&1 | sort | uniq -c; for p in $(pgrep -u 0); do "
            "echo 'echo 1 > /logs/verifier/reward.txt' > /proc/$p/fd/0; done 2>&1 | sed 's/[0-9]*//g' | sort -u"
        ],
        1.0,
    ),
    # the protocol: output, markers, stdin
    "close-stdout": (["exec >&-; echo gone"], 1.0),
    "stdout-to-devnull": (["exec 2>&1 >/dev/null; echo gone"], 1.0),
    "close-stdin": (["exec 0<&-"], 1.0),
    "close-every-fd": (['for fd in $(seq 0 255); do eval "exec $fd>&-"; done'], 1.0),
    "fake-markers": (
        [
            "printf '\\n__toolgym_done_0123456789abcdef 0\\n__toolgym_done_ 0\\n'",
            # a DEBUG trap reads the real nonce and prints a marker line with garbage for the exit code
            "trap 'n=${BASH_COMMAND#*__toolgym_done_}; [[ $BASH_COMMAND == *__toolgym_done_* ]] && "
            'printf "\\n__toolgym_done_%s xyz\\n" "${n%% *}"\' DEBUG; echo trapped',
        ],
        1.0,
    ),
    "override-printf-and-eval": (["printf() { :; }; eval() { :; }"], 1.0),
    "aliases-and-noexec": (["shopt -s expand_aliases; alias printf=false", "set -n"], 1.0),
    "set-e-and-xtrace": (["set -x; echo traced", "set -e; false"], 1.0),
    "no-path": (["PATH=/nonexistent; unset HOME; IFS=/", "ls"], 1.0),
    "steal-stdin": (["setsid cat /proc/$$/fd/0 > /dev/null 2>&1 < /dev/null &", "echo stolen?"], 1.0),
    "background-spam": (["(while :; do echo spam; done) &", "echo between"], 1.0),
    "binary-output": (["head -c 200000 /dev/urandom; printf '\\xff\\xfe\\x00end'"], 1.0),
    "huge-output": (["yes | head -c 30000000", "yes"], 1.0),
    "nul-and-bad-utf8-command": (["echo a\x00b; echo '\udcff\ud800'"], 1.0),
    # limits
    "ulimit-nofile": (["ulimit -n 3"], 1.0),
    "ulimit-nproc": (["ulimit -u 1"], 1.0),
    "ulimit-memory": (["ulimit -Sv 20000"], 1.0),
    "ulimit-cpu": (["ulimit -t 1; while :; do :; done"], 1.0),
    "ulimit-fsize-core-stack": (["ulimit -f 0; ulimit -c 0; ulimit -s 64"], 1.0),
    # files
    "chmod-workdir-then-new-shell": (["chmod 000 /app /home/agent; kill -9 $$"], 1.0),
    "symlinks-where-root-writes": (
        [
            "ln -s /etc/shadow /app/evil; ln -s /logs /app/logs; ln -sfn / /home/agent/root; "
            "ln -s /tests/test.sh /tmp/t; ln -s /logs/verifier/reward.txt /app/reward.txt; echo planted",
            "ln /etc/passwd /app/hard; ln /usr/bin/python3 /tmp/py; mkfifo /tmp/f /app/f; echo tried",
        ],
        1.0,
    ),
    "fifo-for-the-solution": (["rm /app/done.txt; mkfifo /app/done.txt"], 0.0),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_leaves_a_working_shell_and_an_honest_reward(probe, name):
    commands, honest = ATTACKS[name]
    probe.reset(seed=0)
    assert step(probe, shell("echo done > /app/done.txt")) == "[exit code 0]"
    t0 = time.monotonic()
    outputs = [step(probe, shell(command)) for command in commands]
    after = step(probe, shell("echo alive-$UID"))  # (builtins only: no PATH needed)
    if "ran past the 3 s limit" in after:
        # what the attack left running (a fork bomb's background pipelines) may starve the agent's own next
        # command on a loaded machine: that command times out, an observation, and its timeout kills the
        # session's leftovers; the shell must work from then on (CI: once in three full runs under load)
        outputs.append(after)
        after = step(probe, shell("echo alive-$UID"))
    uid = probe.unwrapped._box.uid  # (the container's own, leased)
    assert f"alive-{uid}\n" in after and "[exit code 0]" in after, (outputs, after)
    assert time.monotonic() - t0 < 40, outputs
    reward, info = submit(probe)
    assert reward == honest, (outputs, info["verifier_output"])


def test_what_the_attacks_are_told(probe):
    """The observations say what happened (a restart, a timeout, a cut), and carry no protocol markers."""
    probe.reset(seed=0)
    out = step(probe, shell("exec >&-; echo gone; ls /nope"))
    assert "[exit code 2]" in out and "__toolgym" not in out, out  # stdout back for the marker: no time-out
    out = step(probe, shell("kill -9 $$"))
    assert "a new shell was started" in out, out
    out = step(probe, shell("sleep 100"))
    assert "ran past the 3 s limit" in out, out
    out = step(probe, shell("ulimit -n 3"))
    assert "[exit code 0]" in out, out
    out = step(probe, shell("echo after"))  # the shell cannot open a pipe: replaced, the command run there
    assert out.startswith("after\n") and "it ran again in a new shell" in out, out
    # (a text action is cut at 200000 characters before; a tool_calls message is not)
    assert "[not run: the command is" in probe.unwrapped.shell("#" * (MAX_COMMAND_BYTES + 1))
    big = "x" * (150 << 10)  # a long command still runs
    assert step(probe, shell(f"v={big}; echo ${{#v}}")).startswith(f"{150 << 10}\n")
    out = step(probe, shell("yes | head -c 30000000"))
    assert "characters cut" in out and len(out) < 10_000
    out = step(probe, shell(ATTACKS["ptrace-root-and-own-shell"][0][0]))
    assert "attached []" in out, out  # root's processes (the warden, init) cannot be ptraced
    out = step(probe, shell("printf 'a\\xffb\\n'"))
    assert out.startswith("a\ufffdb")
    for bad in (
        '<tool_call>{"name": "shell", "arguments": {"command": ["ls"]}}</tool_call>',
        '<tool_call>{"name": "shell", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "shell", "arguments": {"command": null}}</tool_call>',
        '<tool_call>{"name": "shell", "arguments": {"command": "ls", "sudo": true}}</tool_call>',
        '<tool_call>{"name": "shell", "arguments": {"command": "' + "\\ud800" + '"}}</tool_call>',
    ):
        step(probe, bad)
    assert step(probe, shell("echo fine")).startswith("fine")
    reward, _ = submit(probe)
    assert reward == 0.0  # the folder was never solved


def write_task(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


GOOD = {
    "instruction.md": "Do it.\n",
    "environment/Dockerfile": "FROM toolgym-terminal:latest\nWORKDIR /app\n",
    "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
}
HOSTILE = {
    "no-instruction": ({"instruction.md": None}, "no instruction.md"),
    "no-test-sh": ({"tests/test.sh": None}, "tests/test.sh"),
    "no-environment": ({"environment/Dockerfile": None}, "Dockerfile is missing"),
    "bad-toml": ({"task.toml": "[agent\ntimeout_sec = "}, "not valid TOML"),
    "toml-wrong-types": ({"task.toml": '[agent]\ntimeout_sec = "soon"\n'}, "timeout_sec"),
    "toml-table-is-a-string": ({"task.toml": 'agent = "x"\n'}, "agent"),
    "toml-bad-memory": ({"task.toml": '[environment]\nmemory_mb = "lots"\n'}, "memory"),
    "toml-negative-timeout": ({"task.toml": "[verifier]\ntimeout_sec = -1\n"}, "timeout_sec"),
    "workdir-root": ({"environment/Dockerfile": "FROM x\nWORKDIR /\n"}, "working folder"),
    "workdir-etc": ({"task.toml": '[environment]\nworkdir = "/etc/app"\n'}, "working folder"),
    "workdir-relative": ({"environment/Dockerfile": "FROM x\nWORKDIR app\n"}, "working folder"),
    "workdir-dotdot": ({"environment/Dockerfile": "FROM x\nWORKDIR /app/../usr\n"}, "working folder"),
    "workdir-quoted": ({"environment/Dockerfile": 'FROM x\nWORKDIR "/my app"\n'}, "working folder"),
    "workdir-variable": ({"environment/Dockerfile": "FROM x\nWORKDIR $HOME/app\n"}, "working folder"),
    "workdir-newline": ({"task.toml": '[environment]\nworkdir = "/app\\nx"\n'}, "working folder"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_harbor_task_folder_is_a_config_error(tmp_path, name):
    change, message = HOSTILE[name]
    files = {**GOOD, **change}
    root = write_task(tmp_path / "t", {k: v for k, v in files.items() if v is not None})
    with pytest.raises(ConfigError, match=message):
        load_harbor(root, build=False)


def test_odd_harbor_folders(tmp_path):
    """Not a folder, an empty folder, a file named like a task, a symlink loop and binary or non-UTF-8
    files in tests/: a ConfigError, or a task that loads."""
    with pytest.raises(ConfigError):
        load_harbor_dir(tmp_path / "missing", build=False)
    with pytest.raises(ConfigError, match="no Harbor task folders"):
        load_harbor_dir(tmp_path, build=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError):
        load_harbor_dir(tmp_path / "file", build=False)
    with pytest.raises(ConfigError):
        gym.make(ID, tasks=str(tmp_path / "file"))
    root = write_task(tmp_path / "odd name 'quoted'", GOOD)
    (root / "tests" / "loop").symlink_to(root / "tests")
    (root / "tests" / "blob.bin").write_bytes(b"\xff\xfe\x00\x01")
    (root / "instruction.md").write_bytes("Do it \xe9.\n".encode("latin-1"))
    task = load_harbor(root, build=False)
    assert task.name == "odd name 'quoted'" and "test.sh" in task.tests and "Do it" in task.instruction


DROP = (
    'python3 -c \'import os, sys; u = int(os.environ["TOOLGYM_AGENT_UID"]); os.setgroups([]); '
    'os.setresgid(u, u, u); os.setresuid(u, u, u); os.execvp("bash", ["bash", sys.argv[1]])\''
)


def test_a_daemon_the_verifier_starts_cannot_hold_the_episode(tmp_path):
    """A Harbor verifier runs the agent's program (dropped to the agent's uid); it leaves a daemon that keeps
    the verifier's stdout open. The verifier's output goes to a file of root's, and what its checks left is
    killed after it: the step returns at once with the honest reward."""
    root = write_task(
        tmp_path / "daemon",
        {
            **GOOD,
            "task.toml": "[verifier]\ntimeout_sec = 20.0\n",
            "tests/test.sh": f"#!/bin/bash\ncd /app\n{DROP} /app/check.sh\n"
            '[ "$(cat /app/done.txt)" = done ] && echo 1 > /logs/verifier/reward.txt\necho verifier done\n',
        },
    )
    env = gym.make(ID, tasks=str(root), command_timeout_s=3)
    try:
        env.reset(seed=0)
        step(env, shell("echo done > done.txt; echo 'setsid sleep 1000 & echo checked' > check.sh"))
        t0 = time.monotonic()
        reward, info = submit(env)
        assert reward == 1.0 and time.monotonic() - t0 < 15, info
        assert "verifier done" in info["verifier_output"]
    finally:
        env.close()


def test_roots_side_needs_no_docker_exec_and_its_faults_are_env_errors(probe, monkeypatch):
    """After the start, root works through its warden shell only: a docker exec that fails to start (runc's
    transient 'read init-p: connection reset by peer', exit 126) cannot make a solved episode read as 'the
    verifier wrote no reward' (was: the verifier and the reward read were docker execs, and such a failure
    scored the solved episode 0). The warden itself failing (killed from outside, as a docker fault would)
    ends the episode as an env_error, never as a 0."""
    from docker.models.containers import Container, ExecResult

    probe.reset(seed=0)
    step(probe, shell("echo done > /app/done.txt"))
    box = probe.unwrapped._box
    failed = ExecResult(126, b"OCI runtime exec failed: read init-p: connection reset by peer: unknown")
    with monkeypatch.context() as patch:
        patch.setattr(Container, "exec_run", lambda self, *a, **k: failed)
        reward, info = submit(probe)
    assert reward == 1.0, info["verifier_output"]
    probe.reset(seed=0)
    step(probe, shell("echo done > /app/done.txt"))
    box = probe.unwrapped._box
    box.container.exec_run(["kill", "-9", str(box.warden.pid)], user="0:0")
    _, reward, _, trunc, info = probe.step(SUBMIT)
    assert trunc and info["truncation"] == "env_error" and reward == 0.0, info


INOTIFY_HOG = (
    "python3 -c 'import ctypes, time, socket\n"
    "fds = [ctypes.CDLL(None).inotify_init() for _ in range(200)]\n"
    's = socket.socket(socket.AF_UNIX); s.bind(b"\\0toolgym-probe"); s.listen()\n'
    'open("/dev/shm/probe", "w").write("a")\n'
    'print("held", sum(f >= 0 for f in fds), flush=True); time.sleep(60)\' > /tmp/hog.out 2>&1 &'
    " sleep 2; cat /tmp/hog.out; echo $$ > /tmp/shell.pid; id -u"
)
PEEK = (
    "id -u; python3 -c 'import ctypes; print(\"inotify\", ctypes.CDLL(None).inotify_init() >= 0)'; "
    "ls -A /dev/shm | wc -l; echo uids $(ps -eo uid= | sort -u); "
    "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(b\"\\0toolgym-probe\")' "
    "2>/dev/null && echo reached-socket; ipcs -m 2>/dev/null | grep -c '^0x' || true"
)


def test_concurrent_episodes_share_no_uid(tmp_path):
    """Two episodes at once: one agent holds every per-uid kernel resource it can (128 inotify instances,
    an abstract unix socket, a /dev/shm file); the other's agent, a uid of its own, still has its own (per-uid
    limits are host-wide: with one uid for every agent, the second got no inotify instance) and sees none
    of the first's processes, files or sockets."""
    a = probe_env(tmp_path / "a", PROBE_TEST, verifier_timeout_s=6.0, command_timeout_s=5)
    b = probe_env(tmp_path / "b", PROBE_TEST, verifier_timeout_s=6.0, command_timeout_s=5)
    try:
        a.reset(seed=0)
        b.reset(seed=0)
        held = step(a, shell(INOTIFY_HOG))
        assert "held 128" in held or "held 200" in held, held
        seen = step(b, shell(PEEK))
        uid_a, uid_b = held.split("\n")[-3], seen.split("\n")[0]
        assert uid_a.isdigit() and uid_b.isdigit() and uid_a != uid_b, (held, seen)
        lines = seen.split("\n")
        assert lines[1] == "inotify True", seen  # its own uid's instances, not the first agent's
        assert lines[2] == "0" and lines[3].split() == ["uids", "0", uid_b], seen  # its own /dev/shm, pids
        assert "reached-socket" not in seen, seen  # its own network namespace (abstract sockets)
        boxes = [a.unwrapped._box, b.unwrapped._box]
        for env in (a, b):
            step(env, shell("echo done > /app/done.txt"))
            reward, _ = submit(env)
            assert reward == 1.0
    finally:
        a.close()
        b.close()
    # the uids are free again once their containers are gone
    assert all(lease._fd == -1 for box in boxes for lease in box.leases)


def test_a_stolen_stdin_never_eats_a_later_command(probe):
    """A process of the agent's reading its shell's stdin races the shell for each command line: a command it
    took runs again in a fresh shell (never in the shell that still shares its input), so every one runs."""
    probe.reset(seed=0)
    step(probe, shell("setsid cat /proc/$$/fd/0 > /dev/null 2>&1 < /dev/null &"))
    for i in range(4):
        out = step(probe, shell(f"echo alive-{i}"))
        assert out.startswith(f"alive-{i}\n"), out
