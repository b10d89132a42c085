"""Shared prefixes run once (trainers/prefix_share.py) give the unshared packed path's (and the padded path's)
logprobs, entropies, losses and gradients, on groups with different prompt lengths, partial and zero
shares, multi-turn rows and rows that share a trained model turn."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainers.conftest import tiny_model
from tests.trainers.test_packing import VOCAB, tiny_qwen2
from toolgym.errors import ConfigError
from toolgym.trainers.batch import TrainBatch, forward
from toolgym.trainers.packing import packed_forward, update_forward, use_share
from toolgym.trainers.prefix_share import share_layout

Seg = tuple[list[int], bool]  # ids, trained (model tokens)


def rand(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def rows_batch(rows: list[list[Seg]], seed: int = 0) -> TrainBatch:
    """Right-padded rows from (ids, trained) segments; advantages and rollout logprobs random."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(rows), max(sum(len(ids) for ids, _ in r) for r in rows)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    for i, r in enumerate(rows):
        t = 0
        for seg, trained in r:
            ids[i, t : t + len(seg)] = torch.tensor(seg)
            mask[i, t : t + len(seg)] = float(trained)
            t += len(seg)
        attn[i, :t] = 1
    adv = torch.randn((B, T), generator=g) * attn
    roll = (torch.randn((B, T), generator=g) * 0.1 - 2.0) * mask
    turns = torch.where(mask > 0, 0, -1)
    return TrainBatch(ids, attn, mask, adv, roll, turns, torch.zeros(B), torch.zeros(B))


def grouped_batch(seed: int = 0) -> TrainBatch:
    """Two groups (prompts of 20 and 24 tokens), a partial share (18 of the first prompt), a share below the
    minimum (10), an unshared row, a branched multi-turn row sharing a trained turn, and a duplicate row."""
    g = torch.Generator().manual_seed(seed)
    p1, p2 = rand(20, g), rand(24, g)
    turn, tool = rand(3, g), rand(4, g)
    multi = [(p1, False), (turn, True), (tool, False), (rand(5, g), True)]
    first = [(p1, False), (rand(6, g), True)]
    rows = [
        first,
        [(p1, False), (rand(9, g), True)],
        multi,
        [(p2, False), (rand(7, g), True)],
        [(p1[:18], False), (rand(8, g), True)],  # partial share, after another group
        [(p2, False), (rand(5, g), True)],
        [(p2[:10], False), (rand(10, g), True)],  # 10 < MIN_SHARE: its own tokens
        [(rand(12, g), False), (rand(4, g), True)],
        [(p1, False), (turn, True), (tool, False), (rand(4, g), True)],  # branched after a tool result
        first,  # a duplicate: every token shared
    ]
    return rows_batch(rows, seed)


def run(model: torch.nn.Module, fn: object, batch: TrainBatch, entropy_grad: bool) -> tuple:
    model.zero_grad()
    logp, ent, _ = fn(model, batch, 0.7, entropy=True, entropy_grad=entropy_grad)  # type: ignore[operator]
    assert ent is not None
    loss = -(logp * batch.advantages * batch.loss_mask).sum() / batch.loss_mask.sum()
    if entropy_grad:
        loss = loss - 0.1 * (ent * batch.loss_mask).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), logp.detach() * batch.loss_mask, ent.detach() * batch.loss_mask, grads


def test_layout_owns_each_prefix_once() -> None:
    batch = grouped_batch()
    lay = share_layout(batch.input_ids, batch.attention_mask)
    assert lay is not None
    real = int(batch.attention_mask.sum())
    # shared: rows 1, 2 (20 each), row 4 (18), row 5 (24), row 8 (27: prompt + turn + tool), row 9 (all 26)
    assert real - lay.keep.numel() == 20 + 20 + 18 + 24 + 27 + 26
    T = batch.input_ids.shape[1]
    flat_ids = batch.input_ids.view(-1)
    packed = flat_ids[lay.keep]
    real_at = batch.attention_mask.view(-1) > 0
    assert torch.equal(packed[lay.index[real_at]], flat_ids[real_at])  # every token reads its own id
    assert torch.equal(
        lay.keep[lay.index[real_at]] % T, torch.arange(T).repeat(len(batch.input_ids))[real_at]
    )
    assert (lay.index[~real_at] == lay.keep.numel()).all()


