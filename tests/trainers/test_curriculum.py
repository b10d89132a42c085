"""Curricula (trainers/curriculum.py): levels, promotion and demotion worked out by hand, the GRPO hook, the
the add-ons' task selection, reasoning-gym's levels, and a CPU smoke run of the shipped configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL, records
from toolgym.errors import ConfigError
from toolgym.trainers.config import load_yaml
from toolgym.trainers.curriculum import Curriculum, CurriculumConfig, CurriculumHook, parse
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.replay import TaskSelector
from toolgym.trainers.rollout import RolloutTask
from toolgym.trainers.tree import RolloutTree

CALC = "toolgym/Calculator-v0"
CONFIGS = Path(__file__).parents[2] / "trainers" / "configs"


def played(env_id: str, seed: int, successes: list[bool]) -> RolloutTree:
    """A tree as TreeRollout leaves it: one leaf per rollout with its episode record."""
    t = RolloutTree(f"{env_id}#{seed}", [1, 2])
    t.meta.update(env_id=env_id, seed=seed)
    for ok in successes:
        leaf = t.add(t.root, "model", [3], turn=0)
        t.nodes[leaf].info["episode"] = {"success": ok, "episode_reward": float(ok)}
        t.set_reward(leaf, float(ok))
    return t


def calc_curriculum(**kw: Any) -> Curriculum:
    cfg = CurriculumConfig(
        knobs={"digits": [2, 3, 4, 5], "num_ops": [1, 2, 3]}, window=4, min_episodes=4, promote_at=0.75,
        demote_at=0.25, **kw,
    )  # fmt: skip
    return Curriculum(cfg, [CALC], {"prompt_format": "text"})


def test_knobs_advance_together_like_global_levels() -> None:
    cfg = CurriculumConfig(knobs={"digits": [2, 3, 4, 5], "num_ops": [1, 2, 3]})
    assert cfg.level_kwargs(CALC, {}) == [
        {"digits": 2, "num_ops": 1}, {"digits": 3, "num_ops": 2}, {"digits": 4, "num_ops": 3},
        {"digits": 5, "num_ops": 3},
    ]  # fmt: skip


def test_a_level_id_makes_the_env_at_that_level() -> None:
    cur = calc_curriculum()
    track = cur.tracks[CALC]
    [task] = cur.assign([RolloutTask(CALC, 7)])
    assert task == RolloutTask(track.ids[0], 7)
    env = gym.make(track.ids[2], prompt_format="text")  # the run's env_kwargs still apply on top
    env.reset(seed=0)
    data = env.unwrapped.task.data
    assert (data["digits"], data["num_ops"]) == (4, 3) and env.unwrapped.prompt_format == "text"


def test_promote_at_p_demote_at_q_with_a_fresh_window() -> None:
    cur = calc_curriculum()
    track = cur.tracks[CALC]
    l0, l1 = track.ids[0], track.ids[1]
    cur.observe([played(l0, 1, [True, True, False])])  # 3 episodes < min_episodes 4: stays
    assert track.level == 0
    tree = played(l0, 2, [True])  # 4 episodes, 3 successes: 0.75 >= 0.75 -> level 1
    cur.observe([tree])
    assert track.level == 1 and track.seen == 0 and not track.recent and track.moves == 1
    assert tree.meta["env_id"] == CALC and tree.meta["curriculum_level"] == 0  # its own id back
    cur.observe([played(l0, 3, [False] * 8)])  # a level-0 (review) group is no evidence for level 1
    assert track.level == 1 and track.seen == 0
    cur.observe([played(l1, 4, [True, False, False, False])])  # 0.25 <= 0.25 -> back to level 0
    assert track.level == 0 and track.moves == 2
    cur.observe([played(l0, 5, [True, True, False, False])])  # 0.5: between q and p, stays
    assert track.level == 0
    m = cur.metrics()
    assert m == {"curriculum/level": 0.0, "curriculum/success": 0.5, "curriculum/moves": 2.0}


def test_top_and_bottom_levels_hold() -> None:
    cur = calc_curriculum(start_level=3)
    track = cur.tracks[CALC]
    cur.observe([played(track.ids[3], 1, [True] * 4)])
    assert track.level == 3 and track.moves == 0
    low = calc_curriculum()
    low.observe([played(low.tracks[CALC].ids[0], 1, [False] * 4)])
    assert low.tracks[CALC].level == 0


def test_replayed_and_env_error_leaves_are_not_counted() -> None:
    cur = calc_curriculum()
    tree = played(cur.tracks[CALC].ids[0], 1, [True, True, True, True])
    leaves = tree.leaves()
    tree.nodes[leaves[0]].info["replayed"] = True
    tree.nodes[leaves[1]].info["episode"]["truncation"] = "env_error"
    cur.observe([tree])
    assert cur.tracks[CALC].seen == 2 and cur.tracks[CALC].level == 0


def test_review_draws_lower_levels() -> None:
    cur = calc_curriculum(start_level=2, review=0.5)
    ids = cur.tracks[CALC].ids
    drawn = [t.env_id for t in cur.assign([RolloutTask(CALC, s) for s in range(400)])]
    assert set(drawn) == set(ids[:3])
    # half stay at level 2; the other half split evenly over levels 0 and 1 (binomial sd of 200 draws ~ 10)
    assert 160 < drawn.count(ids[2]) < 240 and 60 < drawn.count(ids[0]) < 140


def test_a_move_clears_task_selection_of_that_env() -> None:
    sel = TaskSelector([CALC], seed=0, pool=4, refresh=100)
    cfg = GRPOConfig(
        env_ids=[CALC], env_kwargs={}, output_dir="unused",
        curriculum={"knobs": {"digits": [2, 3]}, "window": 2, "min_episodes": 2},
    )  # fmt: skip
    hook = CurriculumHook(cfg, sel)
    tasks = hook.assign(sel.draw(2, step=1))
    forest = [played(t.env_id, t.seed, [True, True]) for t in tasks]
    hook.observe(forest)  # 4 successes: level 1; the trees carry the selector's own ids again
    sel.observe(forest, step=1)
    assert {(t.meta["env_id"], t.meta["seed"]) for t in forest} == {(t.env_id, t.seed) for t in sel.tasks[:2]}
    assert len(sel.dropped_at) == 2  # all solved: dropped ...
    hook.observe([played(hook.cur.tracks[CALC].ids[1], 9, [False, False])])  # type: ignore[union-attr]
    assert sel.dropped_at == {} and sel.rate == {}  # ... until a move: measured at another level


def test_config_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="exactly one of"):
        parse({"knobs": {"digits": [2]}, "levels": [{"digits": 2}]})
    with pytest.raises(ConfigError, match="promote_at"):
        GRPOConfig(env_ids=[CALC], curriculum={"knobs": {"digits": [2, 3]}, "promote_at": 0.1})
    with pytest.raises(ConfigError, match="unknown_key"):
        parse({"knobs": {"digits": [2]}, "unknown_key": 1})
    with pytest.raises(ConfigError, match="remove them from env_kwargs"):
        Curriculum(parse({"knobs": {"digits": [2, 3]}}), [CALC], {"digits": 4})
    with pytest.raises(ConfigError, match="not among"):
        Curriculum(parse({"knobs": {"digits": [2]}, "env_ids": ["toolgym/Search-v0"]}), [CALC], {})


def test_reasoning_gym_levels_are_its_global_levels() -> None:
    pytest.importorskip("reasoning_gym")
    env_id = "toolgym/ReasoningGym-chain_sum-v0"
    cur = Curriculum(parse({"reasoning_gym": True}), [env_id], {})
    ids = cur.tracks[env_id].ids
    assert len(ids) == 11  # chain_sum's num_terms has 11 levels (2..12 terms), num_digits 10
    env = gym.make(ids[3])
    env.reset(seed=0)
    # level 3: at most 5 terms (num_terms levels 2, 3, 4, 5) of at most 4 digits (levels 1, 2, 3, 4)
    assert env.unwrapped.task_config == {
        "min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 4, "allow_negation": False,
    }  # fmt: skip
    with pytest.raises(ConfigError, match="not a toolgym/ReasoningGym"):
        Curriculum(parse({"reasoning_gym": True}), [CALC], {})


@pytest.fixture
def tokenizer_and_env() -> Any:
    from tests.trainers.conftest import tiny_tokenizer

    register_fake_env()
    return tiny_tokenizer()


def test_grpo_logs_the_level_and_resumes_it(tmp_path: Path, tokenizer_and_env: Any) -> None:
    tok = tokenizer_and_env
    # the fake env succeeds often: with a window of 4 episodes a level moves every step
    cur = {"levels": [{"max_turns": 2}, {"max_turns": 3}], "window": 4, "min_episodes": 4, "promote_at": 0.25,
           "demote_at": 0.0}  # fmt: skip
    opts = dict(SMALL, curriculum=cur, task_pool=3, replay=True)
    metrics = train_grpo(GRPOConfig(steps=2, output_dir=str(tmp_path), **opts), tiny_model(len(tok)), tok)
    logged = records(tmp_path)
    assert [r["step"] for r in logged] == [1, 2] and all("curriculum/level" in r for r in logged)
    assert metrics["curriculum/level"] in (0.0, 1.0) and "rollout/active_tasks" in metrics
    state = json.loads((tmp_path / "curriculum.json").read_text())
    assert state["tests/VowelCount-v0"]["level"] == metrics["curriculum/level"]
    (tmp_path / "curriculum.json").write_text(
        json.dumps({"tests/VowelCount-v0": {**state["tests/VowelCount-v0"], "level": 1}})
    )
    train_grpo(GRPOConfig(steps=3, resume=True, output_dir=str(tmp_path), **opts), tiny_model(len(tok)), tok)
    assert (
        records(tmp_path)[-1]["step"] == 3
        and records(tmp_path)[-1]["curriculum/moves"] >= state["tests/VowelCount-v0"]["moves"]
    )
    assert (tmp_path / "curriculum.png").is_file()


@pytest.mark.parametrize("name", ["curriculum_calc", "curriculum_calc_hardest"])
def test_shipped_curriculum_configs_run_a_cpu_step(name: str, tmp_path: Path, tokenizer_and_env: Any) -> None:
    """The configs of the curriculum_gain benchmark (one GPU) load, and one tiny step of each runs on CPU."""
    data = load_yaml(CONFIGS / f"{name}.yaml")
    assert data.pop("algorithm") == "grpo"
    cfg = GRPOConfig.from_dict(data)
    hardest = {"digits": 5, "num_ops": 3}
    assert {k: cfg.eval_env_kwargs[k] for k in hardest} == hardest  # both measure the hardest level
    if name == "curriculum_calc":
        levels = parse(cfg.curriculum).level_kwargs(CALC, cfg.env_kwargs)
        assert levels[0] == {"digits": 2, "num_ops": 1} and levels[-1] == hardest
    else:
        assert not cfg.curriculum and {k: cfg.env_kwargs[k] for k in hardest} == hardest
    small = {"steps": 1, "prompts_per_step": 2, "budget": 2, "max_new_tokens": 4, "device": "cpu", "eval_every": 0,
             "eval_episodes": 1, "save_every": 0, "tensorboard": False, "progress": False, "micro_batch_rows": 4,
             "output_dir": str(tmp_path), "max_total_tokens": 2048}  # fmt: skip
    tok = tokenizer_and_env
    metrics = train_grpo(GRPOConfig.from_dict({**data, **small}), tiny_model(len(tok)), tok)
    assert ("curriculum/level" in metrics) == (name == "curriculum_calc")
    assert "eval/success" in metrics
