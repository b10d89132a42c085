"""Every estimator against numbers computed by hand on the 3-leaf tree of conftest.py.

Tree: P -> A -> T(tool) -> {B (R=1), C (R=0)}, P -> D (R=1). Rows (leaves B, C, D):
  row 0 tokens [1,2,3,4,5,6]    mask [0,0,1,1,0,1]
  row 1 tokens [1,2,3,4,5,7,8]  mask [0,0,1,1,0,1,1]
  row 2 tokens [1,2,9]          mask [0,0,1]
"""

from __future__ import annotations

import math

import pytest
import torch

from toolgym.trainers import advantages as adv
from toolgym.trainers import advantages_tree as adv_tree
from toolgym.trainers import advantages_turn as adv_turn
from toolgym.trainers.tree import RolloutTree, flatten, leaf_rewards

S = math.sqrt(1 / 3)  # unbiased std of [1, 0, 1]; (1 - 2/3) / S = S


def approx(x: object) -> object:
    return pytest.approx(x, abs=1e-4)


def test_grpo_z_score(tree3: RolloutTree) -> None:
    rows = flatten([tree3])
    a = adv.grpo(leaf_rewards([tree3], rows), [r.tree for r in rows], eps=0.0)
    assert a == approx([S, -2 * S, S])
    tok = adv.token_advantages(rows, adv.leaf_to_nodes([tree3], rows, a))
    assert tok[0] == approx([0, 0, S, S, 0, S])
    assert tok[1] == approx([0, 0, -2 * S, -2 * S, 0, -2 * S, -2 * S])
    assert tok[2] == approx([0, 0, S])


def test_grpo_shared_once_averages_the_prefix(tree3: RolloutTree) -> None:
    rows = flatten([tree3], shared="once")
    a = adv.grpo(leaf_rewards([tree3], rows), [0, 0, 0], eps=0.0)
    tok = adv.token_advantages(rows, adv.leaf_to_nodes([tree3], rows, a), shared="once")
    mean_a = (S - 2 * S) / 2  # node A is held by rows 0 and 1
    assert tok[0] == approx([0, 0, mean_a, mean_a, 0, S])
    assert tok[1] == approx([0, 0, 0, 0, 0, -2 * S, -2 * S])


def test_grpo_scales_and_eps() -> None:
    assert adv.grpo([1.0, 0.0, 1.0], [0, 0, 0], scale="none") == approx([1 / 3, -2 / 3, 1 / 3])
    assert adv.dr_grpo([1.0, 0.0, 1.0], [0, 0, 0]) == approx([1 / 3, -2 / 3, 1 / 3])
    # TRL's eps 1e-4 on the std
    assert adv.grpo([1.0, 0.0], [0, 0])[0] == approx(0.5 / (math.sqrt(0.5) + 1e-4))
    # batch scale: group means, one batch std (of [1, 0, 3, 5]: 2.2174)
    a = adv.grpo([1.0, 0.0, 3.0, 5.0], [0, 0, 1, 1], scale="batch", eps=0.0)
    assert a == approx([0.5 / 2.217356, -0.5 / 2.217356, -1 / 2.217356, 1 / 2.217356])
    # singleton group and zero-variance group give 0
    assert adv.grpo([1.0, 1.0, 1.0], [0, 1, 1]) == [0.0, 0.0, 0.0]


def test_rloo() -> None:
    assert adv.rloo([1.0, 0.0, 1.0], [0, 0, 0]) == approx([0.5, -1.0, 0.5])
    assert adv.rloo([1.0, 0.0, 4.0], [0, 0, 1]) == approx([1.0, -1.0, 0.0])


