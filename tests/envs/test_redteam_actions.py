"""Red team: model actions against the envs' own machinery (not the sandboxes: tests/sandboxes/, nor the
terminal: tests/envs/test_terminal_attacks.py). The rule (README, "Environments"): a malformed action is an
observation and a penalty, never a crash; nothing the model's text can do may end as an env_error, run past
the step's limits or reach the next episode.

What is attacked here:
- lone surrogates through JSON escapes (``"\\ud800"``) in tool names, arguments and structured messages: an
  echo of one in an observation made the trainer's tokenizer raise (a crash of the training run, outside the
  env call), and one in an MCP tool's arguments killed the MCP server's stdio writer (an env_error, and every
  later call of the env failed too);
- answers that reasoning-gym's verifiers ``eval`` (``sympy.parse_expr``, ``eval``): they ran the model's text
  as Python in the trainer's process, and an exponent tower hung the step.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import toolgym  # noqa: F401  (registers the ids)
from toolgym.envs.base import tool_env
from toolgym.parsing import parse_action

SURROGATE = "\\ud800"  # a JSON escape: json.loads makes a lone surrogate of it


def _encodable(messages: list[dict[str, Any]]) -> None:
    """What a tokenizer, a JSONL writer and an OpenAI client need of every observation: valid UTF-8."""
    json.dumps(messages, ensure_ascii=False).encode("utf-8")


def _surrogate_actions(env: Any) -> list[Any]:
    specs = tool_env(env).tool_specs
    name = specs[0].name if specs else "x"
    props = list(specs[0].parameters.get("properties", {})) if specs else ["x"]
    args = "{" + ", ".join(f'"{p}": "a{SURROGATE}b"' for p in props) + "}"
    return [
        '<tool_call>{"name": "nope' + SURROGATE + '", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "' + name + '", "arguments": ' + args + "}</tool_call>",
        '<tool_call>{"name": "' + name + '", "arguments": {"zz' + SURROGATE + '": 1}}</tool_call>',
        '<tool_call>{"name": "answer", "arguments": {"answer": "4' + SURROGATE + '"}}</tool_call>',
        "<answer>4\ud800</answer>",
        {
            "role": "assistant",
            "content": "x\udcff",
            "tool_calls": [{"id": "c\ud800", "function": {"name": name, "arguments": args}}],
        },
    ]


@pytest.mark.parametrize(
    "env_id",
    [
        "toolgym/Calculator-v0",
        "toolgym/FreeQA-v0",
        "toolgym/Search-v0",
        "toolgym/MCP-v0",
        "toolgym/Werewolf-v0",
        "toolgym/ReasoningGym-v0",
    ],
)
def test_lone_surrogates_in_actions_never_reach_an_observation_or_a_tool(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        for action in _surrogate_actions(env):
            env.reset(seed=0)
            obs, _, _, _, info = env.step(action)
            assert info.get("truncation") != "env_error", (action, info.get("infra_error"))
            _encodable(obs)
            _encodable(tool_env(env).transcript)
        # the env still works afterwards (an MCP server whose writer died failed every later call)
        env.reset(seed=0)
        obs, _, _, _, info = env.step(tool_env(env).expert_action())
        assert info.get("truncation") != "env_error", info.get("infra_error")
    finally:
        env.close()


def test_parsed_calls_and_messages_carry_no_lone_surrogate() -> None:
    parsed = parse_action(
        '<tool_call>{"name": "f' + SURROGATE + '", "arguments": {"a": ["' + SURROGATE + '"]}}</tool_call>'
    )
    assert parsed.ok and parsed.tool_calls[0].name == "f\ufffd"
    assert parsed.tool_calls[0].arguments == {"a": ["\ufffd"]}
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": "' + SURROGATE + '"}'}}],
    }
    parsed = parse_action(msg)
    assert parsed.tool_calls[0].arguments == {"a": "\ufffd"}
    _encodable([parsed.assistant_message().to_dict()])
    assert parse_action("<answer>\ud800</answer>").answer == "\ufffd"


RG_EVAL = [
    "puzzle24", "countdown", "simple_integration", "intermediate_integration", "polynomial_multiplication",
    "n_queens", "binary_matrix", "spiral_matrix", "string_insertion",
]  # fmt: skip


@pytest.mark.parametrize("task", RG_EVAL)
def test_reasoning_gym_verifiers_never_run_the_answer_as_code(task: str, tmp_path: Path) -> None:
    env = gym.make(f"toolgym/ReasoningGym-{task}-v0")
    marks = [tmp_path / f"{task}-{i}" for i in range(4)]
    answers = [
        f"__import__('pathlib').Path({str(marks[0])!r}).write_text('x')",
        f"open({str(marks[1])!r}, 'w').write('x')",
        f"exec('open({str(marks[2])!r}, \"w\")')",
        f"sympify(\"open('{marks[3]}', 'w')\")",
    ]
    for text in answers:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(f"<answer>{text}</answer>")
        assert terminated and info.get("truncation") is None and reward < 0.5
    assert not any(m.exists() for m in marks)
    # the guard keeps honest answers: the expert's still score
    if tool_env(env).expert_success_rate > 0:
        env.reset(seed=0)
        _, reward, _, _, info = env.step(tool_env(env).expert_action())
        assert info["success"], reward
    env.close()


@pytest.mark.parametrize(
    ("task", "answer"),
    [("coin_flip", "1e999999999"), ("puzzle24", "9**9**9**9"), ("binary_matrix", "9**9**9**9")],
)
def test_reasoning_gym_verifiers_that_would_hang_are_stopped(
    task: str, answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolgym.envs.reasoning_gym import verify

    monkeypatch.setattr(verify, "VERIFY_TIMEOUT_S", 1.0)
    env = gym.make(f"toolgym/ReasoningGym-{task}-v0")
    env.reset(seed=0)
    t0 = time.monotonic()
    _, reward, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    assert time.monotonic() - t0 < 5.0
    assert terminated and info.get("truncation") is None and reward < 0.5
    env.reset(seed=0)  # the env goes on
    _, _, _, _, info = env.step(tool_env(env).expert_action())
    assert info["success"]
    env.close()


WEB_BAD_ARGS = [
    "click({[1]: 2})",
    "type(1, {{}})",
    "click((1+2j))",
    "type((1+2j), 'a')",
    "scroll('up', 1+2j)",
    "select('x', 1j)",
    'click_xy("a", 1)',
    "click_xy([1], 2)",
    "type(1, [1])",
]


@pytest.mark.parametrize("command", WEB_BAD_ARGS)
def test_web_commands_with_unusable_arguments_are_error_texts(command: str) -> None:
    from toolgym.envs.web.env import parse_command

    assert isinstance(parse_command(command), str)  # (a set key, a complex number: TypeError in the step)


def test_web_commands_with_unusable_arguments_are_observations_in_a_real_browser() -> None:
    pytest.importorskip("playwright")
    env = gym.make("toolgym/MiniWoB-click-button-v0")
    try:
        env.reset(seed=0)
        for command in WEB_BAD_ARGS:
            obs, _, terminated, truncated, info = env.step(command)
            assert not (terminated or truncated), (command, info)
            assert info["invalid_action"] and obs[0]["content"].startswith("Invalid action"), command
    finally:
        env.close()


def _step_within(env: Any, action: str, limit_s: float) -> tuple[Any, ...]:
    """``env.step(action)``, failing the test (not hanging it) when it takes longer than ``limit_s``."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(env.step(action)), daemon=True)
    worker.start()
    worker.join(limit_s)
    assert out, f"{action!r}: the step did not return within {limit_s} s"
    return out[0]


