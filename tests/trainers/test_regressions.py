"""Regression tests of eight confirmed trainer bugs (each test says which); every expected number is worked out by hand
in the test (literals or explicit arithmetic), never by re-running the code under test.

Trees are written out as P (prompt) -> model turns -> env/tool nodes; `chain` builds one unbranched
path, as independent sampling produces it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from toolgym.trainers import advantages as adv
from toolgym.trainers import advantages_tree as adv_tree
from toolgym.trainers import advantages_turn as adv_turn
from toolgym.trainers.grpo import GRPOConfig, credit
from toolgym.trainers.tree import RolloutTree, flatten


def approx(x: object) -> object:
    return pytest.approx(x, abs=1e-6)


def chain(t: RolloutTree, parent: int, turns: int, reward: float, first_turn: int = 0, **episode: Any) -> int:
    """`turns` model turns of one token each below `parent`, an env node between turns; returns the leaf."""
    node = parent
    for k in range(first_turn, first_turn + turns):
        if k > first_turn or t.nodes[parent].kind == "model":
            node = t.add(node, "env", [50 + k], turn=k - 1)
        node = t.add(node, "model", [10 + k], turn=k)
    t.set_reward(node, reward)
    t.nodes[node].info["episode"] = {"success": reward > 0.5, **episode}
    return node


def two_turn_group(rewards: list[float]) -> RolloutTree:
    t = RolloutTree("q", [1, 2])
    for r in rewards:
        chain(t, t.root, 2, r)
    return t


# ----- bug 1: tree estimators credit the whole segment between branch points ------------------------------
def test_bug1_unbranched_two_turn_group_gets_one_advantage_per_path() -> None:
    """SPO/TreeRL: every node of the segment between two branch points gets one advantage. A plain group
    (P -> m0 -> env -> m1 per path) is one segment per path, so both turns get the same credit."""
    t = two_turn_group([1.0, 0.0, 0.0, 1.0])
    rows = flatten([t])
    tok = adv.token_advantages(rows, adv_tree.tree_advantages([t], rows))
    # V(P) = 0.5, V(path) = R: A = R - 0.5 on both turns (was 0.0 on turn 1); rows: [P P m0 env m1]
    assert tok[0] == approx([0, 0, 0.5, 0, 0.5])
    assert tok[1] == approx([0, 0, -0.5, 0, -0.5])
    # TreeRL: leave-one-out rewards 1 - 1/3 = 2/3 and 0 - 2/3 = -2/3; V(P) = 0; one leaf below each
    # segment: ((2/3 - 0) + 2/3) / sqrt(1) = 4/3 on both turns (was 4/3 then 2/3)
    tok = adv.token_advantages(rows, adv_tree.tree_advantages([t], rows, style="treerl"))
    assert tok[0] == approx([0, 0, 4 / 3, 0, 4 / 3])
    assert tok[1] == approx([0, 0, -4 / 3, 0, -4 / 3])


def forked_at_first_tool() -> tuple[RolloutTree, dict[str, int]]:
    """P -> A (turn 0) -> T (tool) -> {B (1) -> env -> B2 (2), R=1 | C (1) -> env -> C2 (2), R=0};
    P -> D (turn 0) -> env -> D2 (1), R=1."""
    t = RolloutTree("q", [1])
    a = t.add(t.root, "model", [3], turn=0)
    tool = t.add(a, "tool", [4], turn=0)
    b2 = chain(t, tool, 2, 1.0, first_turn=1)
    c2 = chain(t, tool, 2, 0.0, first_turn=1)
    d2 = chain(t, t.root, 2, 1.0)
    return t, {"a": a, "tool": tool, "b2": b2, "c2": c2, "d2": d2}


def test_bug1_final_answer_turns_after_a_fork_get_credit() -> None:
    t, ids = forked_at_first_tool()
    rows = flatten([t])
    na = adv_tree.tree_advantages([t], rows)
    # V (mean over children): segment {A, T}: 1/2; {B, env, B2}: 1; {C, ...}: 0; {D, env, D2}: 1 -> P 3/4
    assert na[0][ids["a"]] == approx(0.5 - 3 / 4)
    assert na[0][ids["b2"]] == approx(1 - 0.5)  # the final answer turn (was 0.0)
    assert na[1][ids["c2"]] == approx(0 - 0.5)
    assert na[2][ids["d2"]] == approx(1 - 3 / 4)
    assert sorted(na[0].values()) == approx([-1 / 4, 0.5, 0.5])  # A; B and B2 share their segment


@pytest.mark.parametrize("estimator", ["tree", "spo_std", "treerl", "treepo"])
def test_bug1_class_every_tree_estimator_credits_later_turns(estimator: str) -> None:
    """No tree estimator leaves a turn of a path with a nonzero outcome spread at zero credit."""
    t = two_turn_group([1.0, 0.0, 0.0, 1.0])
    rows = flatten([t])
    tok = adv.token_advantages(rows, adv.estimate(estimator, [t], rows))
    for row, a in zip(rows, tok, strict=True):
        trained = [x for x, m in zip(a, row.loss_mask, strict=True) if m]
        assert len(trained) == 2 and trained[0] == trained[1] != 0.0


# ----- bug 3: sequence_mask must not give NaN --------------------------------------------------------------
def test_bug3_sequence_mask_in_log_space() -> None:
    """TRL's sequence_mask zeroes rows whose sequence IS ratio leaves [is_min, is_max]; a summed log ratio
    of 100 overflowed exp in float32 (inf * 0 = NaN). Row 0: log ratios 50 + 50 -> masked (weight 0);
    row 1: 0 -> weight 1. Loss = row 1's clipped term alone: ratio 1, A = 1 -> -1 per token, / 4 tokens."""
    from toolgym.trainers.loss import LossConfig, PolicyBatch, policy_loss, read_stats

    old = torch.zeros(2, 2)
    logp = torch.zeros(2, 2, requires_grad=True)
    rollout = torch.tensor([[-50.0, -50.0], [0.0, 0.0]])  # old - rollout = [[50, 50], [0, 0]]
    pb = PolicyBatch(logp, old, torch.ones(2, 2), torch.ones(2, 2), rollout_logprobs=rollout)
    loss, stats = policy_loss(pb, LossConfig(is_mode="sequence_mask", is_max=3.0))
    stats = read_stats(stats)
    assert loss.item() == approx(-2 / 4)
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
    assert logp.grad[0].tolist() == [0.0, 0.0] and logp.grad[1].tolist() == approx([-0.25, -0.25])
    assert (stats["is_min"], stats["is_max"]) == (0.0, 1.0)
    # truncate: the weight is capped at 3 -> row 0 contributes 3 * -1 per token
    loss, _ = policy_loss(
        pb._replace(logprobs=logp.detach()), LossConfig(is_mode="sequence_truncate", is_max=3.0)
    )
    assert loss.item() == approx((3 * -2 - 2) / 4)
    # token modes too: log ratio 100 on one token
    pb2 = PolicyBatch(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2),
                      rollout_logprobs=torch.tensor([[-100.0, 0.0]]))  # fmt: skip
    loss, _ = policy_loss(pb2, LossConfig(is_mode="token_mask", is_max=2.0))
    assert loss.item() == approx(-1 / 2)


