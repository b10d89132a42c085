"""EPO (trainers/epo.py): trajectory entropy, smoothing band, phase weight; numbers worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.trainers.epo import EntropyBand, epo_loss, phase_weight, smoothing_penalty, trajectory_entropy
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo


def test_trajectory_entropy_weighs_every_turn_once() -> None:
    # row 0: turn 0 tokens 1, 3 (mean 2), turn 1 token 6 (mean 6), a masked 9 -> (2 + 6) / 2 = 4
    # row 1: one turn, tokens 2, 2, 5 -> 3; a token-mean would give row 0 (1+3+6)/3 = 3.33 instead
    ent = torch.tensor([[1.0, 3.0, 6.0, 9.0], [2.0, 2.0, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    turns = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    assert trajectory_entropy(ent, mask, turns).tolist() == [4.0, 3.0]


def test_band_penalty_and_loss_by_hand() -> None:
    band = EntropyBand(kappa_low=0.75, kappa_high=1.25, window=2)
    assert band.band() is None
    for h in (2.0, 6.0, 4.0):
        band.update(h)
    # window 2: mean of 6 and 4 = 5 -> band [0.75 * 5, 1.25 * 5] = [3.75, 6.25]
    assert band.band() == (3.75, 6.25)
    cumulative = EntropyBand(kappa_low=0.5, kappa_high=2.0)  # window 0: every step (the paper's W_k)
    for h in (2.0, 6.0, 4.0):
        cumulative.update(h)
    assert cumulative.band() == (2.0, 8.0)  # mean 4
    assert smoothing_penalty(torch.tensor([3.0, 5.0, 7.0]), 3.75, 6.25).tolist() == [0.75, 0.0, 0.75]
    ent = torch.tensor([[1.0, 3.0, 6.0, 9.0], [2.0, 2.0, 5.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    turns = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    # H = [4, 3]; band [3.75, 6.25]: penalties [0, 0.75]; alpha 0.1, beta 2, weight 0.5, 4 rows in the minibatch:
    # -0.1 * ((4 + 3) - 2 * 0.5 * 0.75) / 4 = -0.1 * 6.25 / 4 = -0.15625
    loss, st = epo_loss(ent, mask, turns, rows=4, alpha=0.1, beta=2.0, weight=0.5, band=band.band())
    assert math.isclose(loss.item(), -0.15625, abs_tol=1e-6)
    assert st == {"entropy_sum": 7.0, "penalty_sum": 0.75, "rows": 2.0}
    loss.backward()
    assert ent.grad is not None and ent.grad[0, 3].item() == 0.0  # masked token: no gradient
    # row 0 inside the band: d/dH (-0.1 H) / 4 = -0.025, spread over its turn's tokens: turn 0 has 2 tokens
    # and weighs 1/2 of H -> -0.025 / 2 / 2 = -0.00625 per token
    assert math.isclose(ent.grad[0, 0].item(), -0.00625, rel_tol=1e-5)
    # row 1 below the band: d/dH -0.1 (H - 2 * 0.5 * relu(3.75 - H)) / 4 = -0.1 * (1 + 1) / 4 = -0.05, / 3 tokens
    assert math.isclose(ent.grad[1, 0].item(), -0.05 / 3, rel_tol=1e-5)


def test_above_the_band_the_push_cancels_at_beta_w_one_and_reverses_past_it() -> None:
    # one row, one turn, H = 7 above hi = 6.25: dL/dH = -alpha (1 - beta w) / rows
    for beta, want in ((1.0, 0.0), (3.0, 0.2)):
        ent = torch.tensor([[7.0]], requires_grad=True)
        loss, _ = epo_loss(ent, torch.ones(1, 1), torch.zeros(1, 1), 1, 0.1, beta, 1.0, (3.75, 6.25))
        loss.backward()
        assert ent.grad is not None and math.isclose(ent.grad.item(), want, abs_tol=1e-7)


def test_phase_weight_ramps_after_warmup() -> None:
    # steps 10, warmup 0.2: 0.1 through step 2, then linear to 1.0 at step 10 (step 6: 0.1 + 0.9 * 0.5)
    got = [round(phase_weight(s, 10, 0.1, 1.0, 0.2), 6) for s in (1, 2, 6, 10)]
    assert got == [0.1, 0.1, 0.55, 1.0]
    assert phase_weight(5, 10, 0.3, 1.0, 1.0) == 0.3


def test_inert_epo_options_warned() -> None:
    assert any("epo_alpha" in m for m in GRPOConfig(epo_alpha=0.5).inert_options())
    with pytest.raises(Exception, match="epo_window"):
        GRPOConfig(epo=True, epo_window=-1).validate()
    with pytest.raises(ValueError):
        EntropyBand(kappa_low=1.2, kappa_high=1.5)


@pytest.mark.slow
def test_train_with_epo_logs_entropy_band_and_weight(tmp_path: Path, tokenizer: Any) -> None:
    register_fake_env()
    cfg = GRPOConfig(steps=2, output_dir=str(tmp_path), epo=True, **SMALL)
    train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    recs = records(tmp_path)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for key in (
            "losses/epo_entropy",
            "losses/epo_band_low",
            "losses/epo_band_high",
            "losses/epo_phase_weight",
            "losses/epo_smooth_penalty",
        ):
            assert key in r, key
    # phase weight, steps 2 (warmup 0.2): step 1 p = 0.5 -> 0.1 + 0.9 * 0.3 / 0.8 = 0.4375; step 2 -> 1.0
    # step 1 has no history (the band is the step's own entropy); step 2's band is 0.5x..1.5x of step 1's
    h1 = recs[0]["losses/epo_entropy"]
    assert (
        h1 > 0
        and recs[1]["losses/epo_band_low"] == pytest.approx(0.5 * h1)
        and recs[1]["losses/epo_band_high"] == pytest.approx(1.5 * h1)
    )
    assert recs[0]["losses/epo_phase_weight"] == pytest.approx(0.4375) and recs[1][
        "losses/epo_phase_weight"
    ] == pytest.approx(1.0)


def test_ranks_keep_one_entropy_band() -> None:
    """Under torchrun each rank sums its own rows' entropies; `end_step(total=Dist.sum)` makes every rank record
    the step's entropy over all rows (a rank with no rows too), so the ranks' bands never drift apart."""
    from toolgym.trainers.addons import AddonState

    cfg = GRPOConfig(env_ids=["tests/VowelCount-v0"], epo=True, steps=4)
    ranks = [AddonState(cfg), AddonState(cfg)]
    for step in range(1, 4):
        for r in ranks:
            r.start_step(step)
        ranks[0]._sums = {"rows": 3.0, "entropy_sum": 3.0 * step, "penalty_sum": 0.3}
        ranks[1]._sums = {} if step == 2 else {"rows": 1.0, "entropy_sum": 5.0, "penalty_sum": 0.1}
        both = [dict(r._sums) for r in ranks]

        logged = []
        for r in ranks:
            keys = iter(("rows", "entropy_sum", "penalty_sum"))  # the order end_step reduces them in

            def total(value: float, keys: Any = keys, both: Any = both) -> float:  # Dist.sum over two ranks
                key = next(keys)
                return sum(s.get(key, 0.0) for s in both)

            m: dict[str, float] = {}
            r.end_step(m, total)
            logged.append(m)
        assert logged[0] == logged[1]
    assert ranks[0].band is not None and ranks[1].band is not None
    assert list(ranks[0].band.history) == list(ranks[1].band.history)
    assert list(ranks[0].band.history)[1] == 6.0 / 3.0  # step 2: rank 1 had no rows
