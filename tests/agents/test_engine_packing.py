"""The packed update path (trainers/packing.py) gives the padded path's logprobs, losses and gradients."""

from __future__ import annotations

from typing import Any

import torch

from toolgym.trainers.batch import TrainBatch, forward
from toolgym.trainers.packing import pack, packed_forward


def _batch(vocab: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    lens = [9, 4, 13, 7]
    B, T = len(lens), max(lens)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(5, vocab, (n,), generator=g)
        attn[i, :n] = 1
        mask[i, n // 2 : n] = 1.0  # the second half of each row is "model" tokens
    adv = torch.randn((B, T), generator=g)
    zeros = torch.zeros((B, T))
    return TrainBatch(ids, attn, mask, adv, zeros, torch.full((B, T), -1), torch.zeros(B), torch.zeros(B))


def test_pack_lays_rows_end_to_end() -> None:
    b = _batch(50)
    ids, pos, row, col = pack(b)
    assert (
        ids.shape == (1, 33)
        and pos[0, :9].tolist() == list(range(9))
        and pos[0, 9:13].tolist() == [0, 1, 2, 3]
    )
    assert torch.equal(ids[0], b.input_ids[row, col])


def test_packed_and_padded_losses_and_gradients_are_equal(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=6)
    batch = _batch(len(chatml_tokenizer))
    grads = []
    outs = []
    for fn in (forward, packed_forward):
        model.zero_grad()
        logp, ent, _ = fn(model, batch, 0.7, entropy=True)
        loss = -(logp * batch.advantages * batch.loss_mask).sum() / batch.loss_mask.sum()
        loss.backward()
        outs.append((loss.detach(), logp.detach() * batch.loss_mask, ent.detach() * batch.loss_mask))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (l1, p1, e1), (l2, p2, e2) = outs
    assert torch.allclose(l1, l2, atol=1e-5)
    assert torch.allclose(p1, p2, atol=1e-5) and torch.allclose(e1, e2, atol=1e-5)
    for n, g in grads[0].items():
        assert torch.allclose(g, grads[1][n], atol=1e-5), n


def test_small_chunks_change_nothing(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    model = make_tiny_model(len(chatml_tokenizer), seed=6)
    batch = _batch(len(chatml_tokenizer))
    a, _, _ = packed_forward(model, batch, 1.0, chunk=3)
    b, _, _ = packed_forward(model, batch, 1.0, chunk=4096)
    assert torch.allclose(a, b, atol=1e-6)
