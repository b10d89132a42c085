"""The trainer's algorithms beyond plain GRPO and PPO (docs/trainer.md), each against numbers worked out by hand in the test."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from toolgym.trainers import advantages as adv
from toolgym.trainers import advantages_tree as adv_tree
from toolgym.trainers import advantages_turn as adv_turn
from toolgym.trainers.grpo import GRPOConfig, credit
from toolgym.trainers.loss import (
    LossConfig,
    PolicyBatch,
    kl_penalty,
    policy_loss,
    read_stats,
    top_entropy_mask,
)
from toolgym.trainers.tree import RolloutTree, flatten


def approx(x: object) -> object:
    return pytest.approx(x, abs=1e-6)


OLD = torch.full((1, 3), math.log(0.5))
ADV = torch.tensor([[1.0, -1.0, 1.0]])


def batch(ratios: tuple[float, ...] = (1.5, 0.5, 1.1), **kw: Any) -> PolicyBatch:
    logp = (OLD + torch.tensor([list(ratios)]).log()).requires_grad_(True)
    return PolicyBatch(logp, OLD, ADV, torch.ones(1, 3), **kw)


# ----- loss options ---------------------------------------------------------------------------------------
def test_kl_estimators_k1_k2_k3_and_straight_through() -> None:
    """d = ref - logp = [ln 2, 0, -ln 2]: k1 = -d, k2 = d^2/2, k3 = e^d - d - 1."""
    logp = torch.zeros(1, 3, requires_grad=True)
    ref = torch.tensor([[math.log(2), 0.0, -math.log(2)]])
    ln2 = math.log(2)
    assert kl_penalty(logp, ref, "k1").tolist() == [approx([-ln2, 0.0, ln2])]
    assert kl_penalty(logp, ref, "k2").tolist() == [approx([ln2**2 / 2, 0.0, ln2**2 / 2])]
    assert kl_penalty(logp, ref, "k3").tolist() == [approx([2 - ln2 - 1, 0.0, 0.5 + ln2 - 1])]
    k3p = kl_penalty(logp, ref, "k3+")
    assert k3p.tolist() == [approx([1 - ln2, 0.0, ln2 - 0.5])]  # k3's value
    k3p.sum().backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == [approx([-ln2, 0.0, ln2])]  # k2's gradient: d(d^2/2)/dlogp = -d
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(logp, ref, "k9")
    b = batch()
    ref2 = b.logprobs.detach() + torch.tensor([[ln2, 0.0, -ln2]])
    loss, stats = policy_loss(b._replace(ref_logprobs=ref2), LossConfig(kl_coef=0.1, kl_estimator="k2"))
    stats = read_stats(stats)
    assert stats["kl_ref"] == approx(ln2**2 / 3)
    assert loss.item() == approx(-1.58 / 3 + 0.1 * ln2**2 / 3)


def test_cispo_clips_the_weight_not_the_gradient() -> None:
    """CISPO: L = -sg(min(r, eps_max)) A logp. Ratios [1.5, 0.5, 1.1], eps_max 1.2: weights [1.2, 0.5, 1.1];
    d L / d logp = -w A / 3 per token (every token keeps a gradient, the clipped one included)."""
    b = batch()
    loss, _ = policy_loss(b, LossConfig(objective="cispo", cispo_max=1.2))
    lp = b.logprobs.detach()[0].tolist()
    assert loss.item() == approx(-(1.2 * lp[0] - 0.5 * lp[1] + 1.1 * lp[2]) / 3)
    loss.backward()
    assert b.logprobs.grad is not None
    assert b.logprobs.grad[0].tolist() == approx([-1.2 / 3, 0.5 / 3, -1.1 / 3])


def test_two_sided_clip_caps_negative_advantages() -> None:
    """INTELLECT-2's delta caps the unclipped ratio: ratio 5 with A = -1 and delta 2 (no dual clip) -> 2."""
    loss, _ = policy_loss(batch((1.0, 5.0, 1.0)), LossConfig(dual_clip=None, delta=2.0))
    assert loss.item() == approx((-1.0 + 2.0 - 1.0) / 3)
    with pytest.raises(ValueError, match="delta"):
        LossConfig(delta=1.1)