def test_textworld_interpreter_commands_neither_hang_nor_touch_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("textworld")
    monkeypatch.chdir(tmp_path)  # where the Z-machine wrote its save and transcript files
    env = gym.make("toolgym/TextWorld-v0")
    try:
        for command in ["\\q", "\\boxed{1}", "\\help", "save", "script", "restore", "look \\n"]:
            env.reset(seed=1)
            obs, _, terminated, truncated, info = _step_within(env, command, 20.0)
            assert not (terminated or truncated), (command, info)
            assert "not available" in obs[0]["content"], command
            _, _, _, _, info = _step_within(env, "look", 20.0)  # the game goes on
            assert info.get("truncation") != "env_error"
        assert list(tmp_path.iterdir()) == []
    finally:
        env.close()


def test_textworld_long_multibyte_commands_are_observations() -> None:
    """jericho cut a command at 198 bytes and decoded the cut: a split emoji raised (env_error, engine killed)."""
    pytest.importorskip("textworld")
    env = gym.make("toolgym/TextWorld-v0")
    try:
        for command in ["🍎" * 50, "open door " + "é" * 120, "日" * 66, "a" * 198]:
            env.reset(seed=1)
            obs, _, terminated, truncated, info = _step_within(env, command, 20.0)
            assert info.get("truncation") != "env_error" and not (terminated or truncated), (command, info)
            assert obs[0]["content"]
    finally:
        env.close()


@pytest.mark.parametrize("task", ["scroll-text", "copy-paste", "email-inbox-reply", "sign-agreement"])
def test_web_text_typed_in_one_episode_is_not_in_the_next(task: str) -> None:
    """A textarea the model typed into kept its text into the next episode, whose own text (set by the task
    as a page load sets it) then never showed: the episode was unsolvable."""
    pytest.importorskip("playwright")
    used = gym.make(f"toolgym/MiniWoB-{task}-v0")
    fresh = gym.make(f"toolgym/MiniWoB-{task}-v0", own_browser=True)
    try:
        used.reset(seed=0)
        page = tool_env(used).episode.snapshot.elements
        for element in page:
            if element["role"] == "textbox":
                used.step(f"type({element['id']}, 'left over')")
        used.step("press('Tab')")
        used.step("press('x')")
        assert used.reset(seed=1)[0] == fresh.reset(seed=1)[0]
    finally:
        used.close()
        fresh.close()


def _calls(name: str, arguments: dict[str, Any], n: int) -> str:
    return ("<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>") * n


def test_many_slow_calls_in_one_turn_run_at_most_the_cap() -> None:
    """Each call has its tool's time limit, so one turn of n slow calls held its step for n limits (a
    200,000-character turn holds thousands): calls past ``max_calls_per_turn`` are answered, not run."""
    env = gym.make(
        "toolgym/PythonMath-v0", sandbox="process", call_timeout_s=1.0, max_calls_per_turn=2,
        sandbox_options={"pool_size": 1},
    )  # fmt: skip
    try:
        env.reset(seed=0)
        t0 = time.monotonic()
        obs, _, _, _, info = env.step(_calls("python", {"code": "import time\ntime.sleep(30)"}, 6))
        assert time.monotonic() - t0 < 2 * (1.0 + 3.0) + 2.0  # two limits (and the sandbox's grace)
        assert info.get("truncation") != "env_error" and len(obs) == 6
        assert all("not run" in m["content"] for m in obs[2:]) and info["tool_calls"] == 6
    finally:
        env.close()
    calc = gym.make("toolgym/Calculator-v0")
    calc.reset(seed=0)
    obs, _, _, _, _ = calc.step(_calls("calculator", {"expression": "2*3"}, 40))
    assert [m["content"] for m in obs[:16]] == ["6"] * 16
    assert all("at most 16 tool calls" in m["content"] for m in obs[16:]) and len(obs) == 40
    calc.close()
