import contextlib
import io
import json
import os

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401
from toolgym.envs.checks import expert_success_rate
from toolgym.envs.coding.interpreter import show_last_expression, truncate
from toolgym.envs.python_math.datasets import gold_answer, load_math_dataset
from toolgym.envs.python_math.generator import KINDS, LEVELS, make_problem
from toolgym.errors import ConfigError, EpisodeOverError
from toolgym.sandboxes import ExecResult

# the sandbox backend of these tests: docker (CI) unless TOOLGYM_TEST_SANDBOX names another
BACKEND = os.environ.get("TOOLGYM_TEST_SANDBOX", "auto")
ID = "toolgym/PythonMath-v0"


@pytest.fixture(scope="module", autouse=True)
def _warm_pool():
    """Start the pool's containers once, before any episode (a busy daemon can time out a cold start inside a
    step, which is an env_error). Without docker: skipped here, a failure under CI."""
    from toolgym.envs.coding.interpreter import shared_sandbox
    from toolgym.errors import InfrastructureError

    try:
        shared_sandbox(BACKEND).warmup()
    except InfrastructureError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no sandbox: {exc}")


def call(code):
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture
def env():
    e = gym.make(ID, sandbox=BACKEND)
    yield e
    e.close()


# ----- the generator -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", LEVELS)
def test_expert_programs_compute_the_gold(kind, level):
    """Our own programs, run here: what the expert would print is the gold, for many seeds."""
    for seed in range(25):
        p = make_problem(np.random.default_rng(seed), (kind,), level)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(p.code, {})
        assert out.getvalue().strip() == p.answer, (kind, level, seed, p.question)
        assert p.kind == kind and p.level == level and p.question


def test_levels_grow_and_seeds_differ():
    rng = np.random.default_rng(0)
    easy = [len(make_problem(rng, ("arithmetic",), 1).answer) for _ in range(20)]
    hard = [len(make_problem(rng, ("arithmetic",), 3).answer) for _ in range(20)]
    assert max(easy) < min(hard)
    texts = {make_problem(np.random.default_rng(s)).question for s in range(30)}
    assert len(texts) == 30


def test_bad_options():
    with pytest.raises(ConfigError, match="unknown problem kind"):
        gym.make(ID, sandbox=BACKEND, kinds=["topology"])
    with pytest.raises(ConfigError, match="difficulty"):
        gym.make(ID, sandbox=BACKEND, difficulty=7)
    with pytest.raises(ConfigError):
        gym.make(ID, sandbox=BACKEND, call_timeout_s=0)


# ----- datasets ------------------------------------------------------------------------------------------
def test_gold_formats():
    assert gold_answer("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"
    assert gold_answer("#### 1,234") == "1234"
    assert (
        gold_answer(r"Thus $\boxed{\frac{1}{2}}$ is it, not \boxed{3}... wait, \boxed{\dfrac{2}{3}}")
        == r"\dfrac{2}{3}"
    )
    assert gold_answer(" 5 ") == "5"
    assert gold_answer(["7", "seven"]) == "7"


def test_load_jsonl_formats(tmp_path):
    path = tmp_path / "mix.jsonl"
    rows = [
        {"question": "What is 6 * 7?", "answer": "6 * 7 = 42\n#### 42"},  # GSM8K
        {"problem": "Half of 1?", "solution": r"It is $\boxed{\frac{1}{2}}$.", "unique_id": "m1"},  # MATH
        {"problem": "2+2?", "answer": "4", "solution": "two and two"},  # MATH-500: the answer column wins
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = load_math_dataset(path)
    assert [i.answer for i in items] == ["42", r"\frac{1}{2}", "4"]
    assert items[1].item_id == "m1"
    assert load_math_dataset(path, limit=1)[0].question == "What is 6 * 7?"
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps({"data": [{"q": "1+1?", "a": "2"}]}))
    assert load_math_dataset(custom, question_key="q", answer_key="a")[0].answer == "2"


def test_load_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "answer": "1"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2"):
        load_math_dataset(bad)
    nocol = tmp_path / "nocol.jsonl"
    nocol.write_text('{"text": "x", "label": "1"}\n')
    with pytest.raises(ConfigError, match="question_key"):
        load_math_dataset(nocol)
    with pytest.raises(ConfigError, match="no column 'zz'"):
        load_math_dataset(nocol, question_key="zz")
    with pytest.raises(ConfigError, match="does not exist"):
        load_math_dataset(str(tmp_path / "missing.jsonl"))


def test_hf_loading_path_on_a_local_folder(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "gsm"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps({"question": "3*3?", "answer": "#### 9"}) + "\n")
    items = load_math_dataset(str(folder), split="test")
    assert items[0].answer == "9"


def test_dataset_env_and_expert(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"question": "What is 2/4 in lowest terms?", "answer": r"\frac{1}{2}"},
                {"question": "7 * 6?", "answer": "#### 42"},
            ]
        )
    )
    env = gym.make(ID, sandbox=BACKEND, dataset=str(path))
    obs, info = env.reset(seed=0, options={"index": 1})
    assert obs[1]["content"] == "7 * 6?" and info["task_id"] == "pymath-data-1"
    _, r, term, _, info = env.step(r"It is \boxed{42}.")
    assert term and r == 1.0 and info["success"]
    env.reset(options={"index": 0})
    inner = env.unwrapped
    obs, _, term, trunc, info = env.step(inner.expert_action())
    assert not (term or trunc) and obs[0]["content"] == r"\frac{1}{2}", (obs, info)
    _, r, term, _, info = env.step(inner.expert_action())
    assert term and info["success"]
    with pytest.raises(ConfigError, match="index"):
        env.reset(options={"index": 5})
    env.close()