def test_top_entropy_quantile_trains_only_high_entropy_tokens() -> None:
    """rho = 1/3 of [0.1, 0.9, 0.5] keeps token 1 only: its clipped term 0.8, denominator still 3 (TRL)."""
    ent = torch.tensor([[0.1, 0.9, 0.5]])
    assert top_entropy_mask(ent, torch.ones(1, 3), 1 / 3).tolist() == [[0.0, 1.0, 0.0]]
    loss, _ = policy_loss(batch(entropy=ent), LossConfig(top_entropy_quantile=1 / 3))
    assert loss.item() == approx(0.8 / 3)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(batch(), LossConfig(top_entropy_quantile=0.5))


# ----- estimators -----------------------------------------------------------------------------------------
def test_spo_std_normalised(tree3: RolloutTree) -> None:
    """V (mean over children): segment {A, T} 1/2, B 1, C 0, D 1, P (1/2 + 1)/2 = 3/4. Children of P:
    {1/2, 1}, population std 1/4; of T: {1, 0}, std 1/2. A: (1/2 - 3/4) / (1/4) = -1; D: (1 - 3/4) / (1/4)
    = 1; B: 1; C: -1 (each / (std + 1e-8))."""
    rows = flatten([tree3])
    na = adv_tree.tree_advantages([tree3], rows, style="spo_std")
    assert na[0] == approx({1: -0.25 / (0.25 + 1e-8), 3: 0.5 / (0.5 + 1e-8)})
    assert na[1] == approx({1: -0.25 / (0.25 + 1e-8), 4: -0.5 / (0.5 + 1e-8)})
    assert na[2] == approx({5: 0.25 / (0.25 + 1e-8)})


def test_treepo_sub_groups(tree3: RolloutTree) -> None:
    """Row B: depth 0 (all leaves {1, 0, 1}) 1 - 2/3; depth 1 (below A: {1, 0}) 1 - 1/2; depth 2 (B alone)
    skipped. average (1/3 + 1/2) / 2; group_size (1/3 * 3 + 1/2 * 2) / 5. Row D: depth 0 only: 1/3."""
    rows = flatten([tree3])
    assert adv_tree.treepo([tree3], rows) == approx([5 / 12, (-2 / 3 - 1 / 2) / 2, 1 / 3])
    assert adv_tree.treepo([tree3], rows, "group_size") == approx([2 / 5, (-2 - 1) / 5, 1 / 3])


def hgpo_tree() -> RolloutTree:
    """Three 2-turn chains with state keys (a, c), (b, c), (a, c); step reward 1 on row 0's second turn."""
    t = RolloutTree("q", [1])
    for first, step in (("a", 1.0), ("b", 0.0), ("a", 0.0)):
        m0 = t.add(t.root, "model", [2], turn=0, state_key=first)
        e = t.add(m0, "env", [3], turn=0)
        m1 = t.add(e, "model", [4], turn=1, state_key="c", step_reward=step)
        t.set_reward(m1, step)
    return t


