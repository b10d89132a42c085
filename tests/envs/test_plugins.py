"""Third-party env packages plug in through the ``toolgym.envs`` entry point group (a real dist-info on the
path, read by importlib.metadata in a fresh interpreter)."""

import os
import sys
import textwrap

from tests import processes


def _plugin(tmp_path, name, entry, module_src):
    dist = tmp_path / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[toolgym.envs]\n{name} = {entry}\n")
    (tmp_path / f"{name.replace('-', '_')}.py").write_text(textwrap.dedent(module_src))


def _run(tmp_path, code):
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    return processes.run([sys.executable, "-W", "always", "-c", code], env=env, timeout=120)


def test_plugin_envs_register_and_list_with_origin(tmp_path):
    _plugin(
        tmp_path,
        "good-plugin",
        "good_plugin",
        """
        ENVS = {"goodplug/Calc-v0": "toolgym.envs.calculator.env:CalculatorEnv"}
        """,
    )
    code = (
        "import gymnasium as gym, toolgym\n"
        "from toolgym.envs import ORIGINS\n"
        "env = gym.make('goodplug/Calc-v0'); env.reset(seed=0)\n"
        "print(ORIGINS['goodplug/Calc-v0'])\n"
        "from toolgym.cli import main; main(['list'])\n"
    )
    out = _run(tmp_path, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "good-plugin"
    assert "goodplug/Calc-v0" in out.stdout


def test_broken_plugin_is_a_warning_naming_it(tmp_path):
    _plugin(tmp_path, "bad-plugin", "bad_plugin", "raise RuntimeError('boom')\n")
    out = _run(tmp_path, "import gymnasium as gym, toolgym\ngym.make('toolgym/Calculator-v0')\nprint('ok')")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert "bad-plugin" in out.stderr and "boom" in out.stderr
