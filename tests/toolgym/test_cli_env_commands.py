import sys

from tests import processes
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
    out = processes.run(
        [sys.executable, "-m", "toolgym", "play", "toolgym/Calculator-v0", "--seed", "3"],
        input=script,
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
    out = processes.run(
        [sys.executable, "-m", "toolgym", "play", "toolgym/Calculator-v0", "--seed", "3"],
        input=f"{first}\n{second}\n",
        timeout=60,
    )
    assert "Episode over: solved" in out.stdout


class _NeedsAbsentPackage(__import__("gymnasium").Env):
    """An env whose optional package is not installed: making it works, its reset says what to install."""

    def reset(self, *, seed=None, options=None):
        from toolgym.optional import require

        require("toolgym_absent_package", package="absent-package", extra="absent")
        raise AssertionError("unreachable")


def _register_absent():
    from gymnasium.envs.registration import register, registry

    if "tests/NeedsAbsent-v0" not in registry:
        register(id="tests/NeedsAbsent-v0", entry_point=_NeedsAbsentPackage, disable_env_checker=True)


def test_check_without_ids_skips_an_id_whose_package_is_missing(capsys, monkeypatch):
    import toolgym.envs

    _register_absent()
    monkeypatch.setattr(toolgym.envs, "ENVS", {"toolgym/Calculator-v0": "", "tests/NeedsAbsent-v0": ""})
    assert main(["check", "--garbage", "10", "--expert-episodes", "3"]) == 0
    out = capsys.readouterr()
    skipped = [line for line in out.err.splitlines() if "NeedsAbsent" in line]
    assert skipped == [
        "tests/NeedsAbsent-v0: skipped, absent-package is not installed: pip install 'toolgym[absent]'"
    ]
    assert "Calculator" in out.out and "FAIL" not in out.out and "1 id(s) skipped" in out.out


def test_check_of_a_named_id_with_a_missing_package_fails(capsys):
    _register_absent()
    assert main(["check", "tests/NeedsAbsent-v0", "--garbage", "5", "--expert-episodes", "1"]) == 1
    out = capsys.readouterr()
    assert "pip install 'toolgym[absent]'" in out.err
    assert "NOT INSTALLED" in out.out and "FAIL" not in out.out


def test_missing_package_is_gymnasiums_dependency_error():
    import gymnasium as gym
    import pytest

    _register_absent()
    env = gym.make("tests/NeedsAbsent-v0")
    with pytest.raises(gym.error.DependencyNotInstalled, match=r"toolgym\[absent\]"):
        env.reset(seed=0)


def test_every_id_command_says_did_you_mean(capsys):
    """check, info, eval, play and serve-env share one suggestion; none prints the list of every id."""
    for argv in (
        ["check", "toolgym/Calculater-v0"],
        ["info", "Calculator-v0"],
        ["eval", "toolgym/Calculater-v0", "--agent", "scripted"],
        ["play", "toolgym/calculator-v0"],
        ["serve-env", "toolgym/Calculater-v0"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "did you mean 'toolgym/Calculator-v0'" in err, (argv, err)
        assert len(err) < 400 and "toolgym/Search-v0" not in err, (argv, err)


def test_eval_fails_when_every_episode_is_an_infrastructure_failure(capsys, tmp_path):
    _register_absent()
    argv = ["eval", "tests/NeedsAbsent-v0", "--agent", "scripted", "--episodes", "2", "--quiet"]
    assert main([*argv, "--no-report", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "all 2 episodes failed for infrastructure reasons" in err
    assert "pip install 'toolgym[absent]'" in err


def test_stock_market_is_declared_wall_clock_and_its_determinism_check_skipped(capsys, monkeypatch):
    """MiniWoB's stock-market page moves with the wall clock: its card says so and the determinism check,
    which would replay a seed, does not run on it (it makes no env at all)."""
    import gymnasium as gym

    from toolgym.envs import checks
    from toolgym.envs.web.env import MiniWoB_click_button, MiniWoB_stock_market

    assert MiniWoB_stock_market.deterministic is False and MiniWoB_click_button.deterministic is True
    assert main(["info", "toolgym/MiniWoB-stock-market-v0", "--no-example"]) == 0
    assert "not deterministic per seed" in capsys.readouterr().out

    resets = []

    class _NoBrowser:
        unwrapped = MiniWoB_stock_market.__new__(MiniWoB_stock_market)

        def reset(self, **kw):
            resets.append(kw)

        def close(self):
            pass

    monkeypatch.setattr(gym, "make", lambda *a, **k: _NoBrowser())
    checks._determinism("toolgym/MiniWoB-stock-market-v0")
    assert resets == []


def test_server_limits_reach_the_servers(monkeypatch):
    """serve-env's --call-timeout / --max-body-mb and serve's --strict-model / --max-body-mb are the servers'."""
    import toolgym.agents
    import toolgym.agents.openai_server as openai_server
    import toolgym.serving.env_server as env_server

    seen: dict[str, dict] = {}

    class Stub:
        url = ws_url = "http://stub"

        def __init__(self, *args, **kwargs):
            seen[type(self).__name__] = kwargs

        def serve_forever(self):
            return None

    class EnvServer(Stub):
        pass

    class PolicyServer(Stub):
        pass

    class Policy:
        name = "openai"

    monkeypatch.setattr(env_server, "EnvServer", EnvServer)
    monkeypatch.setattr(openai_server, "PolicyServer", PolicyServer)
    monkeypatch.setattr(toolgym.agents, "make_policy", lambda spec, **kw: Policy())
    argv = ["serve-env", "toolgym/Calculator-v0", "--call-timeout", "0", "--max-body-mb", "2"]
    assert main(argv) == 0
    assert seen["EnvServer"]["call_timeout_s"] is None
    assert seen["EnvServer"]["limits"].max_body_bytes == 2 * 2**20
    argv = ["serve", "--agent", "openai:http://x/v1", "--strict-model", "--max-body-mb", "0.5"]
    assert main([*argv, "--max-tokens-limit", "4096"]) == 0
    kw = seen["PolicyServer"]
    assert kw["strict_model"] is True and kw["max_tokens_limit"] == 4096
    assert kw["limits"].max_body_bytes == 2**19
