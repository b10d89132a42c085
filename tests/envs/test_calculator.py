from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401
from toolgym.envs.calculator.arithmetic import ArithmeticError_, evaluate
from toolgym.envs.calculator.tasks import make_problem
from toolgym.errors import ConfigError, EpisodeOverError


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("37*58", 2146),
        ("(1+2)/4", Fraction(3, 4)),
        ("2^10", 1024),
        ("-3 + +4", 1),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("1,000 * 2", 2000),
        ("0.5 * 4", 2),
    ],
)
def test_evaluate(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "1/0",
        "__import__('os').system('x')",
        "a+1",
        "9**9**9",
        "10**1000",
        "-" * 100 + "1",
        "1" * 600,
        "[1,2]",
        "lambda: 1",
        "2 ** 0.5",
        "0 ** -1",
    ],
)
def test_evaluate_rejects(expr):
    with pytest.raises(ArithmeticError_):
        evaluate(expr)


@pytest.mark.parametrize("digits", [1, 2, 3, 4])
@pytest.mark.parametrize("num_ops", [1, 2, 3])
def test_problems_are_whole_and_solvable(digits, num_ops):
    rng = np.random.default_rng(digits * 10 + num_ops)
    for _ in range(50):
        p = make_problem(rng, digits, num_ops)
        assert p.answer >= 0
        assert evaluate(p.expression) == p.answer
        assert str(p.answer) not in ("", None)


def test_episode_flow_and_reward_parts():
    env = gym.make("toolgym/Calculator-v0", tool_bonus=0.1, tool_bonus_cap=0.15)
    obs, info = env.reset(seed=3)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert {t["function"]["name"] for t in info["tools"]} == {"calculator", "answer"}
    inner = env.unwrapped
    expr = inner.task.data["expression"]
    call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
    obs, r1, term, trunc, info = env.step(call)
    assert obs[0]["role"] == "tool" and obs[0]["content"] == str(inner.task.answer)
    assert obs[0]["tool_call_id"] == "call_0"
    assert r1 == 0.0 and not term and not trunc  # the bonus is earned now, paid with the answer
    obs, r2, *_ = env.step(call)
    assert obs[0]["tool_call_id"] == "call_1"
    assert r2 == 0.0 and inner.episode.bonus_given == pytest.approx(0.15)  # the cap
    obs, r3, term, trunc, info = env.step(f"<answer>{inner.task.answer}</answer>")
    assert term and not trunc and obs == [] and r3 == pytest.approx(1.15)
    assert info["success"] is True
    assert info["episode_reward"] == pytest.approx(1.15)
    assert info["episode_reward_components"] == pytest.approx({"correct": 1.0, "format": 0.0, "tool": 0.15})
    with pytest.raises(EpisodeOverError):
        env.step("<answer>1</answer>")


def test_wrong_answer_and_turn_limit():
    env = gym.make("toolgym/Calculator-v0", max_turns=2)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("no idea")
    assert info["invalid_action"] and reward == pytest.approx(-0.1) and "Invalid action" in obs[0]["content"]
    obs, reward, term, trunc, info = env.step("still no idea")
    assert trunc and not term and info["truncation"] == "turn_limit" and info["success"] is False
    env.reset(seed=0)
    _, reward, term, _, info = env.step("<answer>-12345</answer>")
    assert term and reward == 0.0 and info["success"] is False


def test_token_budget_and_text_prompt():
    env = gym.make("toolgym/Calculator-v0", token_budget=5, prompt_format="text")
    obs, _ = env.reset(seed=1)
    assert '"name": "calculator"' in obs[0]["content"]
    *_, trunc, info = env.step("one two three four five six")
    assert trunc and info["truncation"] == "token_budget"


def test_tags_format_expert():
    env = gym.make("toolgym/Calculator-v0", action_format="tags")
    env.reset(seed=2)
    inner = env.unwrapped
    obs, *_ = env.step(inner.expert_action())
    assert obs[0]["role"] == "tool"
    *_, term, _, info = env.step(inner.expert_action())
    assert term and info["success"]


def test_structured_message_action():
    env = gym.make("toolgym/Calculator-v0")
    env.reset(seed=4)
    expr = env.unwrapped.task.data["expression"]
    action = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "x1",
                "type": "function",
                "function": {"name": "calculator", "arguments": f'{{"expression": "{expr}"}}'},
            }
        ],
    }
    obs, *_ = env.step(action)
    assert obs[0]["tool_call_id"] == "x1"
    answer = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "x2", "function": {"name": "answer", "arguments": {"answer": obs[0]["content"]}}}
        ],
    }
    *_, term, _, info = env.step(answer)
    assert term and info["success"]


