"""HiPER's HAE (trainers/hiper.py): segments from <subgoal> tags, two-level returns and advantages by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.parsing import parse_command, parse_tags
from toolgym.trainers.grpo import GRPOConfig, credit
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.hiper import hae_from_parts, hae_gae, returns, segments, subgoal, switches
from toolgym.trainers.tree import RolloutTree


def test_subgoal_tag_is_found_and_envs_ignore_it() -> None:
    assert subgoal("<subgoal> heat the mug </subgoal>go to microwave 1") == "heat the mug"
    assert subgoal("go to sink 1") is None
    assert parse_command("<subgoal>heat the mug</subgoal> go to microwave 1").command == "go to microwave 1"
    assert parse_tags("<subgoal>add</subgoal><answer>5</answer>").answer == "5"


def test_segments_and_returns_by_hand() -> None:
    assert segments([True, False, False, True, False]) == [0, 0, 0, 1, 1]
    assert segments([False, False]) == [0, 0]
    # rewards [0, 1, 0, 2], segments [0, 0, 1, 1], gamma 0.5 (discount per turn, also across segments):
    # G^L: t3 = 2; t2 = 0 + 0.5 * 2 = 1; t1 = 1 + 0.5 * G^H_1 = 1 + 0.5 * 1 = 1.5; t0 = 0 + 0.5 * 1.5 = 0.75
    # G^H_1 = G^L_2 = 1; G^H_0 = G^L_0 = 0 + 0.5 * 1 + 0.25 * 0 + 0.125 * 2 = 0.75 (sum of gamma^(u-s_0) r_u)
    assert returns([0.0, 1.0, 0.0, 2.0], [0, 0, 1, 1], 0.5) == ([0.75, 1.0], [0.75, 1.5, 1.0, 2.0])


def test_a_repeated_subgoal_keeps_the_segment() -> None:
    # HiPER's KEEP copies the current subgoal; a turn without a tag keeps it too; a new text switches
    assert switches(["heat mug", "heat mug", None, "cool mug", "heat mug"]) == [
        True,
        False,
        False,
        True,
        True,
    ]
    assert switches([None, "a"]) == [False, True]  # turn 0 starts segment 0 anyway (segments())


def test_hae_gae_with_a_turn_critic_by_hand() -> None:
    # one row, 3 turns of 1 token each (turn ids 0, 1, 2), plans [T, F, T] -> segments [0, 0, 1].
    # rewards r = [0, 0, 1], values V = [0.5, 0.2, 0.4], gamma 1, lam 0.5, lam_seg 0.5, terminated (no bootstrap)
    # low: turn 2 (last of seg 1): delta = 1 + 0 - 0.4 = 0.6 -> A^L_2 = 0.6
    #      turn 1 (last of seg 0): delta = 0 + V_2 - 0.2 = 0.2, recursion restarts -> A^L_1 = 0.2
    #      turn 0: delta = 0 + V_1 - 0.5 = -0.3, A^L_0 = -0.3 + 1 * 0.5 * 0.2 = -0.2
    # high: seg 1 (turn 2): 1 + 0 - V_2 = 0.6 -> A^H_1 = 0.6
    #       seg 0 (turns 0-1, d = 2): 0 + 0 + 1^2 * V_2 - V_0 = -0.1, + 1^2 * 0.5 * 0.6 = 0.2 -> A^H_0 = 0.2
    # tokens: turn 0 = A^L_0 + A^H_0 = 0.0; turn 1 = 0.2; turn 2 = A^L_2 + A^H_1 = 1.2
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    turns = torch.tensor([[0, 1, 2, 2]])
    adv, ret, vmask = hae_gae(rewards, values, mask, turns, [[True, False, True]], 1.0, 0.5, 0.5)
    assert [round(x, 6) for x in adv[0].tolist()] == [0.0, 0.2, 1.2, 0.0]
    # critic targets: A^L_k + V_k on each turn's first token = [-0.2 + 0.5, 0.2 + 0.2, 0.6 + 0.4]
    assert [round(x, 6) for x in ret[0].tolist()] == [0.3, 0.4, 1.0, 0.0]
    assert vmask[0].tolist() == [1.0, 1.0, 1.0, 0.0]
    # a truncated row bootstraps after its last turn: V_next of turn 2 = 2.0 -> A^L_2 = 1 + 2 - 0.4 = 2.6
    adv_t, _, _ = hae_gae(
        rewards, values, mask, turns, [[True, False, True]], 1.0, 0.5, 0.5, torch.tensor([2.0])
    )
    assert round(float(adv_t[0, 2]), 6) == 5.2  # A^L_2 = 2.6 plus A^H_1 = 1 + 2 - 0.4 = 2.6


def test_hae_two_levels_by_hand() -> None:
    # one group, gamma 1. Row 0: turns [plan, plan], rewards [0, 1], R = 1 -> segments [0, 1], G^H = [1, 1],
    # G^L = [0 + G^H_1, 1] = [1, 1]. Row 1: [plan, exec], rewards [0, 0], R = 0 -> one segment, G^H = [0],
    # G^L = [0, 0]. A^E = R - 0.5 = [0.5, -0.5]. A^H: key segment 0 -> [1, 0] - 0.5 = [0.5, -0.5]; segment 1
    # held by row 0 only -> 0. A^L: key (seg 0, offset 0): [1, 0] - 0.5 = [0.5, -0.5]; (seg 1, 0) and
    # (seg 0, 1) held by one row -> 0.
    # Row 0: t0 = 0.5 + 0.5 + 0.5 = 1.5; t1 = 0.5 + 0 + 0 = 0.5.  Row 1: t0 = -1.5; t1 = -0.5 + 0 = -0.5.
    got = hae_from_parts([0, 0], [[0.0, 1.0], [0.0, 0.0]], [[True, True], [True, False]], [1.0, 0.0], 1.0)
    assert got == [[1.5, 0.5], [-1.5, -0.5]]
    # omega_high 2 doubles only the plan turns' A^H: row 0 t0 = 0.5 + 2 * 0.5 + 0.5 = 2.0
    got2 = hae_from_parts(
        [0, 0], [[0.0, 1.0], [0.0, 0.0]], [[True, True], [True, False]], [1.0, 0.0], 1.0, 2.0
    )
    assert got2[0][0] == 2.0 and got2[1] == [-2.0, -0.5]


def test_hiper_estimator_reads_subgoals_from_the_tree() -> None:
    t = RolloutTree("q", [1])
    for i, (texts, ok) in enumerate(
        ((["<subgoal>a</subgoal>x", "<subgoal>b</subgoal>y"], 1.0), (["<subgoal>a</subgoal>x", "z"], 0.0))
    ):
        a = t.add(t.root, "model", [10 + i], turn=0, info={"action": texts[0]})
        e = t.add(a, "tool", [5], turn=0)
        b = t.add(e, "model", [20 + i], turn=1, info={"action": texts[1]}, step_reward=ok)
        t.set_reward(b, ok)
    c = credit(GRPOConfig(env_ids=["e"], estimator="hiper", hiper_gamma=1.0), [t])
    # the same numbers as test_hae_two_levels_by_hand, on the two model tokens of each row
    assert [
        [a for a, m in zip(adv, r.loss_mask, strict=True) if m]
        for adv, r in zip(c.advantages, c.rows, strict=True)
    ] == [
        [1.5, 0.5],
        [-1.5, -0.5],
    ]


@pytest.mark.slow
def test_train_with_hiper(tmp_path: Path, tokenizer: Any) -> None:
    register_fake_env()
    cfg = GRPOConfig(steps=2, output_dir=str(tmp_path), estimator="hiper", **SMALL)
    train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    recs = records(tmp_path)
    assert [r["step"] for r in recs] == [1, 2] and all("charts/subgoal_fraction" in r for r in recs)