# ----- the interpreter helpers -----------------------------------------------------------------------------
def test_show_last_expression_keeps_lines():
    assert show_last_expression("x = 1\nx + 1  # c") == "x = 1\n" + (
        "(lambda __tg_v: None if __tg_v is None else print(repr(__tg_v)))(x + 1)  # c"
    )
    assert show_last_expression("print(1)").endswith("(print(1))")
    assert show_last_expression("def f(:") == "def f(:"
    assert show_last_expression("s = 'é'; s").endswith("(s)")
    multi = show_last_expression("(1 +\n 2)")
    assert multi.count("\n") == 1


def test_truncate_marker():
    text = "x" * 5000
    cut = truncate(text, 1000)
    assert "[... 4000 characters truncated ...]" in cut and len(cut) < 1100
    assert truncate("short", 1000) == "short"


# ----- episodes -----------------------------------------------------------------------------------------
def test_episode_every_code_syntax_and_state(env):
    obs, info = env.reset(seed=0)
    assert {t["function"]["name"] for t in info["tools"]} == {"python", "answer"}
    assert "\\boxed" in obs[0]["content"]
    obs, r, _term, _trunc, info = env.step(call("x = 6\ny = 7"))
    assert obs[0]["content"] == "(no output)" and not info["invalid_action"] and r == 0.0
    obs, *_ = env.step("Now multiply.\n```python\nprint(x * y)\n```")
    assert obs[0]["role"] == "tool" and obs[0]["content"] == "42"
    obs, *_ = env.step("<python>x ** 50</python>")
    assert obs[0]["content"] == str(6**50)
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "python", "arguments": '{"code": "y"}'}}
        ],
    }
    obs, *_ = env.step(msg)
    assert obs[0]["content"] == "7" and obs[0]["tool_call_id"] == "c9"
    obs, *_ = env.step(call("1/0"))
    assert "ZeroDivisionError" in obs[0]["content"] and "Traceback" in obs[0]["content"]


def test_answer_forms_and_equivalence():
    env = gym.make(ID, sandbox=BACKEND, kinds=["fractions"], difficulty=1)
    for form in (
        r"\boxed{{{p}}}",
        r"<answer>{p}</answer>",
        r"The answer is $\boxed{{\frac{{{n}}}{{{d}}}}}$.",
    ):
        env.reset(seed=3)
        gold = env.unwrapped.task.answer
        n, _, d = gold.partition("/")
        action = form.format(p=gold, n=n, d=d or 1)
        _, r, term, _, info = env.step(action)
        assert term and r == 1.0 and info["success"], action
    env.reset(seed=3)
    _, r, term, _, info = env.step(
        '<tool_call>{"name": "answer", "arguments": {"answer": "12345/7"}}</tool_call>'
    )
    assert term and r == 0.0 and not info["success"]
    env.close()


def test_void_turns_and_format_penalty(env):
    env.reset(seed=1)
    obs, r, term, _trunc, info = env.step("Let me think about it.")
    assert info["void_turn"] and info["invalid_action"] and r == pytest.approx(-0.1)
    assert "```python" in obs[0]["content"]
    _, _, _, _, info = env.step(call("print(1)"))
    assert not info["void_turn"]
    _, _, term, _, info = env.step("<answer>0</answer>")
    assert term and info["episode_void_turns"] == 1
    with pytest.raises(EpisodeOverError):
        env.step("<answer>0</answer>")


def test_output_truncation_and_timeout():
    env = gym.make(ID, sandbox=BACKEND, max_output_chars=200, call_timeout_s=1.5)
    env.reset(seed=0)
    obs, *_ = env.step(call("keep = 5\nprint('a' * 10000)"))
    assert "characters truncated" in obs[0]["content"] and len(obs[0]["content"]) < 300
    obs, *_ = env.step(call("while True: pass"))
    assert "time limit" in obs[0]["content"]
    obs, _, _, trunc, info = env.step(call("print(keep)"))
    assert "restarted" in obs[0]["content"] and "NameError" in obs[0]["content"]
    assert not trunc and "truncation" not in info  # the model's own doing: not an env error
    env.close()


