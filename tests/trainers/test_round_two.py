"""Regression tests of the second trainer review (shaping, add-ons, aggregation, LLDS, SPO values);
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


# ----- shaping: filtered on the outcome, added in reward units (never scaled by the group's std) ---------
def one_turn_group(rewards: list[float], tokens: list[int] | None = None, uid: str = "q") -> Any:
    """P[1, 2] -> one model token per rollout (step reward 0); the episode records its length in tokens."""
    from toolgym.trainers.tree import RolloutTree

    t = RolloutTree(uid, [1, 2])
    for i, r in enumerate(rewards):
        leaf = t.add(t.root, "model", [10 + i], turn=0, state_key="s", step_reward=0.0)
        t.set_reward(leaf, r)
        t.nodes[leaf].info["episode"] = {"success": r > 0.5, "tokens": (tokens or [0] * len(rewards))[i]}
    return t


def row_advantages(cfg: GRPOConfig, forest: list[Any]) -> tuple[list[float], list[bool]]:
    """Each row's advantage on its model token (the last token) and its keep flag."""
    from toolgym.trainers.grpo import credit

    c = credit(cfg, forest)
    return [a[-1] for a in c.advantages], c.keep


def test_kl_in_reward_is_not_blown_up_by_an_all_failed_group() -> None:
    import math

    from toolgym.trainers.grpo import KL_SHAPING

    failed = one_turn_group([0.0, 0.0, 0.0, 0.0])
    for leaf, kl in zip(failed.leaves(), [1.0, 2.0, 3.0, 4.0], strict=True):
        failed.nodes[leaf].info[KL_SHAPING] = -0.001 * kl  # -kl_coef * the row's summed token KL
    mixed = one_turn_group([1.0, 0.0, 1.0, 0.0], uid="m")
    cfg = GRPOConfig(kl_coef=0.001, kl_in_reward=True)
    adv, keep = row_advantages(cfg, [failed, mixed])
    # DAPO filters on the outcome: the all-failed group goes (it was kept and z-scored to +-1.16)
    assert keep == [False] * 4 + [True] * 4
    z = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # GRPO: (R - 0.5) / (unbiased std sqrt(1/3) + 1e-4)
    assert adv[4:] == approx([z, -z, z, -z])
    # without the filter the group trains on its shaping alone, in reward units: -0.001 KL centred on the
    # group mean -0.0025 (whatever kl_coef, the z-score made it about +-1)
    adv, _ = row_advantages(
        GRPOConfig(kl_coef=0.001, kl_in_reward=True, filter_zero_variance=False), [failed]
    )
    assert adv == approx([0.0015, 0.0005, -0.0005, -0.0015])


def test_overlong_shaping_keeps_its_scale_in_every_group() -> None:
    import math

    # max_total_tokens 100, buffer 20, factor 0.1: a 100-token episode loses 0.1, a 50-token one nothing
    opts = dict(max_total_tokens=100, overlong_buffer=20, overlong_factor=0.1)
    solved = one_turn_group([1.0, 1.0, 1.0, 1.0], tokens=[100, 50, 50, 50])
    adv, keep = row_advantages(GRPOConfig(**opts), [solved])
    assert keep == [False] * 4  # equal outcomes: DAPO drops the group (it was kept: the shaping differed)
    adv, _ = row_advantages(GRPOConfig(filter_zero_variance=False, **opts), [solved])
    # the penalty centred on the group mean -0.025 (was z-scored to -1.5, three times a real failure)
    assert adv == approx([-0.075, 0.025, 0.025, 0.025])
    mixed = one_turn_group([1.0, 0.0, 1.0, 0.0], tokens=[100, 50, 50, 50])
    adv, _ = row_advantages(GRPOConfig(**opts), [mixed])
    z = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert adv == approx([z - 0.075, -z + 0.025, z + 0.025, -z + 0.025])