def test_no_shared_prefix_means_no_layout() -> None:
    g = torch.Generator().manual_seed(1)
    batch = rows_batch([[(rand(12, g), False), (rand(5, g), True)] for _ in range(3)])
    assert share_layout(batch.input_ids, batch.attention_mask) is None
    p = rand(15, g)  # 15 equal leading ids: one short of the minimum
    batch = rows_batch([[(p, False), (rand(5, g), True)] for _ in range(3)])
    assert share_layout(batch.input_ids, batch.attention_mask) is None
    assert share_layout(batch.input_ids, batch.attention_mask, min_share=15) is not None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_shared_unshared_and_padded_are_equal(arch: str, entropy_grad: bool) -> None:
    model = tiny_model(VOCAB, seed=6) if arch == "llama" else tiny_qwen2(seed=6)
    batch = grouped_batch(seed=3)
    padded = run(model, forward, batch, entropy_grad)
    plain = run(model, packed_forward, batch, entropy_grad)
    shared = run(model, update_forward(True, chunk=7, share=True), batch, entropy_grad)
    for other in (plain, shared):
        for a, b in zip(padded[:3], other[:3], strict=True):
            assert torch.allclose(a, b, atol=1e-5)
        assert padded[3].keys() == other[3].keys()
        for n, g in padded[3].items():
            assert torch.allclose(g, other[3][n], atol=1e-5), n


def test_no_grad_pass_and_unshared_batch_fall_back() -> None:
    model = tiny_model(VOCAB, seed=2)
    batch = grouped_batch(seed=4)
    with torch.no_grad():
        a, _, _ = packed_forward(model, batch, 1.0)
        b, _, _ = packed_forward(model, batch, 1.0, share=True)
    assert torch.allclose(a * batch.loss_mask, b * batch.loss_mask, atol=1e-5)
    g = torch.Generator().manual_seed(5)
    lone = rows_batch([[(rand(9, g), False), (rand(4, g), True)], [(rand(7, g), False), (rand(6, g), True)]])
    with torch.no_grad():
        c, _, _ = packed_forward(model, lone, 1.0)
        d, _, _ = packed_forward(model, lone, 1.0, share=True)
    assert torch.equal(c, d)


def test_the_trainer_update_is_the_same_shared_or_not() -> None:
    from toolgym.trainers.grpo import GRPOConfig, optimize
    from toolgym.trainers.modeling import Reference

    cfg = GRPOConfig(
        env_ids=["x"], device="cpu", epochs=2, minibatches=2, micro_batch_rows=3, lr=1e-2, kl_coef=0.05,
        entropy_coef=0.01, progress=False, tensorboard=False,
    )  # fmt: skip
    batch = grouped_batch(seed=5)
    base = tiny_model(VOCAB, seed=1)
    results = []
    for share in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        fwd = update_forward(True, chunk=5, share=share)
        metrics = optimize(cfg, 1, batch, model, model, opt, ref=Reference(model), fwd=fwd)
        results.append((metrics, dict(model.named_parameters())))
    (m1, w1), (m2, w2) = results
    for k in m1:
        if not k.startswith("time/"):
            assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-6), k
    for n, p in w1.items():
        assert torch.allclose(p, w2[n], atol=1e-5), n


def test_the_knob() -> None:
    from toolgym.trainers.grpo import GRPOConfig

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert use_share("auto", True, cpu) and not use_share("auto", True, cuda)
    assert use_share("on", True, cuda) and not use_share("off", True, cpu)
    assert not use_share("on", False, cpu)  # no packing, nothing to share
    assert GRPOConfig(env_ids=["x"], share_prefix="on").share_prefix == "on"
    with pytest.raises(ConfigError, match="share_prefix"):
        GRPOConfig(env_ids=["x"], share_prefix="yes")  # type: ignore[arg-type]
    cfg = GRPOConfig(env_ids=["x"], share_prefix="on", packing="off")
    assert any("share_prefix" in m for m in cfg.inert_options())