def test_hgpo_blends_history_levels() -> None:
    """gamma 1: returns row 0 [1, 1], rows 1 and 2 [0, 0]. Turn 1, k = 1 (key (c)): {1, 0, 0} - 1/3 ->
    [2/3, -1/3, -1/3]; k = 2 (keys (a, c) for rows 0 and 2, (b, c) alone): [1/2, -, -1/2]. Weights
    (k + 1)^1: row 0 (2 * 2/3 + 3 * 1/2) / 5; row 1 -1/3 alone; row 2 (2 * -1/3 + 3 * -1/2) / 5.
    Turn 0, k = 1 (keys (a) rows 0, 2; (b) alone): [1/2, 0, -1/2] (k = 2 needs two states: skipped)."""
    t = hgpo_tree()
    rows = flatten([t])
    na = adv_turn.hgpo([t], rows, history=1, gamma=1.0, mode="mean_norm")
    m = [n.id for n in t.nodes if n.kind == "model"]  # m0, m1 per row in order
    assert na[0] == approx({m[0]: 0.5, m[1]: (4 / 3 + 1.5) / 5})
    assert na[1] == approx({m[2]: 0.0, m[3]: -1 / 3})
    assert na[2] == approx({m[4]: -0.5, m[5]: (-2 / 3 - 1.5) / 5})
    # mean_std_norm divides by the population std: k = 1, turn 1: sqrt(((2/3)^2 + 2 (1/3)^2) / 3) = sqrt(2)/3
    na = adv_turn.hgpo([t], rows, history=0, gamma=1.0, mode="mean_std_norm", eps=0.0)
    assert na[0][m[1]] == approx((2 / 3) / (math.sqrt(2) / 3))


def gigpo_invalid_tree(env_key: bool) -> RolloutTree:
    """Row 0: P -> turn 0 -> 'Invalid action' -> turn 1 (step 1). Row 1: P -> turn 0 -> 'ok' -> turn 1 ->
    'Invalid action' -> turn 2 (step 0). The same message at different depths and histories."""
    t = RolloutTree("q", [1], state_key="P")

    def turn(parent: int, k: int, key: str, step: float = 0.0) -> int:
        return t.add(parent, "model", [10 + k], turn=k, state_key=key, step_reward=step,
                     info={"env_key": env_key})  # fmt: skip

    a0 = turn(t.root, 0, "P")
    t.set_reward(turn(t.add(a0, "env", [5], turn=0), 1, "inv", 1.0), 1.0)
    b0 = turn(t.root, 0, "P")
    b1 = turn(t.add(b0, "env", [6], turn=0), 1, "ok")
    t.set_reward(turn(t.add(b1, "env", [5], turn=1), 2, "inv", 0.0), 0.0)
    return t


@pytest.mark.parametrize("env_key", [False, True])
def test_gigpo_anchor_key_is_turn_and_state(env_key: bool) -> None:
    """The 'inv' turns (row 0 turn 1, row 1 turn 2) are not one anchor group (they were): their step
    advantages are 0. Turn 0 (state P, both rows) is: gamma 1 returns 1 and 0 -> +-1/2."""
    t = gigpo_invalid_tree(env_key)
    rows = flatten([t])
    na = adv_turn.gigpo([t], rows, omega=1.0, gamma=1.0)
    a_e = [0.5, -0.5]  # episode level: R - mean of {1, 0}
    assert list(na[0].values()) == approx([a_e[0] + 0.5, a_e[0] + 0.0])
    assert list(na[1].values()) == approx([a_e[1] - 0.5, a_e[1] + 0.0, a_e[1] + 0.0])


def test_gigpo_similarity_mode_groups_near_identical_texts() -> None:
    """Two turn-0 states whose texts differ by one character (difflib ratio 0.94) form one group at
    threshold 0.9 and two at 0.95; returns 1 and 0 -> +-1/2 when grouped."""
    t = RolloutTree("q", [1])
    for text, step in (("room one has a red key", 1.0), ("room one has a red kay", 0.0)):
        leaf = t.add(
            t.root, "model", [2], turn=0, state_key=text, step_reward=step, info={"state_text": text}
        )
        t.set_reward(leaf, 0.0)
    rows = flatten([t])
    import difflib

    ratio = difflib.SequenceMatcher(None, "room one has a red key", "room one has a red kay").ratio()
    assert 0.9 <= ratio < 0.96
    assert [list(a.values()) for a in adv_turn.gigpo([t], rows, gamma=1.0, similarity=0.9)] == [
        approx([0.5]),
        approx([-0.5]),
    ]
    assert [list(a.values()) for a in adv_turn.gigpo([t], rows, gamma=1.0, similarity=0.99)] == [
        approx([0.0]),
        approx([0.0]),
    ]