def test_bad_config():
    with pytest.raises(ConfigError):
        gym.make("toolgym/Calculator-v0", digits=0)
    with pytest.raises(ConfigError):
        gym.make("toolgym/Calculator-v0", prompt_format="xml")


def test_render_ansi():
    env = gym.make("toolgym/Calculator-v0", render_mode="ansi")
    env.reset(seed=0)
    env.step(env.unwrapped.expert_action())
    text = env.render()
    assert "[user]" in text and "calculator(" in text


def test_lenient_answers():
    strict = gym.make("toolgym/Calculator-v0")
    lenient = gym.make("toolgym/Calculator-v0", lenient_answers=True)
    for env in (strict, lenient):
        env.reset(seed=7)
    gold = lenient.unwrapped.task.answer
    reply = f"Adding them up, the answer is {gold}."
    *_, info = strict.step(reply)
    assert info["invalid_action"]
    _, reward, term, _, info = lenient.step(reply)
    assert term and reward == 1.0 and info["success"]
    lenient.reset(seed=7)
    _, reward, term, _, info = lenient.step(f"<think>the answer is {gold}</think> no idea")
    assert info["invalid_action"] and not term  # reasoning never counts
    lenient.reset(seed=7)
    *_, term, _, info = lenient.step(f"Answer: {gold + 1}")
    assert term and not info["success"]


def test_text_prompt_shows_an_example():
    env = gym.make("toolgym/Calculator-v0", prompt_format="text")
    obs, _ = env.reset(seed=0)
    assert "Example:" in obs[0]["content"] and "<answer>84</answer>" in obs[0]["content"]
    obs, _ = gym.make("toolgym/Calculator-v0").reset(seed=0)
    assert "Example:" not in obs[0]["content"]


# ----- templates, splits, mixed difficulty ------------------------------------------------------------------
from toolgym.envs.calculator import tasks as calc_tasks  # noqa: E402


def _template_lists() -> list[tuple[str, ...]]:
    return [*calc_tasks.SINGLE.values(), *calc_tasks.CHAIN.values(), calc_tasks.OPENERS, calc_tasks.QUESTIONS]


def test_every_template_list_has_train_and_test_templates() -> None:
    for templates in _template_lists():
        train = calc_tasks.split_templates(templates, "train")
        test = calc_tasks.split_templates(templates, "test")
        assert len(train) >= 4 and test and not set(train) & set(test)
        assert set(train) | set(test) == set(templates)


@pytest.mark.parametrize("num_ops", [1, 2, 3])
def test_test_split_never_uses_a_train_template(num_ops: int) -> None:
    rng = np.random.default_rng(num_ops)
    train_single = {t for ts in calc_tasks.SINGLE.values() for t in calc_tasks.split_templates(ts, "train")}
    for _ in range(100):
        p = calc_tasks.make_problem(rng, 3, num_ops, split="test")
        assert evaluate(p.expression) == p.answer >= 0
        if num_ops == 1:  # the text is not the rendering of any train template
            for t in train_single:
                fixed = [piece for piece in re_split(t) if len(piece) > 8]
                assert not all(piece in p.text for piece in fixed), (t, p.text)


def re_split(template: str) -> list[str]:
    import re

    return re.split(r"\{[a-z]+\}", template)


def test_templates_vary_within_one_op_count() -> None:
    rng = np.random.default_rng(0)
    starts = {calc_tasks.make_problem(rng, 2, 1, split="train").text[:12] for _ in range(300)}
    assert len(starts) > 20


def test_mixed_digits_and_op_counts_in_one_env() -> None:
    env = gym.make("toolgym/Calculator-v0", digits=[2, 3], num_ops=[1, 2], split="test")
    seen = set()
    for seed in range(60):
        env.reset(seed=seed)
        data = env.unwrapped.task.data
        seen.add((data["digits"], data["num_ops"]))
        assert data["split"] == "test"
        assert env.unwrapped.task.task_id.startswith(f"calc-d{data['digits']}o{data['num_ops']}-")
    assert seen == {(2, 1), (2, 2), (3, 1), (3, 2)}


def test_split_is_deterministic_per_seed() -> None:
    a = gym.make("toolgym/Calculator-v0", digits=[2, 3], num_ops=[1, 2], split="train")
    b = gym.make("toolgym/Calculator-v0", digits=[2, 3], num_ops=[1, 2], split="train")
    for seed in range(5):
        assert a.reset(seed=seed)[0] == b.reset(seed=seed)[0]