# ----- bug 4: the zero-variance filter reads the produced advantages --------------------------------------
def three_equal_outcomes() -> RolloutTree:
    """Equal outcomes (R = 1 everywhere), but GiGPO step rewards differ at the shared first state s0."""
    t = RolloutTree("q", [1])
    for step in (1.0, 0.0, 0.5):
        leaf = t.add(t.root, "model", [2], turn=0, state_key="s0", step_reward=step)
        t.set_reward(leaf, 1.0)
        t.nodes[leaf].info["episode"] = {"success": True}
    return t


def test_bug4_zero_variance_filter_keeps_turn_level_signal() -> None:
    """DAPO drops groups that carry no gradient; with equal outcomes GiGPO's step level still differs:
    A_S = returns - mean = [1, 0, 0.5] - 0.5 = [0.5, -0.5, 0], so the group is kept (it was dropped)."""
    t = three_equal_outcomes()
    c = credit(GRPOConfig(estimator="gigpo", gigpo_gamma=0.5), [t])
    assert c.keep == [True, True, True]
    assert [a[1] for a in c.advantages] == approx([0.5, -0.5, 0.0])
    c = credit(GRPOConfig(estimator="grpo"), [three_equal_outcomes()])
    assert c.keep == [False, False, False] and c.dropped["zero_variance"] == 3


def test_bug4_igpo_group_with_equal_outcomes_is_kept() -> None:
    """IGPO turn rewards: info gains [0.5, -0.3, 0.1] then outcome 1 for all. Separate normalisation: IG
    mean 0.1, population std sqrt((0.16 + 0.16 + 0) / 3); outcomes z = 0 (std 0 -> 1)."""
    sd = math.sqrt(0.32 / 3)
    a = adv_turn.igpo([[0.5, 1.0], [-0.3, 1.0], [0.1, 1.0]], [0, 0, 0], norm="separate")
    assert a == [approx([0.4 / sd, 0.0]), approx([-0.4 / sd, 0.0]), approx([0.0, 0.0])]
    assert adv.advantage_keep(a, [0, 0, 0]) == [True, True, True]
    assert adv.advantage_keep([[0.0, 0.0]] * 3, [0, 0, 0]) == [False, False, False]