def test_tool_bonus_capped_and_paid_with_the_answer():
    env = gym.make(ID, sandbox=BACKEND, tool_bonus=0.1, tool_bonus_cap=0.15)
    env.reset(seed=0)
    inner = env.unwrapped
    assert env.step(call("print(1)"))[1] == 0.0  # earned now, paid with the answer
    assert env.step(call("1/0"))[1] == 0.0 and inner.get_state()["episode"].bonus_given == pytest.approx(0.1)
    assert env.step(call("print(2)"))[1] == 0.0  # an error earned nothing; this one reaches the cap
    assert inner.get_state()["episode"].bonus_given == pytest.approx(0.15)
    _, reward, term, _, info = env.step(f"<answer>{inner.task.answer}</answer>")
    assert term and info["success"] and reward == pytest.approx(1.15)
    env.close()


def test_tool_spamming_policy_earns_no_bonus():
    """Paid per call, a policy could run code until the turn limit and never answer (RL found that on
    Calculator-v0): the bonus comes only with a final answer."""
    env = gym.make(ID, sandbox=BACKEND, tool_bonus=0.5, tool_bonus_cap=0.5, max_turns=3)
    env.reset(seed=0)
    rewards = []
    for _ in range(3):
        _, reward, term, trunc, info = env.step(call("print(1)"))
        rewards.append(reward)
    assert trunc and not term and info["truncation"] == "turn_limit"
    assert rewards == [0.0, 0.0, 0.0]
    env.close()


def test_fork_restores_the_interpreter(env):
    env.reset(seed=2)
    inner = env.unwrapped
    env.step(call("x = 1"))
    state = inner.get_state()
    env.step(call("x = 2"))
    assert env.step(call("x"))[0][0]["content"] == "2"
    for _ in range(2):  # one state restores many times
        inner.set_state(state)
        obs, *_ = env.step(call("print(x)"))
        assert obs[0]["content"] == "1"
        assert inner.transcript[-1]["content"] == "1"
        env.step(call("x = 99"))
    fresh = gym.make(ID, sandbox=BACKEND)
    fresh.reset(seed=2)
    assert fresh.unwrapped.get_state()["extra"] is None  # nothing ran: nothing to fork
    fresh.close()


def test_sandbox_fault_is_env_error(env, monkeypatch):
    env.reset(seed=0)
    inner = env.unwrapped
    env.step(call("x = 1"))
    session = inner._interpreter._session
    monkeypatch.setattr(
        session, "run", lambda *a, **k: ExecResult("sandbox_error", "", "", None, 0.0, detail="daemon gone")
    )
    obs, r, term, trunc, info = env.step(call("print(x)"))
    assert trunc and not term and info["truncation"] == "env_error" and "daemon gone" in info["infra_error"]
    assert r == 0.0 and obs == []


@pytest.mark.parametrize("fmt", ["hermes", "tags"])
def test_expert_solves_every_kind(fmt):
    rate = expert_success_rate(ID, sandbox=BACKEND, episodes=14, action_format=fmt, difficulty=None)
    assert rate == 1.0


@pytest.mark.slow
def test_expert_200_seeds():
    assert expert_success_rate(ID, sandbox=BACKEND, episodes=200, difficulty=None) == 1.0


def test_text_prompt_has_example():
    env = gym.make(ID, sandbox=BACKEND, prompt_format="text")
    obs, _ = env.reset(seed=0)
    assert "27405" in obs[0]["content"] and '"name": "python"' in obs[0]["content"]
    env.close()


def test_killed_container_is_env_error():
    """A real fault: the episode's container dies mid-call. Not the model's failure: env_error."""
    if BACKEND == "process":
        pytest.skip("docker only")
    import threading

    from toolgym.sandboxes.docker_backend import client

    env = gym.make(ID, sandbox=BACKEND)
    env.reset(seed=0)
    env.step(call("x = 1"))
    box = env.unwrapped._interpreter._session._family.box
    killer = threading.Timer(1.0, lambda: client().containers.get(box.name).kill())
    killer.start()
    obs, r, term, trunc, info = env.step(call("import time\ntime.sleep(8)"))
    killer.join()
    assert trunc and not term and info["truncation"] == "env_error" and obs == [] and r == 0.0
    env.reset(seed=0)  # the next episode gets a live box
    assert env.step(call("print(2 + 2)"))[0][0]["content"] == "4"
    env.close()