@pytest.mark.parametrize(
    "estimator", ["hgpo", "gigpo", "hiper", "rloo", "tree", "treerl", "spo_std", "dr_grpo"]
)
def test_every_estimator_applies_overlong_and_kl_shaping(estimator: str) -> None:
    """HGPO read only step rewards, so overlong shaping and the KL in reward did nothing there (unwarned).
    A group with equal outcomes and equal step rewards: the estimators give 0, the shaping stays."""
    from toolgym.trainers.grpo import KL_SHAPING

    opts = dict(
        max_total_tokens=100, overlong_buffer=20, overlong_factor=0.1, kl_coef=0.01, kl_in_reward=True
    )
    t = one_turn_group([1.0, 1.0], tokens=[100, 50])
    t.nodes[t.leaves()[1]].info[KL_SHAPING] = -0.02  # row 1: -0.01 x KL 2
    cfg = GRPOConfig(estimator=estimator, filter_zero_variance=False, **opts)
    assert not [m for m in cfg.inert_options() if "overlong" in m or "kl_in_reward" in m]
    adv, _ = row_advantages(cfg, [t])
    # shaping -0.1 and -0.02, mean -0.06: -0.04 and +0.04
    assert adv == approx([-0.04, 0.04])


# ----- EPO x shared=once: a row's trajectory entropy is the mean over all its turns ----------------------
def test_epo_trajectory_entropy_reads_every_turn_of_a_row_with_shared_once() -> None:
    from toolgym.trainers.addons import AddonState
    from toolgym.trainers.batch import collate
    from toolgym.trainers.grpo import credit
    from toolgym.trainers.tree import RolloutTree

    # P[1, 2] -> A[3] (turn 0) -> env[4] -> B[5] (turn 1, R 1) | C[6] (turn 1, R 0)
    t = RolloutTree("q", [1, 2])
    a = t.add(t.root, "model", [3], turn=0)
    env = t.add(a, "env", [4], turn=0)
    for tok, r in ((5, 1.0), (6, 0.0)):
        leaf = t.add(env, "model", [tok], turn=1)
        t.set_reward(leaf, r)
        t.nodes[leaf].info["episode"] = {"success": r > 0}
    cfg = GRPOConfig(shared="once", branching="turn_entropy", epo=True, epo_alpha=0.1)
    c = credit(cfg, [t])
    assert [r.loss_mask for r in c.rows] == [[0, 0, 1, 0, 1], [0, 0, 0, 0, 1]]  # A is trained by row 0 only
    batch = collate(c.rows, c.advantages, c.rewards, c.keep, 0, None, c.turn_masks)
    assert batch.turn_mask().tolist() == [[0, 0, 1, 0, 1], [0, 0, 1, 0, 1]]
    ent = torch.tensor([[0, 0, 2.0, 0, 1.0], [0, 0, 2.0, 0, 1.0]])  # A: 2, B and C: 1
    addons = AddonState(cfg)
    addons.start_step(1)
    loss = addons.epo_term(torch.tensor(0.0), ent, batch, 2)
    # H = mean over turns of the turn's mean entropy: (2 + 1) / 2 = 1.5 for both rows (row 1 read 1.0:
    # only the turn it trains); step 1 has no band: loss = -alpha (1.5 + 1.5) / 2 rows
    assert addons._sums["entropy_sum"] == approx(3.0)
    assert float(loss) == approx(-0.1 * 1.5)


