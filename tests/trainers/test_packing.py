"""The packed update (trainers/packing.py) gives the padded path's logprobs, entropies, losses and gradients,
and the trainer's update step (`grpo.optimize`) moves the weights the same way packed or padded."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.trainers.conftest import tiny_model
from toolgym.trainers.batch import TrainBatch, forward
from toolgym.trainers.packing import ATTN, pack, packed_forward, update_forward

VOCAB = 97


def tiny_qwen2(seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # the q/k/v biases start at zero: make them count
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
    return model


def batch_of(lens: list[int], seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    B, T = len(lens), max(lens)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(3, VOCAB, (n,), generator=g)
        attn[i, :n] = 1
        mask[i, n // 2 : n] = 1.0  # the second half of each row is "model" tokens
    adv = torch.randn((B, T), generator=g) * attn
    roll = torch.randn((B, T), generator=g) * 0.1 - 2.0
    turns = torch.where(mask > 0, 0, -1)
    return TrainBatch(ids, attn, mask, adv, roll * mask, turns, torch.zeros(B), torch.zeros(B))


def test_pack_lays_rows_end_to_end() -> None:
    b = batch_of([9, 4, 13, 7])
    ids, pos, row, col, _ = pack(b)
    assert ids.shape == (1, 33) and pos[0, :9].tolist() == list(range(9))
    assert pos[0, 9:13].tolist() == [0, 1, 2, 3] and torch.equal(ids[0], b.input_ids[row, col])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_packed_and_padded_losses_and_gradients_are_equal(arch: str, entropy_grad: bool) -> None:
    model = tiny_model(VOCAB, seed=6) if arch == "llama" else tiny_qwen2(seed=6)
    batch = batch_of([9, 4, 13, 7])
    grads, outs = [], []
    for fn in (forward, packed_forward):
        model.zero_grad()
        logp, ent, _ = fn(model, batch, 0.7, entropy=True, entropy_grad=entropy_grad)
        assert ent is not None
        loss = -(logp * batch.advantages * batch.loss_mask).sum() / batch.loss_mask.sum()
        if entropy_grad:
            loss = loss - 0.1 * (ent * batch.loss_mask).sum()
        loss.backward()
        outs.append((loss.detach(), logp.detach() * batch.loss_mask, ent.detach() * batch.loss_mask))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (l1, p1, e1), (l2, p2, e2) = outs
    assert torch.allclose(l1, l2, atol=1e-5)
    assert torch.allclose(p1, p2, atol=1e-5) and torch.allclose(e1, e2, atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for n, g in grads[0].items():
        assert torch.allclose(g, grads[1][n], atol=1e-5), n
    # the model now runs our attention; padded calls (generation, the HF path) are unchanged by it
    assert model.config._attn_implementation == ATTN
    again, _, _ = forward(model, batch, 0.7)
    assert torch.allclose(again * batch.loss_mask, p1, atol=1e-6)


def test_small_chunks_and_no_grad_passes_change_nothing() -> None:
    model = tiny_model(VOCAB, seed=6)
    batch = batch_of([5, 11, 8], seed=2)
    a, _, _ = packed_forward(model, batch, 1.0, chunk=3)
    b, _, _ = packed_forward(model, batch, 1.0, chunk=4096)
    with torch.no_grad():
        c, _, _ = update_forward(True, chunk=2)(model, batch, 1.0)
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(b, c, atol=1e-6)
    assert update_forward(False) is forward


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_the_trainer_update_is_the_same_packed_or_padded(kl: float) -> None:
    from toolgym.trainers.grpo import GRPOConfig, optimize
    from toolgym.trainers.modeling import Reference

    cfg = GRPOConfig(
        env_ids=["x"], device="cpu", epochs=2, minibatches=2, micro_batch_rows=2, lr=1e-2, kl_coef=kl,
        entropy_coef=0.01, progress=False, tensorboard=False,
    )  # fmt: skip
    batch = batch_of([12, 5, 9, 16, 7], seed=3)
    base = tiny_model(VOCAB, seed=1)
    results = []
    for packing in (False, True):
        model = copy.deepcopy(base)
        ref = Reference(model) if kl else None
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        metrics = optimize(cfg, 1, batch, model, model, opt, ref=ref, fwd=update_forward(packing, chunk=5))
        results.append((metrics, dict(model.named_parameters())))
    (m1, w1), (m2, w2) = results
    assert m1["losses/updates"] == m2["losses/updates"] == 4
    for k in m1:
        if not k.startswith("time/"):
            assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-6), k
    for n, p in w1.items():
        assert torch.allclose(p, w2[n], atol=1e-5), n


# every decoder family transformers ships that builds tiny on CPU, with the options that change its logits:
# sliding windows shorter than the rows, Gemma2/3 attention and final soft-capping, Granite/Cohere logit scales
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 5}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "head_dim": 8, "sliding_window": 5, "final_logit_softcapping": 2.0, "attn_logit_softcapping": 3.0,
    }),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "head_dim": 8, "sliding_window": 5, "final_logit_softcapping": 2.0, "attn_logit_softcapping": 3.0,
        "layer_types": ["sliding_attention", "full_attention"],
    }),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 4.0}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.3}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "sliding_window": 6}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
}  # fmt: skip


def tiny_family(name: str, seed: int = 0) -> Any:
    import transformers

    conf, cls, extra = FAMILIES[name]
    cfg = getattr(transformers, conf)(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, **extra,
    )  # fmt: skip
    torch.manual_seed(seed)
    return getattr(transformers, cls)(cfg).eval()


def own_scores(model: Any, batch: TrainBatch, temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs and entropies [B, T] from the model's own `model(...).logits`."""
    with torch.no_grad():
        logits = (
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
            / temp
        )
    logp = logits.log_softmax(-1)
    lp = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.nn.functional.pad(lp, (1, 0)), torch.nn.functional.pad(ent, (1, 0))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_scoring_is_the_models_own_forward(family: str) -> None:
    from toolgym.trainers.packing import EXACT_FAMILIES

    model = tiny_family(family)
    assert model.config.model_type == family and family in EXACT_FAMILIES
    batch = batch_of([9, 4, 13, 7], seed=1)  # rows longer than the sliding windows
    want_lp, want_ent = own_scores(model, batch, 0.7)  # before our attention is switched on
    m = batch.loss_mask
    for share in (False, True):
        with torch.no_grad():
            lp, ent, _ = packed_forward(model, batch, 0.7, entropy=True, share=share)
        assert ent is not None
        assert torch.allclose(lp * m, want_lp * m, atol=2e-6), (family, share)
        assert torch.allclose(ent * m, want_ent * m, atol=2e-6), (family, share)
    # the model now runs our attention; its own padded forward (generation, the padded update) is unchanged
    assert model.config._attn_implementation == ATTN
    again_lp, _ = own_scores(model, batch, 0.7)
    real = batch.attention_mask  # (the scores at padded positions are anything)
    assert torch.allclose(again_lp * real, want_lp * real, atol=2e-6)


