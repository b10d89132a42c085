import subprocess
import sys

from toolgym.cli import main


def test_list(capsys):
    assert main(["list"]) == 0
    assert "toolgym/Calculator-v0" in capsys.readouterr().out


def test_check(capsys):
    assert main(["check", "toolgym/Calculator-v0", "--garbage", "20", "--expert-episodes", "5"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "Calculator" in out


def test_check_unknown_id(capsys):
    assert main(["check", "toolgym/Nope-v0"]) == 2
    assert "unknown env id" in capsys.readouterr().err


def test_play_in_terminal():
    script = ":expert\n" + "no idea\n" + ":quit\n"
    out = subprocess.run(
        [sys.executable, "-m", "toolgym", "play", "toolgym/Calculator-v0", "--seed", "3"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "calculator" in out.stdout and "Invalid action" in out.stdout


def test_play_solves_episode():
    import gymnasium as gym

    import toolgym  # noqa: F401

    env = gym.make("toolgym/Calculator-v0")
    env.reset(seed=3)
    first = env.unwrapped.expert_action()
    env.step(first)
    second = env.unwrapped.expert_action()
    out = subprocess.run(
        [sys.executable, "-m", "toolgym", "play", "toolgym/Calculator-v0", "--seed", "3"],
        input=f"{first}\n{second}\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Episode over: solved" in out.stdout
