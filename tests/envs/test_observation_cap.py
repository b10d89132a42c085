"""``max_observation_chars``: the base env's cap on one observation message (``ToolEnv._observed``).

An env that echoes the model's reply (GEM's Minesweeper action word, Mastermind's guess list) or returns a
tool's whole output handed back up to the parser's 200,000-character reply limit as one observation. The cap
cuts any message past it to its head and tail around a marker and says so in ``info["observation_truncated"]``,
on every path (reset, tool results, commands, feedback) and for every family; its default cuts nothing that
any family's expert shows today (compared below with and without the cap)."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import pytest

import toolgym  # noqa: F401
from toolgym.envs import ENVS, _load
from toolgym.envs.base import (
    DEFAULT_MAX_OBSERVATION_CHARS,
    CommandOutcome,
    Task,
    ToolEnv,
    cap_messages,
    cap_text,
)
from toolgym.envs.knobs import knobs
from toolgym.errors import ConfigError, DependencyNotInstalled, InfrastructureError
from toolgym.parsing import MAX_ACTION_CHARS, ParseResult
from toolgym.tools import Tool

REPLY = "\\boxed{" + "a" * 190_000 + " 1 1}"  # GEM's Minesweeper red-team reply, under the parser's cap
MARKER = re.compile(r"\[\.\.\. ([\d,]+) characters cut here: this observation had ([\d,]+) characters")


class EchoEnv(ToolEnv):
    """GEM-like: each command's observation repeats the command ("Unknown action: …"), an invalid action's
    feedback quotes it, a tool ``echo`` returns its argument, and ``fail`` raises an infrastructure fault."""

    family = "test"
    action_format = "command"
    reward_keys = ("format",)

    def __init__(self, *, prompt: str = "Play.", **kwargs: Any) -> None:
        self.prompt = prompt
        super().__init__(**kwargs)

    def make_task(self) -> Task:
        return Task("echo", self.prompt)

    def run_command(self, command: str) -> CommandOutcome:
        if command == "fail":
            raise InfrastructureError("the engine died")
        return CommandOutcome(f"Unknown action: {command}\nBoard:\n. . .", {}, False, False)

    def parse(self, action: Any) -> ParseResult:
        if isinstance(action, str) and action.startswith("bad "):
            return ParseResult(text=action, error=f"cannot read {action!r}", error_kind="no_action")
        return super().parse(action)

    def format_feedback(self, parsed: ParseResult) -> str:
        return f"Invalid action: {parsed.error}"

    def expert_action(self) -> str:
        return "look"


class EchoToolEnv(ToolEnv):
    """A hermes env whose tool returns what it is given (a search result, a web page, an MCP tool)."""

    family = "test"

    def make_task(self) -> Task:
        return Task("echo-tool", "Echo.", answer="x")

    def tools(self) -> list[Tool]:
        def echo(text: str) -> str:
            """Return ``text``."""
            return text

        return [Tool(echo)]

    def check_answer(self, answer: str) -> dict[str, float]:
        return {"correct": 1.0}


def _cut(text: str) -> tuple[int, int]:
    found = MARKER.search(text)
    assert found, text[:300]
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


def _sides(out: str) -> tuple[str, str]:
    """The kept head and tail of a cut text."""
    head, rest = out.split("\n\n[... ", 1)
    return head, rest.split(" ...]\n\n", 1)[1]


# ----- the cut itself --------------------------------------------------------------------------------------
def test_cap_text_keeps_head_and_tail_around_a_marker_within_the_limit():
    text = "".join(chr(ord("a") + i % 26) for i in range(190_000))
    out = cap_text(text, 32_000)
    assert len(out) <= 32_000 and out == cap_text(text, 32_000)  # deterministic
    cut, total = _cut(out)
    assert total == 190_000
    head, tail = _sides(out)
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) > len(tail) > 1000  # most of it the head; the end (a board, a traceback) kept too
    assert len(head) + cut + len(tail) == 190_000


@pytest.mark.parametrize("limit", [None, 0, 10_000])
def test_cap_text_leaves_what_fits(limit):
    text = "x" * 10_000
    assert cap_text(text, limit) is text


@pytest.mark.parametrize(
    "unit",
    [
        "e\u0301",
        "\U0001f600",
        "\U0001f469\u200d\U0001f469\u200d\U0001f467",
        "\U0001f44d\U0001f3fd",
        "a\ufe0f",
    ],
)
@pytest.mark.parametrize("offset", range(7))
def test_cap_text_never_splits_a_grapheme(unit, offset):
    text = "z" * offset + unit * 20_000
    out = cap_text(text, 1_000)
    assert len(out) <= 1_000
    head, tail = _sides(out)
    assert head[offset:] == unit * ((len(head) - offset) // len(unit))  # whole units only
    assert tail == unit * (len(tail) // len(unit))
    out.encode("utf-8")  # no half of anything


def test_cap_messages_leaves_system_and_non_text_content():
    big = "y" * 50_000
    messages = [
        {"role": "system", "content": big},
        {"role": "user", "content": big},
        {"role": "tool", "content": [{"type": "text", "text": big}], "tool_call_id": "c0"},
        {"role": "tool", "content": "short", "tool_call_id": "c1", "name": "echo"},
    ]
    out, cuts = cap_messages(messages, 1_000)
    assert out[0] is messages[0] and out[2] is messages[2] and out[3] is messages[3]
    assert len(out[1]["content"]) <= 1_000 and cuts == [{"index": 1, "chars": 50_000}]
    assert cap_messages(messages, None) == (messages, [])


# ----- every path of reset and step ------------------------------------------------------------------------
def test_an_echoed_190k_reply_comes_back_capped_and_flagged():
    assert len(REPLY) < MAX_ACTION_CHARS
    env = EchoEnv()
    assert env.max_observation_chars == DEFAULT_MAX_OBSERVATION_CHARS == 32_000
    _, info = env.reset(seed=0)
    assert "observation_truncated" not in info
    obs, _, _, _, info = env.step(REPLY)
    (message,) = obs
    assert len(message["content"]) <= 32_000
    assert message["content"].startswith("Unknown action: \\boxed{aaa") and message["content"].endswith(
        ". . ."
    )
    assert _cut(message["content"])[1] == len(REPLY) + len("Unknown action: \nBoard:\n. . .")
    assert info["observation_truncated"] == [{"index": 0, "chars": _cut(message["content"])[1]}]
    assert env.transcript[-1]["content"] == message["content"]  # the transcript holds what the model saw
    obs, _, _, _, info = env.step("look")
    assert "observation_truncated" not in info and "cut here" not in obs[0]["content"]


@pytest.mark.parametrize("off", [None, 0])
def test_no_cap_when_off(off):
    env = EchoEnv(max_observation_chars=off)
    env.reset(seed=0)
    obs, *_, info = env.step(REPLY)
    assert REPLY in obs[0]["content"] and "observation_truncated" not in info


def test_feedback_and_reset_prompts_are_capped_the_system_prompt_is_not():
    env = EchoEnv(prompt="p" * 100_000, system_prompt="s" * 100_000, max_observation_chars=5_000)
    with pytest.warns(UserWarning, match="raise it"):  # a task cut before the model acts: likely a setting
        obs, info = env.reset(seed=0)
    assert obs[0]["content"] == "s" * 100_000  # the env's own instructions: configuration, never cut
    assert len(obs[1]["content"]) <= 5_000 and info["observation_truncated"] == [
        {"index": 1, "chars": 100_000}
    ]
    assert env.transcript[1]["content"] == obs[1]["content"]
    obs, reward, _, _, info = env.step("bad " + "q" * 150_000)  # the feedback quotes the reply
    assert info["invalid_action"] and reward == env.format_penalty
    assert len(obs[0]["content"]) <= 5_000 and info["observation_truncated"][0]["chars"] > 150_000


def test_env_error_and_many_tool_results():
    env = EchoEnv(max_observation_chars=5_000)
    env.reset(seed=0)
    obs, _, _, truncated, info = env.step("fail")
    assert (
        obs == [] and truncated and info["truncation"] == "env_error" and "observation_truncated" not in info
    )

    tools = EchoToolEnv(max_observation_chars=2_000)
    tools.reset(seed=0)
    calls = "".join(
        f'<tool_call>{{"name": "echo", "arguments": {{"text": "{c * n}"}}}}</tool_call>'
        for c, n in (("a", 10), ("b", 60_000), ("c", 5), ("d", 2_001))
    )
    obs, *_, info = tools.step(calls)
    assert [len(m["content"]) <= 2_000 for m in obs] == [True] * 4
    assert obs[0]["content"] == "a" * 10 and obs[2]["content"] == "c" * 5
    assert info["observation_truncated"] == [{"index": 1, "chars": 60_000}, {"index": 3, "chars": 2_001}]
    assert [m["tool_call_id"] for m in obs] == [m["tool_call_id"] for m in tools.transcript[-4:]]


@pytest.mark.parametrize("bad", [-1, 1, 499, "32000", 1.5])
def test_a_bad_cap_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="max_observation_chars"):
        EchoEnv(max_observation_chars=bad)


def test_forks_keep_the_capped_transcript():
    env = EchoEnv(max_observation_chars=1_000)
    env.reset(seed=0)
    env.step(REPLY)
    state = env.get_state()
    other = EchoEnv(max_observation_chars=1_000)
    other.reset(seed=0)
    other.set_state(state)
    assert other.transcript == env.transcript and len(other.transcript[-1]["content"]) <= 1_000


# ----- the families ----------------------------------------------------------------------------------------
def test_gem_echoes_are_capped():
    pytest.importorskip("gem")
    for env_id, reply in (
        ("toolgym/GEM-Minesweeper-easy-v0", REPLY),
        ("toolgym/GEM-Mastermind-easy-v0", "\\boxed{" + " ".join(["1"] * 90_000) + "}"),
    ):
        env = gym.make(env_id)
        env.reset(seed=0)
        obs, *_, info = env.step(reply)
        assert len(obs[0]["content"]) <= 32_000 and info["observation_truncated"][0]["chars"] > 150_000, (
            env_id
        )
        env.close()


def test_werewolf_referee_quotes_are_capped_in_the_seat_env_and_in_self_play():
    from toolgym.envs.werewolf.env import self_play_table

    # the referee quotes an unknown player's name whole: "'QQQ…' is not a player."
    call = '<tool_call>{"name": "inspect", "arguments": {"player": "' + "Q" * 150_000 + '"}}</tool_call>'
    env = gym.make("toolgym/Werewolf-v0")
    obs, _ = env.reset(seed=0)
    while "vote(player)" not in obs[-1]["content"]:  # the expert plays on to a vote
        obs, *_ = env.step(env.unwrapped.expert_action())
    obs, *_, info = env.step(call.replace("inspect", "vote"))
    assert len(obs[0]["content"]) <= 32_000 and info["observation_truncated"][0]["chars"] > 150_000
    for kwargs in ({}, {"max_observation_chars": None}):
        table = self_play_table(["P1"], seed=0, **kwargs)
        seat = table.next_seat()
        table.messages(seat)
        table.act(seat, call)
        last = table.messages(table.next_seat())[-1]
        assert last["role"] == "user" and "is not a player" in last["content"]
        assert (len(last["content"]) <= 32_000) == (not kwargs), kwargs  # capped as the seat env caps


def test_trl_adapter_caps_the_error_that_quotes_an_argument_name():
    from toolgym.adapters.trl import environment_factory

    env = environment_factory("toolgym/Calculator-v0")()
    env.reset(seed=0)
    out = env.calculator(expression="1+1", **{"x" * 150_000: 1})  # TypeError: unexpected keyword 'xxx…'
    assert out.startswith("Invalid call of calculator") and len(out) <= 32_000 and "characters cut" in out


def test_remote_caps_what_the_server_sends():
    from tests.testing_env import register

    register()
    if "tests/Echo-v0" not in gym.registry:
        gym.register("tests/Echo-v0", entry_point=EchoEnv, disable_env_checker=True)
    # the served env sends its observations whole (no cap there); this side caps them
    env = gym.make(
        "toolgym/Remote-v0",
        serve="tests/Echo-v0",
        serve_kwargs={"max_observation_chars": None},
        max_observation_chars=2_000,
    )
    try:
        env.reset(seed=0)
        obs, *_, info = env.step("x" * 20_000)
        assert len(obs[0]["content"]) <= 2_000 and info["observation_truncated"] == [
            {"index": 0, "chars": len("Unknown action: \nBoard:\n. . .") + 20_000}
        ]
        assert env.unwrapped.transcript[-1]["content"] == obs[0]["content"]
    finally:
        env.close()


def _one_id_per_family() -> list[str]:
    """The first registered id of each family's module (Web-v0 for the MiniWoB ids, ReasoningGym-v0 for its
    catalog), and every GEM id (one game each, and fast), from the registry tests/envs/test_all_envs.py
    iterates."""
    seen: dict[str, str] = {}
    for env_id, entry_point in ENVS.items():
        seen.setdefault(env_id if env_id.startswith("toolgym/GEM-") else entry_point.split(":")[0], env_id)
    return list(seen.values())


FAMILIES = _one_id_per_family()


def _make(env_id: str, **kwargs: Any) -> gym.Env:
    if env_id.startswith("toolgym/GEM-"):
        pytest.importorskip("gem")
    try:
        return gym.make(env_id, **kwargs)
    except DependencyNotInstalled as exc:
        pytest.skip(str(exc))


def test_every_env_takes_the_knob():
    for env_id in ENVS:
        assert "max_observation_chars" in knobs(_load(ENVS[env_id])), env_id


@pytest.mark.parametrize("env_id", FAMILIES)
def test_the_knob_passes_through_gym_make(env_id):
    env = _make(env_id, max_observation_chars=1_234)
    try:
        assert env.unwrapped.max_observation_chars == 1_234
    finally:
        env.close()


def _expert_episodes(env_id: str, cap: Any, seeds: int) -> list[Any]:
    kwargs = {} if cap == "default" else {"max_observation_chars": cap}
    env = _make(env_id, **kwargs)
    inner = env.unwrapped
    seen: list[Any] = []
    try:
        for seed in range(seeds):
            obs, info = env.reset(seed=seed)
            seen.append((obs, "observation_truncated" in info))
            for _ in range(inner.max_turns):
                obs, reward, terminated, truncated, info = env.step(inner.expert_action())
                seen.append((obs, reward, terminated, truncated, "observation_truncated" in info))
                if terminated or truncated:
                    break
    finally:
        env.close()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("env_id", FAMILIES)
def test_the_default_cap_changes_no_expert_episode(env_id):
    capped = _expert_episodes(env_id, "default", seeds=3)
    if getattr(_load(ENVS[env_id]), "deterministic", True) is False:
        pytest.skip("not deterministic per seed")
    assert capped == _expert_episodes(env_id, None, seeds=3)
    assert not any(step[-1] for step in capped)
