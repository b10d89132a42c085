"""SFT: conversations -> ids + loss mask (token-faithful), packing that keeps sequences apart, the loop on a
tiny model, the command, and `toolgym train --init RUN_DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import tiny_model
from tests.trainers.killing import dies_after_save
from toolgym.agents.rendering import ChatRenderer, sample_tool_conversation
from toolgym.errors import ConfigError
from toolgym.trainers.sft import (
    SFTConfig,
    assistant_text,
    conversation_tokens,
    expert_conversations,
    load_conversations,
    model_dir,
    pack,
    row_tensors,
    token_losses,
    train,
)

CALC = "toolgym/Calculator-v0"
KW: dict[str, Any] = {"prompt_format": "text", "max_turns": 3}


def test_end_of_turn_token_is_the_templates(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.end_of_turn_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_tokens_match_the_full_rendering_and_mask_only_replies(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    messages, tools = sample_tool_conversation(3)
    ids, mask = conversation_tokens(messages, tools, renderer)
    assert len(ids) == len(mask)
    full = renderer.render_ids(messages, tools)
    assert ids == full[: len(ids)]  # what the engine builds turn by turn = the template's whole rendering
    eot = renderer.end_of_turn_id
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append(ids[start:i])
            start = None
    assert [renderer.decode(s[:-1]) for s in spans] == replies
    assert all(s[-1] == eot for s in spans)


def test_openai_tool_calls_become_hermes_text() -> None:
    msg = {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
    }
    assert assistant_text(msg) == 'Let me compute.\n<tool_call>{"name": "calc", "arguments": {}}</tool_call>'
    assert assistant_text({"role": "assistant", "content": "<answer>4</answer>"}) == "<answer>4</answer>"
    bad = {"role": "assistant", "tool_calls": [{"function": {"name": "calc", "arguments": "{oops"}}]}
    with pytest.raises(ConfigError, match="not JSON"):
        assistant_text(bad)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("{not json", "is not JSON"),
        ('{"messages": "hi"}', "list of messages"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "at least one assistant"),
        ('{"messages": [{"role": "assistant", "content": "hi"}]}', "at least one assistant"),
        ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": 3}', "tools"),
    ],
)  # fmt: skip
def test_bad_conversation_files(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=error):
        load_conversations(path)


def test_packed_rows_score_like_separate_sequences(tokenizer: Any) -> None:
    model = tiny_model(len(tokenizer)).eval()  # type: ignore[attr-defined]
    seqs = [([5, 6, 7, 8, 9], [0, 0, 1, 1, 1]), ([10, 11, 12], [0, 1, 1]), ([13, 14, 15, 16], [0, 0, 0, 1])]
    rows = pack(seqs, 12)
    assert len(rows) == 1  # all three fit in one row
    with torch.no_grad():
        packed, _ = token_losses(model, row_tensors(rows, 0))
        alone = [token_losses(model, row_tensors([[s]], 0))[0][0] for s in rows[0]]
    at = 0
    for ce in alone:
        n = ce.shape[0] + 1
        assert torch.allclose(packed[0, at : at + n - 1], ce, atol=1e-5)
        at += n


def test_expert_conversations_are_successful_and_split(tokenizer: Any) -> None:
    convs = expert_conversations([CALC], {**KW, "num_ops": [1, 2], "split": "train"}, 6, seed=1)
    assert len(convs) == 6
    messages, tools = convs[0]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert {t["function"]["name"] for t in tools} == {"calculator", "answer"}


def test_sft_run_then_grpo_from_it(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolgym.cli import main

    cfg = SFTConfig(
        env_ids=[CALC], env_kwargs=KW, eval_env_kwargs={"split": "test"}, episodes=4, batch_size=2, steps=3,
        pack_tokens=4096, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=2,
        max_new_tokens=4, output_dir=str(tmp_path / "sft"),
    )  # fmt: skip
    model = tiny_model(len(tokenizer))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}  # type: ignore[attr-defined]
    summary = train(cfg, model, tokenizer)
    assert summary["steps"] == 3 and summary["conversations"] == 4
    assert summary["success_before"] is not None and summary["success_after"] is not None
    moved = [n for n, p in model.named_parameters() if not torch.equal(before[n], p)]  # type: ignore[attr-defined]
    assert moved
    records = [json.loads(ln) for ln in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert "eval/success" in records[0] and "losses/sft" in records[1]
    assert (tmp_path / "sft" / "sft_loss.png").is_file()
    assert model_dir(tmp_path / "sft").is_dir()

    argv = ["train", "--init", str(tmp_path / "sft"), "--env-ids", CALC, "--env-kwargs", json.dumps(KW),
            "--steps", "1", "--prompts-per-step", "1", "--budget", "2", "--max-new-tokens", "4", "--device", "cpu",
            "--eval-episodes", "1", "--no-tensorboard", "--no-progress", "--output-dir", str(tmp_path / "rl")]  # fmt: skip
    assert main(argv) == 0
    config = json.loads((tmp_path / "rl" / "config.json").read_text())
    assert config["model"] == str(tmp_path / "sft" / "model")


def test_init_needs_an_sft_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolgym.cli import main

    assert main(["train", "--init", str(tmp_path), "--print-config"]) == 2
    assert "run `toolgym sft` first" in capsys.readouterr().err


def test_sft_command_prints_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    from toolgym.cli import main

    assert main(["sft", "--episodes", "7", "--eval-env-kwargs", '{"split": "test"}', "--print-config"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algorithm"] == "sft" and out["episodes"] == 7 and out["eval_env_kwargs"] == {"split": "test"}


def test_lora_sft_saves_a_merged_plain_model(tmp_path: Path, tokenizer: Any) -> None:
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    cfg = SFTConfig(
        env_ids=[CALC], env_kwargs=KW, episodes=2, batch_size=2, steps=1, lora_r=4, lora_targets=["q_proj", "v_proj"],
        lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_before=False, eval_episodes=1,
        max_new_tokens=2, output_dir=str(tmp_path / "sft"),
    )  # fmt: skip
    train(cfg, tiny_model(len(tokenizer)), tokenizer)
    folder = model_dir(tmp_path / "sft")
    assert not (folder / "adapter_config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert not any("lora" in n for n, _ in loaded.named_parameters())


@pytest.mark.parametrize("lora", [False, True])
def test_sft_resume_is_bit_identical(tmp_path: Path, tokenizer: Any, monkeypatch: Any, lora: bool) -> None:
    """A run killed right after its step-2 checkpoint and resumed (from another initialisation) ends with the
    same weights, loss curve and summary as one never stopped: weights or LoRA adapters, AdamW, the LR
    schedule, the data order across a pass boundary (4 conversations, 2 a step) and the RNG all resume."""
    if lora:
        pytest.importorskip("peft")
    opts: dict[str, Any] = dict(
        env_ids=[CALC], env_kwargs=KW, episodes=4, batch_size=2, steps=4, warmup_steps=2, pack_tokens=4096,
        lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=1, max_new_tokens=2,
    )  # fmt: skip
    if lora:
        opts |= dict(lora_r=4, lora_targets=["q_proj", "v_proj"])

    def run(out: Path, seed: int = 0, **kw: Any) -> tuple[Any, dict[str, Any]]:
        model = tiny_model(len(tokenizer), seed=seed)
        summary = train(SFTConfig(output_dir=str(out), **opts, **kw), model, tokenizer)
        return model, summary

    straight, s1 = run(tmp_path / "straight")
    with dies_after_save(monkeypatch, step=2):
        run(tmp_path / "split", save_every=1)
    assert not (tmp_path / "split" / "model").exists()
    # another initialisation: what is trained must come from the checkpoint (with LoRA the frozen base is
    # the model the run started with)
    resumed, s2 = run(tmp_path / "split", seed=0 if lora else 123, resume=True)
    for (n, p1), p2 in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p1, p2), n
    a = [json.loads(ln) for ln in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(ln) for ln in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if not k.startswith("time/")} == {
            k: v for k, v in rb.items() if not k.startswith("time/")
        }
    for key in ("success_before", "success_after", "trained_tokens", "steps", "conversations"):
        assert s1[key] == s2[key], key


def test_sft_resume_refuses_other_data(tmp_path: Path, tokenizer: Any) -> None:
    opts: dict[str, Any] = dict(
        env_ids=[CALC], env_kwargs=KW, batch_size=2, steps=1, save_every=1, lr=1e-2, device="cpu",
        tensorboard=False, progress=False, eval_before=False, eval_episodes=1, max_new_tokens=2,
        output_dir=str(tmp_path),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(SFTConfig(episodes=2, resume=True, **opts), tiny_model(len(tokenizer)), tokenizer)
    train(SFTConfig(episodes=2, **opts), tiny_model(len(tokenizer)), tokenizer)
    with pytest.raises(ConfigError, match="other data"):
        train(SFTConfig(episodes=3, resume=True, **opts), tiny_model(len(tokenizer)), tokenizer)
