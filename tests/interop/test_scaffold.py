"""``toolgym new``: the scaffolded package builds and installs with pip, its own tests (toolgym's env checks)
pass, and ``import toolgym`` registers its id through the entry point (``toolgym list`` shows its origin).

pip installs it with ``--target`` into the test's folder and the subprocesses see it through PYTHONPATH:
the shared site-packages is never touched (other tests running meanwhile would see a stray plugin), and
removing the folder uninstalls it."""

import os
import sys

import pytest

from tests import processes
from toolgym.cli import main
from toolgym.errors import ConfigError
from toolgym.scaffold import FILES, names, scaffold

NAME = "letter-count"
ENV_ID = "letter_count/LetterCount-v0"


def _run(args, cwd, site, timeout=300):
    path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return processes.run(args, cwd=cwd, env=env, timeout=timeout)


def test_scaffold_installs_and_its_tests_pass(tmp_path):
    pkg, site = tmp_path / "pkg", tmp_path / "site"
    assert main(["new", NAME, "--dir", str(pkg)]) == 0
    for target in FILES.values():
        assert (pkg / target.format(module="letter_count")).is_file(), target
    assert '[project.entry-points."toolgym.envs"]' in (pkg / "pyproject.toml").read_text()
    readme = (pkg / "README.md").read_text()
    assert f"## Card: `{ENV_ID}`" in readme and "[tool count_letter]" in readme and "{{" not in readme
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    pip += ["--no-deps", "--no-build-isolation", "--no-index", "--target", str(site), str(pkg)]
    out = processes.run(pip, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (site / "letter_count-0.1.0.dist-info" / "entry_points.txt").is_file()

    # its tests run against the installed copy (not the source folder, which is not on the path)
    tests = site / "_tests"
    tests.mkdir()
    (tests / "test_env.py").write_text((pkg / "tests" / "test_env.py").read_text())
    out = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)], tests, site)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "3 passed" in out.stdout

    out = _run([sys.executable, "-m", "toolgym", "list"], tmp_path, site)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith(ENV_ID))
    assert "letter-count" in row and "count_letter" in row
    out = _run([sys.executable, "-m", "toolgym", "info", ENV_ID], tmp_path, site)
    assert out.returncode == 0, out.stderr
    assert "(letter_count; from letter-count)" in out.stdout and "count_letter:" in out.stdout


def test_names_and_bad_input(tmp_path):
    assert names("my_env") == {
        "name": "my_env",
        "dist": "my_env",
        "module": "my_env",
        "cls": "MyEnvEnv",
        "id": "my_env/MyEnv-v0",
    }
    with pytest.raises(ConfigError, match="NAME must start with a letter"):
        scaffold("1bad", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ConfigError, match="not an empty folder"):
        scaffold(NAME, tmp_path / "full")
    assert main(["new", NAME, "--dir", str(tmp_path / "full")]) == 2  # the CLI reports the ConfigError


def test_scaffold_is_lint_clean(tmp_path):
    pytest.importorskip("ruff")
    pkg = scaffold(NAME, tmp_path / "pkg")
    rules = ["--isolated", "--line-length", "110"]
    check = [sys.executable, "-m", "ruff", "check", *rules, "--select", "E,F,W,I,B,UP,SIM", str(pkg)]
    out = processes.run(check, cwd=pkg, timeout=120)
    assert out.returncode == 0, out.stdout
    fmt = [sys.executable, "-m", "ruff", "format", "--check", *rules, str(pkg)]
    out = processes.run(fmt, cwd=pkg, timeout=120)
    assert out.returncode == 0, out.stdout