def test_big_products_are_out_of_mental_reach() -> None:
    rng = np.random.default_rng(1)
    products = [p for p in (calc_tasks.make_problem(rng, 3, 1) for _ in range(200)) if " * " in p.expression]
    assert products and all(p.answer >= 10_000 for p in products)


@pytest.mark.parametrize(
    "kwargs",
    [{"digits": []}, {"digits": [2, 13]}, {"num_ops": 0}, {"num_ops": [1, "2"]}, {"split": "dev"}],
)
def test_bad_difficulty_options(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        gym.make("toolgym/Calculator-v0", **kwargs)


def test_text_prompt_example_follows_the_action_format() -> None:
    env = gym.make("toolgym/Calculator-v0", prompt_format="text")
    obs, _ = env.reset(seed=0)
    assert '<tool_call>{"name": "calculator"' in obs[0]["content"]
    assert "<calculator>12 * 7</calculator>" in env.unwrapped.__class__(action_format="tags").example()


# ----- one operation per call (CalculatorChain-v0) ----------------------------------------------------------
def test_steps_chain_to_the_answer() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = make_problem(rng, 3, 3, split="train")
        value = None
        for step in p.steps:
            first = step.split(" ", 1)[0]
            if value is not None:
                assert int(first) == value  # each step starts from the last result
            value = int(evaluate(step))
        assert value == p.answer and len(p.steps) == 3


def test_chain_env_refuses_several_operations_per_call_and_caps_the_bonus() -> None:
    env = gym.make(
        "toolgym/CalculatorChain-v0", num_ops=2, action_format="tags", tool_bonus=0.1, tool_bonus_cap=0.1
    )
    env.reset(seed=0)
    task = env.unwrapped.task
    obs, reward, term, _, _ = env.step(f"<calculator>{task.data['expression']}</calculator>")
    assert "one operation per call" in obs[-1]["content"] and not term and reward == 0.0
    first, second = task.data["steps"]
    obs, reward, *_ = env.step(f"<calculator>{first}</calculator>")
    assert reward == 0.0  # a working call earns the (capped) bonus, paid with the answer
    state = env.unwrapped.get_state()  # the bonus already earned is forked with the episode
    obs, reward, *_ = env.step(f"<calculator>{second}</calculator>")
    assert obs[-1]["content"] == str(task.answer) and reward == 0.0
    obs, reward, term, *_ = env.step(f"<answer>{task.answer}</answer>")
    assert term and reward == pytest.approx(1.1)  # correct + the capped bonus
    env.unwrapped.set_state(state)
    assert env.unwrapped.episode.bonus_given == pytest.approx(0.1)


def test_tool_bonus_needs_an_answer() -> None:
    env = gym.make(
        "toolgym/Calculator-v0", action_format="tags", tool_bonus=0.5, tool_bonus_cap=0.5, max_turns=2
    )
    env.reset(seed=0)
    total = 0.0
    for _ in range(2):  # call the tool until the turn limit: no bonus without an answer
        _, reward, term, trunc, _ = env.step("<calculator>2 + 2</calculator>")
        total += reward
    assert trunc and not term and total == 0.0


def test_chain_expert_makes_one_call_per_operation() -> None:
    env = gym.make("toolgym/CalculatorChain-v0", num_ops=3, action_format="tags")
    env.reset(seed=1)
    calls = 0
    while True:
        action = env.unwrapped.expert_action()
        calls += action.startswith("<calculator>")
        _, reward, term, trunc, _ = env.step(action)
        if term or trunc:
            break
    assert calls == 3 and reward == 1.0


def test_ops_per_call_is_validated() -> None:
    with pytest.raises(ConfigError, match="ops_per_call"):
        gym.make("toolgym/Calculator-v0", ops_per_call=-1)


def test_chain_example_keeps_the_order_of_operations() -> None:
    """``example="chain"``: the text prompt's worked example is a chain in parentheses, and it is right."""
    import gymnasium as gym
    import pytest

    from toolgym.errors import ConfigError

    env = gym.make("toolgym/Calculator-v0", prompt_format="text", action_format="tags", example="chain")
    prompt = env.unwrapped.system_prompt()
    assert "<calculator>(12 + 5) * 3</calculator>\ntool: 51\nassistant: <answer>51</answer>" in prompt
    assert (12 + 5) * 3 == 51
    default = gym.make("toolgym/Calculator-v0", prompt_format="text", action_format="tags")
    assert "<calculator>12 * 7</calculator>" in default.unwrapped.system_prompt()  # unchanged default
    with pytest.raises(ConfigError, match="example must be one of"):
        gym.make("toolgym/Calculator-v0", example="many")