def test_packing_refuses_a_family_it_cannot_score_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from toolgym.errors import ConfigError
    from toolgym.trainers.packing import use_packing

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(ConfigError, match=r"model_type 'gpt2'.*packing: off"):
        packed_forward(model, batch_of([5, 3]))
    with pytest.raises(ConfigError, match="gpt2"):
        use_packing("on", model, torch.device("cuda"))
    assert use_packing("auto", model, torch.device("cuda")) is False  # the padded update, said on stderr
    assert "packing is off for model_type 'gpt2'" in capsys.readouterr().err
    assert use_packing("auto", tiny_model(VOCAB), torch.device("cuda")) is True


def test_packed_forward_also_scores_the_row_mask() -> None:
    """EPO with shared="once" reads the entropy of tokens another row trains (`TrainBatch.row_mask`)."""
    model = tiny_model(VOCAB, seed=2)
    batch = batch_of([9, 6, 11], seed=4)
    full = batch.attention_mask.float()
    full[:, 0] = 0.0
    batch = batch._replace(row_mask=full)  # every token but the first, beyond the loss mask's second halves
    with torch.no_grad():
        lp, ent, _ = packed_forward(model, batch, 1.0, entropy=True)
        want_lp, want_ent, _ = forward(model, batch, 1.0, entropy=True)
    assert ent is not None and want_ent is not None
    assert torch.allclose(lp * full, want_lp * full, atol=1e-5) and torch.allclose(
        ent * full, want_ent * full, atol=1e-5
    )


@pytest.mark.parametrize("family", ["gemma2", "mistral", "granite", "cohere"])
def test_packed_gradients_are_the_models_own(family: str) -> None:
    """The soft-capped eager attention, the sliding-window mask and the logit scales carry gradients too."""
    model = tiny_family(family).train()
    batch = batch_of([9, 4, 13, 7], seed=3)
    grads = []
    for fn in (forward, packed_forward):  # the padded pass first: the model's own attention
        model.zero_grad()
        logp, ent, _ = fn(model, batch, 0.7, entropy=True, entropy_grad=True)
        assert ent is not None
        m = batch.loss_mask
        loss = -(logp * batch.advantages * m).sum() / m.sum() - 0.1 * (ent * m).sum() / m.sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n, g in grads[0].items():
        assert torch.allclose(g, grads[1][n], atol=2e-5), (family, n)