# ----- bug 5: shared="once" with a filter trains the shared node in a kept row ----------------------------
@pytest.mark.parametrize(
    "options,episode",
    [
        ({"filter_void": True}, {"void": True}),
        ({"mask_truncated_completions": True}, {"truncated": True}),
    ],
    ids=["void", "truncated"],
)
def test_bug5_shared_once_assigns_shared_nodes_to_a_kept_row(
    options: dict[str, Any], episode: dict[str, Any]
) -> None:
    """ARPO's "hard" attribution trains a shared node once with the mean advantage of the rows holding it.
    P -> A -> T -> {B (R=1), C (R=0)}; P -> D (R=1); row 0 (B) is filtered out, so A must be trained by
    row 1 (it was trained by nobody), with the mean over the kept rows holding it: row 1's alone."""
    t = RolloutTree("q", [1, 2])
    a = t.add(t.root, "model", [3, 4], turn=0)
    tool = t.add(a, "tool", [5], turn=0)
    for leaf_parent, tok, r, ep in (
        (tool, [6], 1.0, episode),
        (tool, [7, 8], 0.0, {}),
        (t.root, [9], 1.0, {}),
    ):
        leaf = t.add(leaf_parent, "model", tok, turn=1 if leaf_parent == tool else 0)
        t.set_reward(leaf, r)
        t.nodes[leaf].info["episode"] = {"success": r > 0, **ep}
    c = credit(GRPOConfig(shared="once", filter_zero_variance=False, **options), [t])
    assert c.keep == [False, True, True]
    assert [r.loss_mask for r in c.rows] == [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 1, 1], [0, 0, 1]]
    # rewards [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3); TRL eps 1e-4
    z_c = (0 - 2 / 3) / (math.sqrt(1 / 3) + 1e-4)
    assert c.advantages[1] == approx([0, 0, z_c, z_c, 0, z_c, z_c])


# ----- bug 6: GAE bootstraps at truncation, not at termination --------------------------------------------
def test_bug6_gae_bootstraps_truncated_rows() -> None:
    """Time-limit truncation is not the end of the return: GAE's last delta is r + gamma V(s_T) - V(s_{T-1}).
    V = 0.5 everywhere, no reward, gamma = lam = 1: truncated -> every delta is 0 (was -0.5);
    terminated -> the last delta is -0.5 and it carries back to every model token."""
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 1]])
    values = torch.full((2, 4), 0.5)
    rewards = torch.zeros(2, 4)
    bootstrap = torch.tensor([0.5, 0.0])  # row 0 truncated (value after its last token), row 1 terminated
    a, ret = adv.gae(rewards, values, mask, 1.0, 1.0, bootstrap)
    assert a[0].tolist() == approx([0.0, 0.0, 0.0, 0.0])
    assert a[1].tolist() == approx([-0.5, -0.5, 0.0, -0.5])
    assert ret[0].tolist() == approx([0.5, 0.5, 0.0, 0.5])


def test_bug6_forward_keeps_the_value_after_the_last_token(tokenizer: Any) -> None:
    from tests.trainers.conftest import tiny_model
    from toolgym.trainers.batch import collate, final_values, forward
    from toolgym.trainers.modeling import value_head
    from toolgym.trainers.tree import Row

    model = tiny_model(len(tokenizer))
    head = value_head(model)
    torch.nn.init.normal_(head.weight)
    rows = [Row(0, 1, (0, 1), [5, 6, 7], [0, 1, 1], [0, 1, 1], [-1, 0, 0], [0.0] * 3, [0.0] * 3),
            Row(0, 2, (0, 2), [5, 9], [0, 1], [0, 2], [-1, 0], [0.0] * 2, [0.0] * 2)]  # fmt: skip
    batch = collate(rows, [[0.0] * 3, [0.0] * 2], [0.0, 0.0], [True, True], pad_id=0, truncated=[True, False])
    assert batch.truncated.tolist() == [1.0, 0.0]
    _, _, values = forward(model, batch, value_head=head)
    assert values is not None and values.shape == (2, 4)
    hidden = model(input_ids=batch.input_ids[:1], output_hidden_states=True).hidden_states[-1][0]  # [T, H]
    want = head(hidden[2]).item()  # the state after all 3 tokens of row 0
    assert final_values(values, batch.attention_mask).tolist()[0] == pytest.approx(want, abs=1e-5)
    hidden1 = model(input_ids=batch.input_ids[1:, :2], output_hidden_states=True).hidden_states[-1][0]
    assert final_values(values, batch.attention_mask).tolist()[1] == pytest.approx(
        head(hidden1[1]).item(), abs=1e-5
    )


