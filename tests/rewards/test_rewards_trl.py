"""TRL's real GRPOTrainer, two steps on CPU with a tiny local model, toolgym rewards as ``reward_funcs``; the
rewards TRL logged must equal ours recomputed on the same completions."""

from __future__ import annotations

import functools
import math

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from toolgym.rewards import Rubric, exact_match, math_match, overlong_penalty, single_answer, tag_balance  # noqa: E402

WORDS = ["<answer>", "</answer>", "\\boxed{4}", "\\boxed{5}", "4", "5", "Paris", "Rome", "<think>", "</think>",
         "the", "is", "what", "capital", "of", "France", "2+2", "?", "user:", "assistant:"]  # fmt: skip
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = TEMPLATE
    return tok


def tiny_model(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.mark.slow
def test_grpo_trainer_logs_our_rewards(tmp_path) -> None:
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    rows = [
        {"prompt": [{"role": "user", "content": "what is 2+2 ?"}], "answer": "4"},
        {"prompt": [{"role": "user", "content": "what is the capital of France ?"}], "answer": "Paris"},
    ]
    dataset = datasets.Dataset.from_list(rows * 4)
    gold_by_prompt = {r["prompt"][0]["content"]: r["answer"] for r in rows}
    rubric = Rubric(
        {"em": exact_match, "one_answer": single_answer, "tags": tag_balance}, weights=[1.0, 0.1, 0.0]
    )
    overlong = functools.partial(overlong_penalty, max_length=12, buffer=6)
    funcs = [math_match, rubric, overlong]
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=12, max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none",
        save_strategy="no", temperature=1.5, seed=0, bf16=False, fp16=False, log_completions=False,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=funcs, args=args, train_dataset=dataset, processing_class=tok
    )
    trainer.train()

    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    assert len(completions) == 4 and isinstance(completions[0], list)  # conversational completions
    gold = [gold_by_prompt[p[-1]["content"]] for p in prompts]
    logged = {name: list(values) for name, values in trainer._logs["rewards"].items()}
    ours = {
        "math_match": math_match(completions, answer=gold),
        "rubric": rubric(completions, answer=gold),
    }
    for name, values in ours.items():
        expected = [math.nan if v is None else v for v in values]
        assert logged[name] == pytest.approx(expected, nan_ok=True), name
    steps = [h for h in trainer.state.log_history if "rewards/math_match/mean" in h]
    assert len(steps) == 2 and all(
        "rewards/rubric/mean" in h and "rewards/overlong_penalty/mean" in h for h in steps
    )
    assert any(
        k.startswith("rubric/") for h in trainer.state.log_history for k in h
    )  # per-part metrics logged