def test_tree_values_spo(tree3: RolloutTree) -> None:
    rows = flatten([tree3])
    # V is the mean over children (ALGORITHMS.md 5.3): B 1, C 0, D 1, T 1/2, A 1/2, P (1/2 + 1)/2 = 3/4 (the
    # mean over leaves gave P 2/3). A(A) = 1/2 - 3/4, A(B) = 1/2, A(C) = -1/2, A(D) = 1 - 3/4
    tok = adv.token_advantages(rows, adv_tree.tree_advantages([tree3], rows))
    assert tok[0] == approx([0, 0, -1 / 4, -1 / 4, 0, 0.5])
    assert tok[1] == approx([0, 0, -1 / 4, -1 / 4, 0, -0.5, -0.5])
    assert tok[2] == approx([0, 0, 1 / 4])


def test_tree_values_treerl(tree3: RolloutTree) -> None:
    rows = flatten([tree3])
    # LOO leaves: B 0.5, C -1, D 0.5 -> V: T = A = -0.25, P = 0
    # A: ((-0.25 - 0) + -0.25) / sqrt(2); B: ((0.5 + 0.25) + 0.5) / 1; C: ((-1 + 0.25) - 1); D: (0.5 + 0.5)
    na = adv_tree.tree_advantages([tree3], rows, style="treerl")
    assert na[0] == approx({1: -0.5 / math.sqrt(2), 3: 1.25})
    assert na[1] == approx({1: -0.5 / math.sqrt(2), 4: -1.75})
    assert na[2] == approx({5: 1.0})


def test_tree_of_depth_one_is_dr_grpo() -> None:
    t = RolloutTree("q", [1])
    for r in (1.0, 0.0, 0.0, 1.0):
        t.set_reward(t.add(t.root, "model", [2], turn=0), r)
    rows = flatten([t])
    na = adv_tree.tree_advantages([t], rows)
    assert [next(iter(d.values())) for d in na] == approx(adv.dr_grpo([1.0, 0.0, 0.0, 1.0], [0] * 4))


def test_gigpo(tree3: RolloutTree) -> None:
    rows = flatten([tree3])
    # A_E = R - mean = [1/3, -2/3, 1/3]. Step returns (gamma 0.5): row0 [0.5, 1], row1 [0, 0], row2 [1].
    # anchor s0: {0.5, 0, 1} mean 0.5 -> [0, -0.5, 0.5]; anchor s1: {1, 0} mean 0.5 -> [0.5, -0.5]
    na = adv_turn.gigpo([tree3], rows, omega=1.0, gamma=0.5)
    assert na[0] == approx({1: 1 / 3, 3: 1 / 3 + 0.5})
    assert na[1] == approx({1: -2 / 3 - 0.5, 4: -2 / 3 - 0.5})
    assert na[2] == approx({5: 1 / 3 + 0.5})
    # omega 0 is the episode level alone; mean_std_norm divides by the unbiased std
    assert adv_turn.gigpo([tree3], rows, omega=0.0)[2] == approx({5: 1 / 3})
    assert adv_turn.gigpo([tree3], rows, omega=0.0, mode="mean_std_norm")[2] == approx({5: S})


def test_igpo_joint_and_separate(tree3: RolloutTree) -> None:
    rewards = [[0.2, 1.0], [-0.2, 0.0], [1.0]]
    # joint: mean 0.4, population std sqrt(0.256)
    sd = math.sqrt(0.256)
    z = [(x - 0.4) / sd for x in (0.2, 1.0, -0.2, 0.0, 1.0)]
    a = adv_turn.igpo(rewards, [0, 0, 0], gamma=1.0, norm="joint")
    assert a[0] == approx([z[0] + z[1], z[1]])
    assert a[1] == approx([z[2] + z[3], z[3]])
    assert a[2] == approx([z[4]])
    # separate: IG {0.2, -0.2} -> {1, -1}; outcomes {1, 0, 1} -> {0.7071, -1.4142, 0.7071}; gamma 0.5
    b = adv_turn.igpo(rewards, [0, 0, 0], gamma=0.5, norm="separate")
    assert b == [
        approx([1 + 0.5 * 0.707107, 0.707107]),
        approx([-1 - 0.5 * 1.414214, -1.414214]),
        approx([0.707107]),
    ]
    rows = flatten([tree3])
    na = adv.turn_to_nodes([tree3], rows, a)
    assert na[1] == approx({1: z[2] + z[3], 4: z[3]})
    with pytest.raises(ValueError, match="model turns"):
        adv.turn_to_nodes([tree3], rows, [[1.0], [1.0], [1.0]])