# ----- bug 7: several optimizer steps per batch; inert options warn -----------------------------------------
def test_bug7_inert_options_are_named() -> None:
    msgs = GRPOConfig(llds_coef=0.2, aepo_clip=True).inert_options()
    assert any("llds_coef" in m and "aepo_clip" in m and "inert" in m for m in msgs)
    assert not any("llds_coef" in m for m in GRPOConfig(llds_coef=0.2, minibatches=2).inert_options())
    assert not GRPOConfig().inert_options()  # the defaults are quiet
    assert any("shared=once" in m for m in GRPOConfig(shared="once").inert_options())
    assert any("kl_estimator" in m for m in GRPOConfig(kl_estimator="k1").inert_options())
    assert any("eps_high" in m for m in GRPOConfig(objective="cispo", eps_high=0.3, epochs=2).inert_options())
    with pytest.warns(UserWarning, match="llds_coef"):
        from toolgym.trainers.grpo import warn_inert

        warn_inert(GRPOConfig(llds_coef=0.2))


# ----- bug 8: ARPO/AEPO entropies are normalised by ln|V| -------------------------------------------------
class FixedU:
    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def test_bug8_turn_entropy_is_normalised_by_the_vocabulary() -> None:
    """ARPO divides round entropies by ln|V|. H(first turn) = 1, H(after the tool) = 3.5 nats, |V| = 49152,
    w = 0.2, tau = 0.5, no consecutive penalty: dH = 2.5 / ln(49152) = 0.231427, p = U + 0.046285.
    U = 0.46 forks (0.506 >= 0.5), U = 0.45 does not (0.496); unnormalised (2.5 nats) both fork."""
    from toolgym.trainers.branching import TurnBoundaryEntropy

    def tree() -> tuple[RolloutTree, int]:
        t = RolloutTree("q", [1])
        a = t.add(t.root, "model", [2], turn=0, entropies=[1.0])
        e = t.add(a, "tool", [3], turn=0)
        return t, t.add(e, "model", [4], turn=1, entropies=[3.5])

    cfg = GRPOConfig(branching="turn_entropy", branch_kwargs={"consecutive_penalty": 0.0})
    pol = cfg.branch_policy(vocab_size=49152)
    assert isinstance(pol, TurnBoundaryEntropy) and pol.vocab_size == 49152
    assert 0.2 * 2.5 / math.log(49152) == pytest.approx(0.046285, abs=1e-6)
    for u, forks in ((0.46, 1), (0.45, 0)):
        t, b = tree()
        assert len(pol.on_turns(t, [b], 4, FixedU(u))) == forks  # type: ignore[arg-type]
    raw = GRPOConfig(branching="turn_entropy", branch_kwargs={"consecutive_penalty": 0.0}).branch_policy()
    t, b = tree()
    assert len(raw.on_turns(t, [b], 4, FixedU(0.45))) == 1  # type: ignore[arg-type]


def test_bug8_the_trainer_passes_the_model_vocabulary(tokenizer: Any) -> None:
    from tests.trainers.conftest import tiny_model
    from toolgym.trainers.grpo import vocab_size

    model = tiny_model(len(tokenizer))
    assert vocab_size(model) == len(tokenizer)


# ----- also weak: engine logprobs under top-p are those of the distribution actually sampled ------------------
def test_top_p_logprob_is_under_the_sampled_nucleus(tokenizer: Any) -> None:
    """With top_p < 1 the engine samples from the renormalised nucleus; its logprob must be
    log p(x) - log(mass kept), not log p(x) of the full softmax (TIS would correct for the wrong thing)."""
    from tests.trainers.conftest import tiny_model
    from toolgym.agents.hf import HFPolicy
    from toolgym.agents.policy import SamplingParams

    model = tiny_model(len(tokenizer))
    policy = HFPolicy(model, tokenizer)
    prompt = [5, 6, 7]
    gen = policy.generate([prompt], SamplingParams(temperature=1.0, top_p=0.3, max_new_tokens=1, seed=1))[0]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)  # [V]
    p = logp.exp().sort(descending=True).values
    kept = float(p[(p.cumsum(0) - p) < 0.3].sum())  # the nucleus: tokens until 0.3 of the mass is reached
    assert gen.logprobs[0] == pytest.approx(logp[gen.token_ids[0]].item() - math.log(kept), abs=1e-4)
    assert kept < 1.0
