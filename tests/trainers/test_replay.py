"""Success replay and task selection (trainers/replay.py): numbers worked out by hand in each test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.errors import ConfigError
from toolgym.trainers.grpo import GRPOConfig, credit
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.replay import SuccessBuffer, TaskSelector
from toolgym.trainers.tree import RolloutTree, flatten


def group(
    uid: str, seed: int, successes: list[bool], prompt: list[int] | None = None, base: int = 10
) -> RolloutTree:
    """A task's group: one two-turn chain per rollout (tokens base+i, 5, base+10+i); reward 1 on success."""
    t = RolloutTree(uid, prompt or [1, 2])
    t.meta.update(env_id="e", seed=seed)
    for i, ok in enumerate(successes):
        a = t.add(t.root, "model", [base + i], turn=0, logprobs=[-0.5], info={"action": "a"})
        e = t.add(a, "tool", [5], turn=0)
        b = t.add(e, "model", [base + 10 + i], turn=1, logprobs=[-0.7], step_reward=float(ok))
        t.nodes[b].info["episode"] = {"success": ok, "episode_reward": float(ok)}
        t.set_reward(b, float(ok))
    return t


def test_all_failed_group_gets_the_buffered_success() -> None:
    buf = SuccessBuffer(per_task=2)
    assert buf.add([group("q", 7, [False, True, False], base=50)]) == 1  # stored: tokens 51, 5, 61
    failed = group("q", 7, [False, False, False])  # tokens 10/20, 11/21, 12/22
    [new] = buf.inject([failed])
    rows = flatten([new])
    # the last failure (12, 22) is replaced by the buffered success (51, 61); the group keeps 3 rows
    assert [r.token_ids for r in rows] == [[1, 2, 10, 5, 20], [1, 2, 11, 5, 21], [1, 2, 51, 5, 61]]
    assert [bool(new.nodes[r.leaf].info.get("replayed")) for r in rows] == [False, False, True]
    # the replayed row keeps the behaviour policy's logprobs (the TIS weight corrects against them)
    assert rows[2].logprobs == [0.0, 0.0, -0.5, 0.0, -0.7]
    assert failed.nodes[failed.leaves()[-1]].token_ids == [22]  # the input tree is left as it was
    # GRPO's group now has signal: rewards [0, 0, 1] -> mean 1/3, unbiased std sqrt(1/3) = 0.57735:
    # (0 - 1/3) / 0.57735 = -0.577 and (1 - 1/3) / 0.57735 = 1.155
    c = credit(GRPOConfig(env_ids=["e"]), [new])
    assert c.rewards == [0.0, 0.0, 1.0]
    assert [round(adv[-1], 3) for adv in c.advantages] == [-0.577, -0.577, 1.155] and all(c.keep)


def test_no_replay_when_a_rollout_succeeded_or_the_prompt_differs() -> None:
    buf = SuccessBuffer()
    buf.add([group("q", 7, [True])])
    mixed = group("q", 7, [False, True])
    assert buf.inject([mixed])[0] is mixed
    other = group("q", 7, [False, False], prompt=[1, 3])  # a different rendering: never replayed
    assert buf.inject([other])[0] is other
    unknown = group("q", 8, [False, False])
    assert buf.inject([unknown])[0] is unknown


def test_replayed_success_is_drawn_uniformly_from_the_task_buffer() -> None:
    buf = SuccessBuffer(per_task=8, seed=3)
    for base in (50, 70):  # two stored successes of task 7: tokens 50/60 and 70/80
        buf.add([group("q", 7, [True], base=base)])
    picked = set()
    for _ in range(40):  # P(one of the two never drawn in 40 draws) = 2 * 0.5**40
        [new] = buf.inject([group("q", 7, [False, False])])
        picked.add(flatten([new])[-1].token_ids[2])
    assert picked == {50, 70}


def test_buffer_keeps_the_newest_per_task_and_not_replays() -> None:
    buf = SuccessBuffer(per_task=1)
    buf.add([group("q", 7, [True, True])])
    assert len(buf) == 1  # two successes, one kept
    [new] = buf.inject([group("q", 7, [False, False])])
    assert buf.add([new]) == 0  # a replayed success is not stored again
    with pytest.raises(ValueError):
        SuccessBuffer(per_task=0)


def test_task_selector_drops_always_and_never_solved_then_refreshes() -> None:
    s = TaskSelector(["e"], seed=0, pool=4, refresh=3)
    assert [t.seed for t in s.draw(4, step=1)] == [0, 1, 2, 3]
    buf = SuccessBuffer()
    # seed 0: 2/2 solved (drop); seed 1: 0/2 (drop); seed 2: 1/2 (keep); seed 3: 0/2 but buffered (keep)
    buf.add([group("b", 3, [True])])
    s.observe([group("a", 0, [True, True]), group("b", 1, [False, False]), group("c", 2, [True, False]),
               group("d", 3, [False, False])], step=1, buffer=buf)  # fmt: skip
    assert s.rate[("e", 2)] == 0.5
    assert [t.seed for t in s.draw(4, step=2)] == [2, 3, 2, 3]
    assert s.metrics(2)["rollout/active_tasks"] == 2.0
    # refresh = 3: dropped at step 1, back at step 4
    assert [t.seed for t in s.draw(4, step=4)] == [0, 1, 2, 3]


def test_task_selector_gives_way_when_every_task_is_dropped() -> None:
    s = TaskSelector(["e"], seed=0, pool=2, refresh=100)
    s.observe([group("a", 0, [True]), group("b", 1, [True])], step=1)
    assert [t.seed for t in s.draw(3, step=2)] == [0, 1, 0]


def test_config_checks_and_warnings() -> None:
    with pytest.raises(ConfigError):
        GRPOConfig(task_pool=-1).validate()
    with pytest.raises(ConfigError):
        GRPOConfig(replay_per_task=0).validate()
    msgs = GRPOConfig(replay=True, task_filter_refresh=5).inert_options()
    assert any("replay without task_pool" in m for m in msgs)
    assert any("task_filter_refresh: inert" in m for m in msgs)


@pytest.mark.slow
def test_train_with_replay_and_task_selection(tmp_path: Path, tokenizer: Any) -> None:
    register_fake_env()
    cfg = GRPOConfig(
        steps=2, output_dir=str(tmp_path), replay=True, task_pool=3, task_filter_refresh=1, **SMALL
    )
    metrics = train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    for key in (
        "rollout/replay_buffer_size",
        "rollout/replay_replaced_groups",
        "rollout/active_tasks",
        "rollout/measured_tasks",
    ):
        assert key in metrics, key
    assert metrics["rollout/replay_buffer_size"] >= 1  # the fake env succeeds often
    assert [r["step"] for r in records(tmp_path)] == [1, 2]


@pytest.mark.parametrize("name", ["replay", "epo", "hiper"])
def test_addon_yaml_configs_load(name: str) -> None:
    from toolgym.trainers.config import load_yaml

    data = load_yaml(Path(__file__).parents[2] / "trainers" / "configs" / f"addon_{name}.yaml")
    assert data.pop("algorithm") == "grpo"
    cfg = GRPOConfig.from_dict(data)
    assert cfg.replay or cfg.epo or cfg.estimator == "hiper"
    assert not [m for m in cfg.inert_options() if "inert" in m and name in m]
