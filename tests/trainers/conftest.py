"""Shared small trees for the trainer tests (numbers written out in the tests)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.testing_env import VOWEL_COUNT, register
from toolgym.trainers.tree import RolloutTree


def three_leaf_tree() -> RolloutTree:
    """P[1,2] -> A[3,4] (turn 0, s0) -> T[5] (tool) -> B[6] (turn 1, s1, r=1) | C[7,8] (turn 1, s1, r=0)
    P -> D[9] (turn 0, s0, step reward 1, r=1). Ids: P0 A1 T2 B3 C4 D5; leaves B, C, D with R = 1, 0, 1."""
    t = RolloutTree("q0", [1, 2])
    a = t.add(t.root, "model", [3, 4], turn=0, state_key="s0", logprobs=[-0.1, -0.2])
    tool = t.add(a, "tool", [5], turn=0)
    b = t.add(tool, "model", [6], turn=1, state_key="s1", step_reward=1.0, logprobs=[-0.3])
    c = t.add(tool, "model", [7, 8], turn=1, state_key="s1", logprobs=[-0.4, -0.5])
    d = t.add(t.root, "model", [9], turn=0, state_key="s0", step_reward=1.0, logprobs=[-0.6])
    for leaf, r in ((b, 1.0), (c, 0.0), (d, 1.0)):
        t.set_reward(leaf, r)
    return t


@pytest.fixture
def tree3() -> RolloutTree:
    return three_leaf_tree()


# ----- a tiny random Llama with a locally built tokenizer, and the fake env of tests/testing_env.py ----------
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
FAKE_ENV = VOWEL_COUNT  # two turns, rewards that vary with every token: tests/testing_env.py
register_fake_env = register


def tiny_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["system user assistant tool <tool_call> <answer>2146</answer> aeiou"], trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = CHATML
    return hf


def tiny_model(vocab: int, seed: int = 0, head_dim: int = 8) -> object:
    """A random 2-layer Llama of 4 heads of `head_dim` (64: a shape our engine's GPU kernels decode)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=4 * head_dim, intermediate_size=8 * head_dim, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="session")
def tokenizer() -> object:
    return tiny_tokenizer()


def capture_selfplay_rollers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The `SelfPlayRollout`s `grpo.train` builds from now on (for tests that look inside them afterwards)."""
    from toolgym.trainers import grpo

    seen: list[Any] = []
    original = grpo.SelfPlayRollout

    def roller(*args: Any, **kwargs: Any) -> Any:
        seen.append(original(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(grpo, "SelfPlayRollout", roller)
    return seen


def rows_gap(rows: list[Any], model: Any) -> tuple[float, int]:
    """(the worst gap between a trained token's sampled logprob and ``model``'s teacher-forced one over its
    row, tokens checked)."""
    import torch

    worst, checked = 0.0, 0
    for row in rows:
        ids = torch.tensor([row.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits.float()[0, :-1], -1)
        want = logp.gather(-1, ids[0, 1:, None])[:, 0]
        for t in range(1, len(row.token_ids)):
            if row.loss_mask[t]:
                worst = max(worst, abs(float(want[t - 1]) - row.logprobs[t]))
                checked += 1
    return worst, checked


def rows_exact(rows: list[Any], model: Any) -> int:
    """Every trained token's logprob, recomputed by ``model`` from its row's own context, is the sampled one."""
    worst, checked = rows_gap(rows, model)
    assert worst < 1e-3, worst
    return checked


def fail_turn_once(engine: Any, at: int, error: type[Exception] | None = None) -> dict[str, Any]:
    """``engine.step`` raises ``error`` at its ``at``-th call; ``None`` (or ``TurnFailed``): one turn is lost,
    taken out of the batch first and named by the ``TurnFailed``, as a server backend does; what failed is
    recorded."""
    from toolgym.agents.episode_loop import TurnFailed

    original = engine.step
    seen: dict[str, Any] = {"n": 0, "seq": None}

    def step() -> list[Any]:
        seen["n"] += 1
        if seen["n"] == at:
            if error is not None and error is not TurnFailed:
                raise error("injected engine fault")
            seq = (engine.active or engine.queue)[0]
            engine.cancel(seq)
            exc = TurnFailed("injected: this turn is lost")
            exc.seq = seen["seq"] = seq
            raise exc
        return original()

    engine.step = step
    return seen
