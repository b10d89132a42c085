"""Self-play on our engine: the frozen seats get an engine of their own (the learner's shape and dtype, not
HF generation in fp32), every table goes at its own pace in one continuous batch over both engines, and the
rows stay exactly what was sampled (each trained token's logprob is the learner's, given the row's context)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import toolgym  # noqa: E402,F401
from tests.trainers.conftest import capture_selfplay_rollers, rows_exact, tiny_model, tiny_tokenizer  # noqa: E402
from toolgym.agents.episode_loop import TurnFailed  # noqa: E402
from toolgym.agents.hf import HFPolicy  # noqa: E402
from toolgym.trainers.rollout import RolloutConfig, RolloutTask  # noqa: E402
from toolgym.trainers.selfplay import SelfPlayRollout, _Engines, load_snapshot  # noqa: E402
from toolgym.trainers.tree import flatten  # noqa: E402

ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}


def _engine_policy(seed: int = 0) -> Any:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=seed)
    model.config.max_position_embeddings = 8192
    return EnginePolicy(model, tok, slots=8, capacity=8192)


def test_frozen_snapshot_of_an_engine_policy_is_an_engine() -> None:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    live = _engine_policy()
    frozen = load_snapshot(live, "initial")
    assert isinstance(frozen, EnginePolicy) and frozen.engine is not live.engine
    assert frozen.model is not live.model and frozen.engine.dtype == live.engine.dtype
    assert (frozen.engine.cache.slots, frozen.engine.cache.capacity) == (8, 8192)
    assert frozen.engine.new([1]).id >= 1 << 48  # never the id of a learner sequence in the same loop
    hf = HFPolicy(tiny_model(len(live.tokenizer)), live.tokenizer)
    assert isinstance(load_snapshot(hf, "initial"), HFPolicy)  # an HF learner keeps an HF snapshot


def test_continuous_tables_with_frozen_seats_and_exact_rows() -> None:
    live = _engine_policy()
    cfg = RolloutConfig(budget=2, max_new_tokens=4, max_total_tokens=8000)
    # (a random model never moves legally: the seat to move first repeats its turn until the table ends, so
    # the deals are chosen where learner seats and the frozen seat both move)
    options = {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 3}
    roller = SelfPlayRollout(live, cfg, SMALL, options)
    try:
        forest, stats = roller.run([RolloutTask(ENV, s) for s in range(6)], seed=0)
        timing = roller.timing
        assert timing["mode"] == "continuous" and timing["learner_steps"] > 0 and timing["frozen_steps"] > 0
        assert roller.frozen.engine.stats.decode_tokens > 0  # the frozen seats answered from their engine
        assert not live.engine.busy() and not roller.frozen.engine.busy()
        rows = flatten(forest)
        assert rows and stats.generated_tokens == sum(sum(r.loss_mask) for r in rows)
        assert rows_exact(rows, live.model)  # each trained token's logprob, recomputed from its row's context
        again, _ = roller.run([RolloutTask(ENV, 2)], seed=1)  # the engines are reusable the next step
        assert flatten(again)
    finally:
        roller.close()


def test_engines_keep_the_turns_that_ended_before_a_failed_one() -> None:
    class Stub:
        def __init__(self, out: list[Any], fail: bool = False) -> None:
            self.out, self.fail, self.stepped = out, fail, False
            self.cancelled: list[Any] = []

        def busy(self) -> bool:
            return not self.stepped

        def step(self) -> list[Any]:
            self.stepped = True
            if self.fail:
                raise TurnFailed("no server answered")
            return self.out

        def cancel(self, seq: Any) -> None:
            self.cancelled.append(seq)

    ended = SimpleNamespace(id=1)
    a, b = Stub([ended]), Stub([], fail=True)
    both = _Engines([a, b])
    with pytest.raises(TurnFailed):
        both.step()
    assert both.busy() and both.step() == [ended] and not both.busy()  # carried to the next step
    queued = SimpleNamespace(id=7)
    both.owner[7] = b
    both.cancel(queued)
    assert b.cancelled == [queued] and not a.cancelled


def test_grpo_on_our_engine_with_a_frozen_engine_seat(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU pipeline's path on CPU: grpo.train with engine=fast, a frozen seat from a transformers folder (its
    own engine), a time limit; the steps run and the checkpoint is written."""
    from toolgym.trainers import grpo

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 8192
    snapshot = tmp_path / "snapshot"
    model.save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    cfg = grpo.GRPOConfig(
        env_ids=[ENV], env_kwargs=SMALL, steps=2, prompts_per_step=3, budget=2, max_new_tokens=4,
        max_total_tokens=4000, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_every=0,
        eval_episodes=1, micro_batch_rows=4, output_dir=str(tmp_path / "run"), engine="fast", time_limit_s=600,
        selfplay={"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 3, "snapshot": str(snapshot)},
    )  # fmt: skip
    seen = capture_selfplay_rollers(monkeypatch)
    metrics = grpo.train(cfg, model, tok)
    assert metrics["rollout/episodes"] > 0 and (tmp_path / "run" / "checkpoint" / "model.pt").is_file()
    (used,) = seen
    assert used.timing["mode"] == "continuous" and type(used.frozen).__name__ == "EnginePolicy"