def test_turn_gae_is_gae_over_turns() -> None:
    """Two turns: tokens [m m env m m], V at turn starts 0.2 and 0.6, reward 1 at the end, gamma = lam = 1:
    A_1 = 1 + 0 - 0.6 = 0.4; A_0 = 0 + 0.6 - 0.2 + 0.4 = 0.8; returns on first tokens A + V = 1, 1.
    Truncated (bootstrap 0.5): A_1 = 1 + 0.5 - 0.6 = 0.9, A_0 = 0.4 + 0.9 = 1.3."""
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    turns = torch.tensor([[0, 0, 0, 1, 1]])
    values = torch.tensor([[0.2, 9.0, 9.0, 0.6, 9.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    a, ret, vm = adv.turn_gae(rewards, values, mask, turns, 1.0, 1.0)
    assert a[0].tolist() == approx([0.8, 0.8, 0.0, 0.4, 0.4])
    assert ret[0].tolist() == approx([1.0, 0.0, 0.0, 1.0, 0.0])
    assert vm[0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    a, _, _ = adv.turn_gae(rewards, values, mask, turns, 1.0, 1.0, bootstrap=torch.tensor([0.5]))
    assert a[0].tolist() == approx([1.3, 1.3, 0.0, 0.9, 0.9])


# ----- filters --------------------------------------------------------------------------------------------
def group(rewards: list[float], episodes: list[dict[str, Any]]) -> RolloutTree:
    t = RolloutTree("q", [1])
    for r, ep in zip(rewards, episodes, strict=True):
        leaf = t.add(t.root, "model", [2], turn=0)
        t.set_reward(leaf, r)
        t.nodes[leaf].info["episode"] = {"success": r > 0.5, **ep}
    return t


def test_mask_truncated_completions_vs_remove_clip() -> None:
    """Rewards [1, 0, 1], the last truncated. mask_truncated_completions: its row leaves the loss but the
    group statistics keep it (mean 2/3); remove_clip: it is gone before the advantages ({1, 0}: +-1/2)."""
    eps = [{}, {}, {"truncated": True}]
    c = credit(GRPOConfig(estimator="dr_grpo", mask_truncated_completions=True), [group([1, 0, 1], eps)])
    assert c.keep == [True, True, False]
    assert [next(iter(a.values())) for a in c.node_adv] == approx([1 / 3, -2 / 3, 1 / 3])
    assert [a[1] for a in c.advantages] == approx([1 / 3, -2 / 3, 0.0])  # the filtered row trains nothing
    c = credit(GRPOConfig(estimator="dr_grpo", remove_clip=True), [group([1, 0, 1], eps)])
    assert len(c.rows) == 2 and [a[1] for a in c.advantages] == approx([0.5, -0.5])


def test_env_error_episodes_have_no_row() -> None:
    c = credit(GRPOConfig(estimator="dr_grpo"), [group([1, 0, 0], [{}, {}, {"truncation": "env_error"}])])
    assert len(c.rows) == 2 and [a[1] for a in c.advantages] == approx([0.5, -0.5])


def test_accuracy_filter() -> None:
    """SimpleTIR acc_filter 0.1_0.9: success rates 1 (dropped), 1/2 (kept)."""
    forest = [group([1, 1], [{}, {}]), group([1, 0], [{}, {}])]
    c = credit(
        GRPOConfig(estimator="dr_grpo", acc_filter_low=0.1, acc_filter_high=0.9, filter_zero_variance=False),
        forest,
    )
    assert c.keep == [False, False, True, True] and c.dropped["accuracy"] == 2


# ----- branching ------------------------------------------------------------------------------------------
def test_aepo_dynamic_split() -> None:
    """m = clip(int(k sigmoid(beta (H_root - H_tool))) + 1, 1, k): k 12, beta 0.5, H_root 1, H_tool 3 ->
    int(12 * 0.268941) + 1 = int(3.2273) + 1 = 4."""
    from toolgym.trainers.branching import TurnBoundaryEntropy

    t = RolloutTree("q", [1])
    a = t.add(t.root, "model", [2], turn=0, entropies=[1.0])
    t.add(t.add(a, "tool", [3], turn=0), "model", [4], turn=1, entropies=[3.0])
    assert 12 / (1 + math.exp(1.0)) == pytest.approx(3.2273, abs=1e-4)
    assert TurnBoundaryEntropy(dynamic_split=True).split_budget(t, 12) == 4


def test_fixed_segments_fork_every_s_tokens() -> None:
    """Chains of 3 turns x 3 tokens (tool nodes between): offset S = 4 lies at token 1 of turn 1."""
    from tests.trainers.test_branching import grow
    from toolgym.trainers.branching import FixedSegments

    t = grow(FixedSegments(initial=2, segment_tokens=4, n_children=1, iterations=1), budget=4)
    forks = [n for n in t.nodes if n.branch_reason == "segment"]
    assert len(t.leaves()) == 4 and len(forks) == 2
    for f in forks:
        cut = t.nodes[f.parent]  # type: ignore[index]
        assert cut.turn == 1 and len(cut.token_ids) == 1  # the prefix node holds 1 token of turn 1


def test_fixed_segments_fallback_on_short_paths() -> None:
    from tests.trainers.test_branching import grow
    from toolgym.trainers.branching import FixedSegments

    t = grow(FixedSegments(initial=1, segment_tokens=100, n_children=1, iterations=2), budget=3)
    forks = [n for n in t.nodes if n.branch_reason == "segment"]
    assert forks and all(t.nodes[f.parent].kind == "tool" for f in forks)  # type: ignore[index]


def test_dynamic_split_in_the_rollout_loop() -> None:
    """The fake policy's first turn has entropy 1, later turns 2: m = int(4 sigmoid(-0.5)) + 1 = 2."""
    from tests.trainers.conftest import register_fake_env
    from tests.trainers.test_rollout import FakePolicy
    from toolgym.trainers.branching import TurnBoundaryEntropy
    from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout

    register_fake_env()
    assert int(4 / (1 + math.exp(0.5))) + 1 == 2
    pol = TurnBoundaryEntropy(initial=4, dynamic_split=True, tau=1.0, entropy_weight=0.0, top_up=False)
    roller = TreeRollout(FakePolicy(), pol, RolloutConfig(budget=4, entropies=True), {})
    forest, _ = roller.run([RolloutTask("tests/VowelCount-v0", 3)], seed=0)
    roller.close()
    assert forest[0].meta["global_samples"] == 2
    assert len(forest[0].nodes[forest[0].root].children) == 2  # the probe path + 1 more global sample


def test_kl_in_reward_for_outcome_estimators() -> None:
    """verl's use_kl_in_reward with an outcome estimator: R_i - beta sum_t KL_t. Row 0: KLs 0.1, 0.2 on
    trained tokens (0.7 on a tool token does not count), beta 0.5 -> -0.15; row 1: 0.4 -> -0.2."""
    from toolgym.trainers.grpo import kl_reward

    kl = torch.tensor([[0.1, 0.7, 0.2], [0.4, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert kl_reward(kl, mask, 0.5).tolist() == approx([-0.15, -0.2])
    assert GRPOConfig(kl_coef=0.1, kl_in_reward=True).loss_config().kl_coef == 0.0  # not also in the loss
    assert any("kl_in_reward" in m for m in GRPOConfig(kl_in_reward=True).inert_options())
