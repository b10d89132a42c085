"""Regression tests of the second trainer review (shaping, seed methods, aggregation, LLDS, SPO values);
every expected number is worked out by hand in the test, never by re-running the code under test."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.trainers.table import VOCAB, Table, table_batch, table_forward
from toolgym.trainers.grpo import GRPOConfig, optimize


def approx(x: object) -> object:
    return pytest.approx(x, abs=1e-6)


def run_table(cfg: GRPOConfig, batch: Any, scale: float = 0.0) -> tuple[dict[str, float], torch.Tensor]:
    """One `optimize` step with SGD(lr = 1) on a zero table; returns the metrics and theta's change."""
    model = Table(batch.input_ids.shape[0], batch.input_ids.shape[1], scale)
    start = model.theta.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    metrics = optimize(cfg, 1, batch, model, model, opt, fwd=table_forward)
    return metrics, model.theta.detach() - start


def cfg_of(**kw: Any) -> GRPOConfig:
    base = dict(env_ids=["x"], device="cpu", grad_clip=0.0, is_mode="none", dual_clip=0.0, progress=False)
    return GRPOConfig(**{**base, **kw})


# ----- agg=constant: filtered rows neither step the optimizer nor count in the denominator ----------------
def test_constant_aggregation_skips_empty_minibatches_and_counts_trained_rows() -> None:
    # four one-token rows, the third filtered (loss mask 0); token 1 (id 1 mod 2 = 1), advantage 1
    batch = table_batch([[0, 1]] * 4, [[0, 1], [0, 1], [0, 0], [0, 1]], [[0, 1.0]] * 4)
    cfg = cfg_of(agg="constant", minibatches=4, micro_batch_rows=1, max_total_tokens=8)
    metrics, delta = run_table(cfg, batch)
    assert metrics["losses/updates"] == 3  # was 4: the filtered row's minibatch stepped with no gradient
    # one row per minibatch: loss = -A logp / (1 row * 8); theta moves by +A/8 (1[v = 1] - 1/2)
    assert delta[0, 1].tolist() == approx([-1 / 16, 1 / 16]) and delta[2].abs().sum() == 0
    # one minibatch: the denominator is 3 trained rows x 8 (was 4 rows x 8, shrinking with the filter)
    _, delta = run_table(cfg_of(agg="constant", max_total_tokens=8), batch)
    assert delta[0, 1].tolist() == approx([-1 / 48, 1 / 48])


def test_seq_mean_token_sum_is_the_mean_over_rows_of_row_sums() -> None:
    # row 0: two trained tokens (A = 1, 2); row 1: one (A = 3); row 2 filtered
    batch = table_batch(
        [[0, 1, 1], [0, 1, 0], [0, 1, 1]],
        [[0, 1, 1], [0, 1, 0], [0, 0, 0]],
        [[0, 1, 2], [0, 3, 0], [0, 5, 5]],
    )
    _, delta = run_table(cfg_of(agg="seq_mean_token_sum"), batch)
    # loss = -(1 logp01 + 2 logp02 + 3 logp11) / 2 rows: theta[r, t, 1] moves by A/2 * 1/2
    assert delta[:, :, 1].flatten().tolist() == approx([0, 0.25, 0.5, 0, 0.75, 0, 0, 0, 0])
    _, delta = run_table(cfg_of(agg="seq_mean"), batch)  # row means: (1 + 2)/2 and 3, over 2 rows
    assert delta[:, :, 1].flatten().tolist() == approx([0, 0.125, 0.25, 0, 0.75, 0, 0, 0, 0])
    assert VOCAB == 2