# ----- replay x KL in reward: a replayed leaf is shaped like its siblings ----------------------------------
@pytest.mark.slow
def test_replayed_leaves_get_the_kl_shaping(tmp_path: Any, tokenizer: Any, monkeypatch: Any) -> None:
    from tests.trainers.conftest import register_fake_env, tiny_model
    from tests.trainers.test_train import SMALL
    from toolgym.trainers import grpo
    from toolgym.trainers.addons import AddonState

    register_fake_env()
    before, credit = AddonState.before_credit, grpo.credit
    seen: list[list[Any]] = []

    def forced(self: AddonState, forest: list[Any], step: int, metrics: dict[str, float]) -> list[Any]:
        # step 1: the first rollout of each task succeeds (buffered); step 2: every rollout fails (replayed)
        for t in forest:
            for i, leaf in enumerate(t.leaves()):
                ok = step == 1 and i == 0
                t.nodes[leaf].info["episode"] |= {"success": ok, "episode_reward": float(ok)}
                t.set_reward(leaf, float(ok))
        return before(self, forest, step, metrics)

    def recording(cfg: Any, forest: list[Any], scorer: Any = None) -> Any:
        seen.append(forest)
        return credit(cfg, forest, scorer)

    monkeypatch.setattr(AddonState, "before_credit", forced)
    monkeypatch.setattr(grpo, "credit", recording)
    opts = dict(SMALL, prompts_per_step=1, kl_coef=0.5, kl_in_reward=True, replay=True, task_pool=1)
    grpo.train(
        grpo.GRPOConfig(steps=2, output_dir=str(tmp_path), **opts), tiny_model(len(tokenizer)), tokenizer
    )
    tree = seen[-1][0]
    replayed = [lf for lf in tree.leaves() if tree.nodes[lf].info.get("replayed")]
    fresh = [lf for lf in tree.leaves() if not tree.nodes[lf].info.get("replayed")]
    assert len(replayed) == 1 and tree.nodes[replayed[0]].reward == 1.0  # the outcome, unshaped
    # the policy moved in step 1, so every path has a KL to the reference: the replayed one too (it had none)
    assert all(tree.nodes[lf].info.get(grpo.KL_SHAPING, 0.0) < 0 for lf in replayed + fresh)


# ----- LLDS: no firing on the rounding noise of the old-logprob pass -------------------------------------
def test_llds_does_not_fire_before_the_first_update() -> None:
    def noisy(model: Any, mb: Any, *args: Any, **kwargs: Any) -> Any:
        logp, ent, v = table_forward(model, mb, *args, **kwargs)
        # the eval-mode pass of the old logprobs is 3e-7 higher: the rounding of another batch layout
        return (logp if model.training else logp + 3e-7), ent, v

    batch = table_batch(
        [[0, 1, 1]] * 4, [[0, 1, 1]] * 4, [[0, 1.0, 0.5], [0, -1.0, 0.5], [0, 2.0, 0], [0, 0, 1]]
    )
    deltas = []
    for llds in (0.0, 0.2):
        cfg = cfg_of(minibatches=2, llds_coef=llds)
        model = Table(4, 3, scale=0.3, seed=1)
        start = model.theta.detach().clone()
        optimize(cfg, 1, batch, model, model, torch.optim.SGD(model.parameters(), lr=1.0), fwd=noisy)
        deltas.append(model.theta.detach() - start)
    # the first minibatch's rows (the loop's order: randperm of the step's generator) move as without LLDS
    # (each row has its own logits, so the other minibatch's step does not touch them); before, LLDS saw a
    # drop of 3e-7 and added 0.2 x the full gradient of -logp on every token with A >= 0
    first = torch.randperm(4, generator=torch.Generator().manual_seed(0 * 100_003 + 1))[:2]
    assert torch.equal(deltas[0][first], deltas[1][first])


def test_llds_max_passes_half_the_gradient_at_a_tie_as_the_official_code() -> None:
    from toolgym.trainers.loss import llds_penalty

    # two tokens of one turn, A >= 0: token 0 dropped by 0.5 (gate on), token 1 exactly unchanged
    logp = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])
    pen = llds_penalty(logp, old, torch.ones(1, 2), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.long))
    pen.sum().backward()
    assert pen.tolist() == [[0.5, 0.0]] and logp.grad is not None
    assert logp.grad.tolist() == [[-1.0, -0.5]]  # torch.maximum at the tie: half (clamp passed -1)
