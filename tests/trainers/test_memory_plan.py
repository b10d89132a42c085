"""One memory estimate per run, checked at start (trainers/gpu_memory.py ``memory_plan``): every weight copy
the run makes (the engines' packed weights, the frozen self-play opponent, the asynchronous actor, the KL
reference) comes off the free memory first, the KV caches take ``engine_memory`` of what is left, and the rest
must hold the optimizer's state and gradients, or the run is a ``ConfigError`` before its first step (was:
the copies were not counted, and ``engine_memory`` near the free memory ran out of memory mid-run). On CPU a
fake free-memory figure stands for the GPU's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.trainers.conftest import tiny_model, tiny_tokenizer
from toolgym.errors import ConfigError
from toolgym.trainers import gpu_memory
from toolgym.trainers.gpu_memory import (
    MemoryPlan,
    memory_plan,
    packed_bytes,
    trainer_state_bytes,
    weights_bytes,
)

GB = 10**9
ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}
SELFPLAY = {"learner_seats": 2, "frozen_seats": 1, "others": "basic", "max_turns_per_seat": 2}


def _cfg(**kw: Any) -> Any:
    from toolgym.trainers.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        env_ids=["toolgym/KeyFind-v0"], steps=1, prompts_per_step=1, budget=2, max_new_tokens=4,
        max_total_tokens=256, device="cpu", tensorboard=False, progress=False, eval_every=0, engine="fast",
    )  # fmt: skip
    return GRPOConfig(**{**base, **kw})


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


# -- the arithmetic -------------------------------------------------------------------------------------------


def test_the_copies_come_off_first_and_the_kv_caches_take_their_share_of_the_rest() -> None:
    plan = MemoryPlan(
        100 * GB, 0.5, (("the frozen opponent", 20 * GB, "selfplay.frozen_seats=0"), ("packed", 10 * GB, "")),
        state=30 * GB, kv_shares=(("learner", 0.75), ("frozen", 0.25)),
    )  # fmt: skip
    plan.check()
    assert plan.copies_bytes == 30 * GB and plan.kv_bytes == 35 * GB
    assert plan.kv("learner") == 26_250_000_000 and plan.kv("frozen") == 8_750_000_000
    assert plan.kv("actor") is None  # no such engine in this run
    assert "the frozen opponent 20.00" in plan.describe()


def test_engine_memory_near_the_free_memory_is_a_config_error_naming_what_to_lower() -> None:
    # 70 GB after the copies; 0.9 of it for KV leaves 7 GB, the optimizer state needs 30 GB: at most 0.57
    copies = (("the frozen opponent", 20 * GB, "selfplay.frozen_seats=0"), ("packed", 10 * GB, "engine=hf"))
    plan = MemoryPlan(100 * GB, 0.9, copies, state=30 * GB, kv_shares=(("learner", 1.0),))
    with pytest.raises(
        ConfigError, match=r"engine_memory=0\.9.*lower engine_memory to at most 0\.57.*frozen_seats=0"
    ):
        plan.check()
    MemoryPlan(100 * GB, 0.57, copies, state=30 * GB).check()  # the advice fits


def test_without_a_kv_cache_the_trainer_keeps_what_the_copies_leave() -> None:
    """engine=hf reserves no KV cache: engine_memory near the free memory is no error then."""
    plan = memory_plan(
        _cfg(engine="hf", kl_coef=0.1, engine_memory=0.9), tiny_model(64), _cpu(), quiet=True, free=GB
    )
    assert plan.kv_bytes == 0 and [c[0] for c in plan.copies] == ["the KL reference"]
    plan.check()


def test_copies_that_do_not_fit_at_all_are_a_config_error_naming_them() -> None:
    plan = MemoryPlan(40 * GB, 0.1, (("the asynchronous actor", 30 * GB, "max_staleness=0"),), state=15 * GB)
    with pytest.raises(ConfigError, match=r"weight copies \(30\.00 GB\).*max_staleness=0"):
        plan.check()


def test_without_a_gpu_nothing_is_budgeted() -> None:
    model = tiny_model(64)
    plan = memory_plan(_cfg(), model, _cpu(), quiet=True)
    assert plan.free is None and plan.kv("learner") is None
    plan.check()


# -- what a run copies ----------------------------------------------------------------------------------------


def test_the_packed_estimate_is_the_engines_packed_copy() -> None:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    engine = EnginePolicy(model, tok, slots=2, capacity=64)
    assert packed_bytes(model, 4) == engine.engine.runner.weights.nbytes()


@pytest.mark.parametrize(
    ("kw", "actor", "want"),
    [
        ({}, False, ["the learner engine's packed weights"]),
        ({"engine": "hf"}, False, []),
        ({"kl_coef": 0.1}, False, ["the learner engine's packed weights", "the KL reference"]),
        (
            {"env_ids": [ENV], "env_kwargs": SMALL, "selfplay": SELFPLAY, "max_total_tokens": 3000},
            False,
            [
                "the learner engine's packed weights",
                "the frozen opponent",
                "the frozen opponent engine's packed weights",
            ],
        ),
        (
            {"max_staleness": 1},
            True,
            [
                "the learner engine's packed weights",
                "the asynchronous actor",
                "the actor engine's packed weights",
            ],
        ),
    ],
)
def test_every_weight_copy_of_the_run_is_counted(kw: dict[str, Any], actor: bool, want: list[str]) -> None:
    model = tiny_model(64)
    plan = memory_plan(_cfg(**kw), model, _cpu(), actor=actor, quiet=True, free=10 * GB)
    assert [c[0] for c in plan.copies] == want
    sizes = dict((c[0], c[1]) for c in plan.copies)
    if "the frozen opponent" in sizes:  # loaded in fp32 (selfplay.load_snapshot)
        assert sizes["the frozen opponent"] == weights_bytes(model, 4)
        assert dict(plan.kv_shares) == {"learner": pytest.approx(2 / 3), "frozen": pytest.approx(1 / 3)}
    if actor:
        assert sizes["the asynchronous actor"] == weights_bytes(model)
        assert dict(plan.kv_shares) == {"learner": 0.5, "actor": 0.5}
    assert (
        plan.state
        == trainer_state_bytes(model)
        == 3 * weights_bytes(model) - 3 * sum(b.numel() * b.element_size() for b in model.buffers())
    )


# -- a run checks it at start and sizes its engines from it ---------------------------------------------------


def _fake_free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(gpu_memory, "free_bytes", lambda device: free)


def test_grpo_stops_at_start_when_engine_memory_leaves_the_optimizer_no_room(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolgym.trainers import grpo

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    copies = 2 * packed_bytes(model, 4) + weights_bytes(model, 4)  # two engines' packed, the frozen opponent
    _fake_free(monkeypatch, copies + 2 * trainer_state_bytes(model))  # 0.9 of the rest leaves too little
    monkeypatch.setattr(grpo, "SelfPlayRollout", lambda *a, **k: pytest.fail("got past the start"))
    cfg = _cfg(
        env_ids=[ENV], env_kwargs=SMALL, selfplay=SELFPLAY, max_total_tokens=3000, engine_memory=0.9,
        output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"lower engine_memory to at most 0\.5"):
        grpo.train(cfg, model, tok)
    assert "the frozen opponent" in capsys.readouterr().err  # the estimate's line


def test_grpo_sizes_the_learner_and_frozen_engines_from_the_estimate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from toolgym.agents.engine.weights import shape_of
    from toolgym.trainers import grpo

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    capacity = 3000 + 4 + 8
    per_slot = capacity * shape_of(model).kv_bytes_per_token(__import__("torch").float32)
    copies = packed_bytes(model, 4) * 2 + weights_bytes(model, 4)
    # KV budget 0.5 * (free - copies) = 16 slots' worth: the learner's 3 seats 12 (11 + scratch), the frozen 4
    _fake_free(monkeypatch, copies + 32 * per_slot)
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def spy_roller(policy: Any, *args: Any, **kw: Any) -> Any:
        seen["learner_slots"], seen["frozen_budget"] = policy.engine.cache.slots, kw["kv_budget"]
        raise Stop

    monkeypatch.setattr(grpo, "SelfPlayRollout", spy_roller)
    cfg = _cfg(
        env_ids=[ENV], env_kwargs=SMALL, selfplay={**SELFPLAY, "learner_seats": 3}, max_total_tokens=3000,
        engine_memory=0.5, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    with pytest.raises(Stop):
        grpo.train(cfg, model, tok)
    assert seen["learner_slots"] == 11
    assert seen["frozen_budget"] // per_slot == 4


def test_the_frozen_engine_takes_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.engine.weights import shape_of
    from toolgym.trainers.rollout import RolloutConfig
    from toolgym.trainers.selfplay import SelfPlayRollout

    tok = tiny_tokenizer()
    live = EnginePolicy(tiny_model(len(tok)), tok, slots=8, capacity=4096)
    per_slot = 4096 * shape_of(live.model).kv_bytes_per_token(live.engine.dtype)
    cfg = RolloutConfig(budget=2, max_new_tokens=4, max_total_tokens=3000)
    roller = SelfPlayRollout(live, cfg, SMALL, SELFPLAY, kv_budget=4 * per_slot)
    try:
        assert roller.frozen.engine.cache.slots == 3  # + the scratch slot: 4 slots' worth
    finally:
        roller.close()
    with pytest.raises(ConfigError, match=r"frozen seats' engine gets .*raise engine_memory"):
        SelfPlayRollout(live, cfg, SMALL, SELFPLAY, kv_budget=per_slot)


def test_the_async_actor_engine_takes_its_budget() -> None:
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.engine.weights import shape_of
    from toolgym.trainers.async_rollout import actor_policy

    tok = tiny_tokenizer()
    cfg = _cfg(max_staleness=1)
    capacity = cfg.max_total_tokens + cfg.max_new_tokens + 8
    learner = EnginePolicy(tiny_model(len(tok)), tok, slots=4, capacity=capacity)
    per_slot = capacity * shape_of(learner.model).kv_bytes_per_token(learner.engine.dtype)
    _, rollout = actor_policy(cfg, learner, _cpu(), 0, kv_budget=6 * per_slot)
    assert rollout.engine.cache.slots == 5
    with pytest.raises(ConfigError, match="KV cache gets"):
        actor_policy(cfg, learner, _cpu(), 0, kv_budget=per_slot)


def test_ppo_checks_the_same_estimate_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PPO's engine takes its KV bytes from the run's estimate too (it took engine_memory of free memory)."""
    from toolgym.trainers import ppo
    from toolgym.trainers.ppo import PPOConfig

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    _fake_free(monkeypatch, packed_bytes(model, 4) + 2 * trainer_state_bytes(model))
    monkeypatch.setattr(ppo, "value_head", lambda m: pytest.fail("got past the start"))
    cfg = PPOConfig(
        env_ids=["toolgym/KeyFind-v0"], steps=1, prompts_per_step=1, budget=2, max_new_tokens=4,
        max_total_tokens=256, device="cpu", tensorboard=False, progress=False, eval_every=0, engine="fast",
        engine_memory=0.9, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="lower engine_memory"):
        ppo.train(cfg, model, tok)
    assert "the learner engine's packed weights" in capsys.readouterr().err
