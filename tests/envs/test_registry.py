"""The three ways to make a toolgym env, each in a fresh interpreter (Gymnasium 1.x has no plugin loading)."""

import sys

import pytest

from tests import processes

SNIPPETS = {
    "import": "import gymnasium as gym, toolgym\nenv = gym.make('toolgym/Calculator-v0')",
    "register_envs": "import gymnasium as gym, toolgym\ngym.register_envs(toolgym)\nenv = gym.make('toolgym/Calculator-v0')",
    "module_prefix": "import gymnasium as gym\nenv = gym.make('toolgym:toolgym/Calculator-v0')",
}


@pytest.mark.parametrize("how", sorted(SNIPPETS))
def test_make_in_fresh_process(how):
    code = SNIPPETS[how] + "\nobs, info = env.reset(seed=0)\nprint(info['task_id'])"
    out = processes.run([sys.executable, "-c", code], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("calc-")


def test_import_stays_cheap():
    code = "import sys, toolgym\nheavy = [m for m in ('torch', 'docker', 'playwright', 'transformers') if m in sys.modules]\nprint(heavy)"
    out = processes.run([sys.executable, "-c", code], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
