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
