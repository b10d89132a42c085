"""reasoning-gym's datasets as toolgym envs: toolgym's env checks on a sample of varied tasks (the catalog
script runs them over all), rewards that are reasoning-gym's own ``score_answer``, the python-tool mode, and
an ``import toolgym`` that neither imports nor needs reasoning-gym."""

import os
import sys

import gymnasium as gym
import pytest

pytest.importorskip("reasoning_gym")

import toolgym  # noqa: F401
from tests import processes
from toolgym.envs import ENVS
from toolgym.envs.checks import check
from toolgym.envs.reasoning_gym import env_id, read_catalog, working_tasks
from toolgym.envs.reasoning_gym.tasks import dataset
from toolgym.errors import ConfigError

# arithmetic, a cipher, a grid game, logic, graphs; and a dataset without gold answers (no expert)
SAMPLE = ["basic_arithmetic", "caesar_cipher", "maze", "knights_knaves", "shortest_path", "graph_color"]


@pytest.mark.parametrize("task", SAMPLE)
def test_env_checks_on_a_sample(task):
    report = check(env_id(task))  # what `toolgym check toolgym/ReasoningGym-<task>-v0` runs
    assert report.ok, report.errors
    assert report.expert_success >= report.declared_success


def test_catalog_ids_are_registered():
    rows = read_catalog()
    assert len(rows) >= 100
    working = working_tasks()
    assert len(working) >= 95
    assert {env_id(t) for t in working} <= set(ENVS)
    failed = [r["task"] for r in rows if r["task"] not in working]
    assert all(env_id(t) not in ENVS for t in failed)
    assert gym.make(env_id("graph_color")).unwrapped.expert_success_rate == 0.0


def test_reward_is_reasoning_gyms_score():
    env = gym.make(env_id("basic_arithmetic"))
    env.reset(seed=3)
    inner = env.unwrapped
    entry = inner.task.data["entry"]
    data = dataset("basic_arithmetic")
    _, reward, terminated, _, info = env.step("<answer>-123456789</answer>")
    assert terminated and not info["success"]
    assert reward == data.score_answer("-123456789", entry)
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step(f"Thinking... <answer>{entry['answer']}</answer>")
    assert reward == 1.0 and info["success"] and info["reward_components"]["correct"] == 1.0


def test_no_answer_gets_feedback_and_one_retry():
    env = gym.make(env_id("caesar_cipher"))
    obs, _ = env.reset(seed=0)
    assert "<answer>" in obs[0]["content"]
    obs, reward, terminated, truncated, info = env.step("I am not sure.")
    assert info["invalid_action"] and reward == -0.1 and not (terminated or truncated)
    assert "Invalid action" in obs[0]["content"]
    _, _, terminated, truncated, info = env.step("still no tags")
    assert truncated and info["truncation"] == "turn_limit"


def test_python_tool_mode_passes_the_checks():
    name = "toolgym-test/ReasoningGymPython-chain_sum-v0"
    if name not in gym.registry:
        gym.register(
            name,
            ENVS[env_id("chain_sum")],
            kwargs={"tools": "python", "sandbox": "process"},
            disable_env_checker=True,
        )
    report = check(name, garbage_actions=30, expert_episodes=5)
    assert report.ok, report.errors
    env = gym.make(name)
    env.reset(seed=0)
    code = '<tool_call>{"name": "python", "arguments": {"code": "x = 6 * 7\\nprint(x)"}}</tool_call>'
    obs, _, terminated, _, _ = env.step(code)
    assert obs[0]["role"] == "tool" and obs[0]["content"].strip() == "42" and not terminated
    env.close()


def test_generic_id_mixes_tasks_with_a_config_and_picks_an_index():
    env = gym.make(
        "toolgym/ReasoningGym-v0", task=["gcd", "lcm"], config={"min_numbers": 3, "max_numbers": 3}
    )
    seen = set()
    for seed in range(8):
        env.reset(seed=seed)
        seen.add(env.unwrapped.task.data["task"])
    assert seen == {"gcd", "lcm"}
    env.reset(seed=0, options={"index": 7})
    assert env.unwrapped.task.task_id.endswith("-7")


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown reasoning-gym task"):
        gym.make("toolgym/ReasoningGym-v0", task="no_such_task")
    with pytest.raises(ConfigError, match="rejected the config"):
        gym.make("toolgym/ReasoningGym-v0", task="gcd", config={"no_such_field": 1})
    with pytest.raises(ConfigError, match="this id plays 'maze'"):
        gym.make(env_id("maze"), task="gcd")
    with pytest.raises(ConfigError, match="tools must be one of"):
        gym.make(env_id("maze"), tools="bash")


def _python(code):
    return processes.run([sys.executable, "-c", code], timeout=300, env=dict(os.environ))


def test_import_toolgym_does_not_import_reasoning_gym():
    out = _python(
        "import sys, gymnasium as gym, toolgym\n"
        "env = gym.make('toolgym/ReasoningGym-maze-v0')\n"
        "print('reasoning_gym' in sys.modules)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_without_reasoning_gym_the_ids_say_what_to_install():
    out = _python(
        "import sys; sys.modules['reasoning_gym'] = None  # as if it were not installed\n"
        "import gymnasium as gym, toolgym\n"
        "env = gym.make('toolgym/ReasoningGym-maze-v0')\n"
        "try:\n    env.reset(seed=0)\nexcept toolgym.DependencyNotInstalled as exc:\n    print(exc)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "reasoning-gym is not installed" in out.stdout and "toolgym[interop]" in out.stdout


def test_an_item_whose_generator_raises_is_skipped_deterministically(monkeypatch):
    import toolgym.envs.reasoning_gym.env as rg_env

    real = dataset("chain_sum")

    class Flaky:
        def __len__(self):
            return 1000

        def __getitem__(self, index):
            if index % 2:  # as codeio's generator does on rare items (an int64 it cannot serialise)
                raise TypeError("Object of type int64 is not JSON serializable")
            return real[index]

        def score_answer(self, answer, entry):
            return real.score_answer(answer, entry)

    monkeypatch.setattr(rg_env, "dataset", lambda *a, **k: Flaky())
    env = gym.make("toolgym/ReasoningGym-v0", task="chain_sum")
    first = [env.reset(seed=s)[0][1]["content"] for s in range(5)]
    assert first == [env.reset(seed=s)[0][1]["content"] for s in range(5)]
    assert all(int(env.reset(seed=s)[1]["task_id"].rsplit("-", 1)[1]) % 2 == 0 for s in range(5))