def test_info_gain() -> None:
    assert adv_turn.info_gain([0.1, 0.4, 0.3]) == approx([0.3, -0.1])
    assert adv_turn.info_gain([0.1, 0.4], "log_prob_diff") == approx([math.log(4)])


def test_gae_skips_tool_tokens() -> None:
    mask = torch.tensor([[1, 1, 0, 1]])
    rewards = adv.terminal_rewards(mask, torch.tensor([1.0]))
    values = torch.tensor([[0.5, 0.6, 9.0, 0.8]])
    a, ret = adv.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert a[0].tolist() == approx([0.5, 0.4, 0.0, 0.2])
    assert ret[0].tolist() == approx([1.0, 1.0, 0.0, 1.0])  # Monte Carlo return with gamma = lam = 1
    a, _ = adv.gae(rewards, values, mask, gamma=0.5, lam=0.5)
    # t3: 1 - 0.8 = 0.2; t1: 0.5*0.8 - 0.6 + 0.25*0.2 = -0.15; t0: 0.5*0.6 - 0.5 + 0.25*(-0.15)
    assert a[0].tolist() == approx([-0.2375, -0.15, 0.0, 0.2])


def test_whiten_and_entropy_scaling() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert adv.masked_whiten(x, m)[0].tolist() == approx([-1.0, 0.0, 1.0, 0.0])
    a = torch.ones(1, 4)
    scaled = adv.entropy_scaled(a, x, m, alpha=0.2)
    assert scaled[0, :3].tolist() == approx([0.8, 1.0, 1.2])


def test_masked_whiten_computes_in_float32_for_bf16_advantages():
    """PPO whitens the advantages of a bf16 value head: the mean and std are float32 ones (a bf16 mean over
    thousands of tokens near 100 is off by a quantisation step), and so is the result."""
    torch.manual_seed(0)
    x = (100 + torch.randn(8, 512)).bfloat16()  # [B, T]
    m = torch.ones(8, 512)
    m[:, 400:] = 0
    out = adv.masked_whiten(x, m)
    assert out.dtype == torch.float32
    assert torch.equal(out, adv.masked_whiten(x.float(), m))
    assert adv.masked_whiten(x.double(), m).dtype == torch.float64  # wider stays wider


def test_igpo_with_a_scorer(tree3: RolloutTree, monkeypatch: pytest.MonkeyPatch) -> None:
    """P(gold) is 0.1 after the prompt (2 tokens) and 0.4 after the tool node (5 tokens): turn 0 of rows
    0 and 1 gains 0.3; last turns earn the outcome."""
    from toolgym.trainers import igpo as igpo_mod

    def fake_scores(
        model: object, prefixes: list[list[int]], gold: list[list[int]], pad: int, dev: object
    ) -> list[float]:
        assert all(g == [7, 7] for g in gold)
        return [math.log({2: 0.1, 5: 0.4}[len(p)]) for p in prefixes]

    class Renderer:
        def encode(self, text: str) -> list[int]:
            assert text == "<answer>42</answer>"
            return [7, 7]

    monkeypatch.setattr(igpo_mod, "gold_logprobs", fake_scores)
    tree3.meta["answer"] = "42"
    rows = flatten([tree3])
    got = igpo_mod.igpo_advantages(None, Renderer(), [tree3], rows, 0, torch.device("cpu"))
    want = adv.turn_to_nodes([tree3], rows, adv_turn.igpo([[0.3, 1.0], [0.3, 0.0], [1.0]], [0, 0, 0]))
    assert got == [approx(w) for w in want]
