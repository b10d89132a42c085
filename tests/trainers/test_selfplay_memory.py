"""Self-play's two engines share the run's ``engine_memory``: the learner's KV cache takes its seats' share
(``learner_engine_memory``), the frozen snapshot's is capped to what that left, and one that cannot hold a
single sequence is a ``ConfigError`` (was: the frozen engine copied the learner's slots, a second full
reservation past ``engine_memory``). On CPU a fake free-memory figure stands for the GPU's."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.trainers.conftest import tiny_model, tiny_tokenizer
from toolgym.errors import ConfigError
from toolgym.trainers import selfplay
from toolgym.trainers.rollout import RolloutConfig, RolloutTask
from toolgym.trainers.selfplay import SelfPlayRollout, learner_engine_memory

ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}
OPTIONS = {"learner_seats": 2, "frozen_seats": 1, "others": "basic", "max_turns_per_seat": 2}
CAPACITY = 4096


def _learner(slots: int = 8) -> Any:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    tok = tiny_tokenizer()
    return EnginePolicy(tiny_model(len(tok)), tok, slots=slots, capacity=CAPACITY)


def _per_slot(policy: Any) -> int:
    from toolgym.agents.engine.weights import shape_of

    return CAPACITY * shape_of(policy.model).kv_bytes_per_token(policy.engine.dtype)


@pytest.mark.parametrize(
    ("options", "engine", "want"),
    [
        (OPTIONS, "fast", 0.2),
        (OPTIONS, "auto", 0.2),
        ({"learner_seats": 1, "frozen_seats": 3}, "fast", 0.075),
        (OPTIONS, "vllm", 0.3),  # the frozen snapshot is then an HFPolicy: no KV cache of its own
        (OPTIONS, "hf", 0.3),
        ({"learner_seats": 2}, "fast", 0.3),
        (None, "fast", 0.3),
    ],
)
def test_the_learner_engine_takes_its_seats_share(options: Any, engine: str, want: float) -> None:
    assert learner_engine_memory(options, engine, 0.3) == pytest.approx(want)


def test_the_frozen_engine_takes_what_the_learners_left(monkeypatch: pytest.MonkeyPatch) -> None:
    live = _learner(slots=8)
    per_slot = _per_slot(live)
    learner_bytes = live.engine.cache.nbytes()
    assert learner_bytes == 9 * per_slot  # 8 slots + the scratch slot
    cfg = RolloutConfig(budget=2, max_new_tokens=4, max_total_tokens=3000)
    # half of (18 + 9) slots' worth is 13.5: the learner holds 9, 4.5 are left: 3 slots and the scratch one
    monkeypatch.setattr(selfplay, "_free_bytes", lambda device: 18 * per_slot)
    roller = SelfPlayRollout(live, cfg, SMALL, OPTIONS, engine_memory=0.5)
    try:
        frozen = roller.frozen.engine.cache
        assert frozen.slots == 3
        assert learner_bytes + frozen.nbytes() <= 0.5 * (18 * per_slot + learner_bytes)
        # fewer frozen slots than frozen seats in flight (4 tables): they queue, the games play
        forest, stats = roller.run([RolloutTask(ENV, 0), RolloutTask(ENV, 1)], seed=0)
        assert forest and stats.env_errors == 0
        assert not live.engine.busy() and not roller.frozen.engine.busy()
    finally:
        roller.close()
    # room to spare: the frozen engine is shaped like the learner's, never larger
    monkeypatch.setattr(selfplay, "_free_bytes", lambda device: 1000 * per_slot)
    roller = SelfPlayRollout(live, cfg, SMALL, OPTIONS, engine_memory=0.5)
    try:
        assert roller.frozen.engine.cache.slots == 8
    finally:
        roller.close()


def test_a_frozen_engine_that_cannot_fit_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    live = _learner(slots=8)
    # half of (10 + 9) slots' worth is 9.5: the learner's 9 leave half a slot
    monkeypatch.setattr(selfplay, "_free_bytes", lambda device: 10 * _per_slot(live))
    cfg = RolloutConfig(budget=2, max_new_tokens=4, max_total_tokens=3000)
    with pytest.raises(ConfigError, match=r"engine_memory=0\.5.*raise engine_memory"):
        SelfPlayRollout(live, cfg, SMALL, OPTIONS, engine_memory=0.5)


def test_a_cpu_engine_is_not_budgeted() -> None:
    """No GPU (``_free_bytes`` None): the frozen engine has the learner's slots, as before."""
    live = _learner(slots=6)
    roller = SelfPlayRollout(live, RolloutConfig(budget=1), SMALL, OPTIONS, engine_memory=0.1)
    try:
        assert roller.frozen.engine.cache.slots == 6
    finally:
        roller.close()


def test_grpo_gives_each_engine_its_share(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``grpo.train`` builds the learner's engine with its seats' share and the roller with the whole
    ``engine_memory`` (the frozen engine's budget is the rest of it)."""
    from toolgym.agents.engine import select
    from toolgym.trainers import grpo

    seen: dict[str, Any] = {}
    choose = select.choose_engine

    def spy_engine(policy: Any, engine: str, **kw: Any) -> Any:
        seen["learner"] = kw["memory"]
        return choose(policy, engine, **kw)

    class Stop(Exception):
        pass

    def spy_roller(*args: Any, **kw: Any) -> Any:
        seen["roller"] = kw["engine_memory"]
        raise Stop

    monkeypatch.setattr(grpo, "choose_engine", spy_engine)
    monkeypatch.setattr(grpo, "SelfPlayRollout", spy_roller)
    tok = tiny_tokenizer()
    cfg = grpo.GRPOConfig(
        env_ids=[ENV], env_kwargs=SMALL, steps=1, prompts_per_step=1, budget=2, max_new_tokens=4,
        max_total_tokens=3000, device="cpu", tensorboard=False, progress=False, eval_every=0,
        output_dir=str(tmp_path / "run"), engine="fast", engine_memory=0.3, selfplay=OPTIONS,
    )  # fmt: skip
    with pytest.raises(Stop):
        grpo.train(cfg, tiny_model(len(tok)), tok)
    assert seen == {"learner": pytest.approx(0.2), "roller": 0.3}
