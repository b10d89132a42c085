"""Token-faithful rendering: templates checked turn by turn, 5-turn tool episodes re-rendered from scratch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from toolgym.agents import ChatRenderer, Generation, SamplingParams, check_template, run_episodes
from toolgym.agents.policy import AssistantTurn
from toolgym.agents.rendering import to_user_tool_messages
from toolgym.errors import ConfigError


class ReplayTokenPolicy:
    """A token-level policy that 'samples' the Calculator expert's texts: four calculator calls, then the
    answer, as encode(text) + the stop token. Records every prompt it was given."""

    name = "replay"

    def __init__(self, tokenizer: Any) -> None:
        self._renderer = ChatRenderer(tokenizer)
        self.prompts: list[list[int]] = []

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    def act(self, *args: Any, **kwargs: Any) -> list[AssistantTurn]:
        raise NotImplementedError

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = [*self._renderer.encode(self.reply(p)), min(self._renderer.stop_ids)]
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out

    def reply(self, prompt: list[int]) -> str:
        """The text 'sampled' after ``prompt``."""
        turn = self._renderer.decode(prompt).count("<|im_start|>assistant")
        return (
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{turn}*7"}}}}</tool_call>'
            if turn < 5
            else "<answer>35</answer>"
        )

    def to_turn(self, gen: Generation, tools: Any, prompt_len: int = 0) -> AssistantTurn:
        from toolgym.agents.policy import parse_turn

        text = self._renderer.decode(self._renderer.strip_stop(gen.token_ids))
        return AssistantTurn(text, parse_turn(text, tools), gen.token_ids, gen.logprobs, gen.finish_reason)


def _five_turn_episode(tokenizer: Any, prompt_format: str) -> tuple[Any, ReplayTokenPolicy]:
    policy = ReplayTokenPolicy(tokenizer)
    (traj,) = run_episodes(
        policy, "toolgym/Calculator-v0", 1, env_kwargs={"max_turns": 6, "prompt_format": prompt_format}
    )
    return traj, policy


def _assert_faithful(tokenizer: Any, traj: Any, policy: ReplayTokenPolicy) -> None:
    renderer = policy.renderer
    assert traj.turns == 5 and len(traj.turn_spans) == 5
    assert sum(traj.loss_mask) == sum(end - start for start, end in traj.turn_spans)
    # 1. each prompt starts with exactly the previous prompt + its generated ids
    for k in range(1, len(policy.prompts)):
        prev, (start, end) = policy.prompts[k - 1], traj.turn_spans[k - 1]
        assert policy.prompts[k][: len(prev)] == prev
        assert policy.prompts[k][len(prev) : len(prev) + end - start] == traj.token_ids[start:end]
    # 2. and equals the template's own rendering of the conversation so far, tokenized afresh
    assistant_at = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    for k, i in enumerate(assistant_at):
        fresh = renderer.prompt_ids(traj.messages[:i], traj.tools)
        assert fresh == policy.prompts[k], f"turn {k + 1} differs from a fresh render"
    # 3. the loss mask is 1 exactly on the sampled ids
    for start, end in traj.turn_spans:
        assert traj.loss_mask[start:end] == [1] * (end - start)


def test_qwen_style_template_is_faithful_over_five_tool_turns(qwen_tokenizer: Any) -> None:
    assert check_template(qwen_tokenizer).ok
    traj, policy = _five_turn_episode(qwen_tokenizer, "tools")
    assert policy.renderer.tool_role == "native" and policy.renderer.renders_tools
    assert traj.terminated and traj.tool_calls == 4
    _assert_faithful(qwen_tokenizer, traj, policy)
    text = policy.renderer.decode(traj.token_ids)
    assert text.count("<tool_response>") == 4 and "<|im_start|>tool" not in text


def test_smollm2_template_is_faithful_over_five_tool_turns(smollm2_tokenizer: Any) -> None:
    report = check_template(smollm2_tokenizer)
    assert report.ok and report.tool_role == "user", str(report)
    traj, policy = _five_turn_episode(smollm2_tokenizer, "text")
    assert not policy.renderer.renders_tools
    assert traj.terminated and traj.tool_calls == 4
    _assert_faithful(smollm2_tokenizer, traj, policy)
    text = policy.renderer.decode(traj.token_ids)
    assert "<|im_start|>tool" not in text and text.count("<|im_start|>user\n<tool_response>") == 4


def test_chatml_close_turn_after_length_cut(chatml_tokenizer: Any) -> None:
    r = ChatRenderer(chatml_tokenizer)
    stop = min(r.stop_ids)
    assert r.close_turn([5, 6, stop]) == r.encode("\n")
    assert r.close_turn([5, 6]) == [stop, *r.encode("\n")]
    assert r.decode(r.env_suffix([{"role": "user", "content": "again"}])) == (
        "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )


def test_native_tool_role_on_smollm2_shape_is_selectable(chatml_tokenizer: Any) -> None:
    r = ChatRenderer(chatml_tokenizer, tool_role="native")
    assert r.decode(r.env_suffix([{"role": "tool", "content": "4"}])).startswith("<|im_start|>tool\n4")


def test_template_that_rewrites_history_is_reported(qwen_tokenizer: Any) -> None:
    # drops the reasoning of earlier assistant turns (as some reasoning templates do): not prefix-consistent
    template = qwen_tokenizer.chat_template.replace(
        "{{ '<|im_start|>assistant\\n' + message.content }}",
        "{{ '<|im_start|>assistant\\n' + (message.content if loop.last or loop.index0 > messages|length - 3"
        " else message.content[:5]) }}",
    )
    report = check_template(qwen_tokenizer, chat_template=template)
    assert not report.ok
    assert report.mismatch_turn is not None and report.mismatch_turn >= 2 and report.position is not None
    assert "not prefix-consistent" in str(report)


def test_template_without_chat_template_raises(chatml_tokenizer: Any) -> None:
    import copy

    tok = copy.copy(chatml_tokenizer)
    tok.chat_template = None
    with pytest.raises(ConfigError, match="no chat template"):
        ChatRenderer(tok)


def test_tool_fallback_renders_calls_without_text() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "content": "2"},
    ]
    out = to_user_tool_messages(msgs)
    assert out[0] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    }
    assert out[1]["role"] == "user" and out[1]["content"] == "<tool_response>\n2\n</tool_response>"
