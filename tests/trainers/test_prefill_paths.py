"""The trainers that generate with our engine (``engine: fast`` on CPU, float32) under both prefills
(``TOOLGYM_PREFILL=varlen``, the default, and ``padded``), with the engine's short continuations forced through
the prefill pass (``inline_prefill = 0``) or left inline: GRPO with branching rollouts and PPO (the trainer's
own engine/learner check: the IS weight of step 1 is 1 for every token), self-play (two engines), the async
worker (weights change mid-episode: each token's logprob is its version's), evaluation and LSPO's collection
(the same results under both prefills)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.agents.test_engine_prefill_paths import MODES, set_engine_knobs  # noqa: E402
from tests.trainers.conftest import register_fake_env, rows_gap, tiny_model, tiny_tokenizer  # noqa: E402
from tests.trainers.test_train import SMALL  # noqa: E402
from toolgym.trainers.tree import flatten  # noqa: E402

KNOBS = [{}, {"inline_prefill": 0}, {"inline_prefill": 0, "prefill_chunk": 11}]
KNOB_IDS = ["default", "eager", "chunked"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TOOLGYM_PREFILL", request.param)
    return str(request.param)


@pytest.fixture
def knobs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    set_engine_knobs(monkeypatch, **request.param)
    yield request.param


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()


def assert_engine_matches_learner(metrics: dict[str, float]) -> None:
    """Step 1's IS weights (exp(learner's old logprob - engine's sampling logprob)) are all 1."""
    assert metrics["losses/is_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["losses/is_max"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["losses/is_ratio_spread"] < 1e-5 and metrics["losses/is_masked_fraction"] == 0.0


@pytest.mark.parametrize("knobs", KNOBS, indirect=True, ids=KNOB_IDS)
@pytest.mark.parametrize(
    "branching",
    [
        {"branching": "turn_entropy", "branch_kwargs": {"entropy_weight": 0.0, "tau": 0.0}},
        {"branching": "token_entropy"},
        {},
    ],
    ids=["turn_forks", "token_forks", "chains"],
)
def test_grpo_engine_logprobs_are_the_learners(
    mode: str, knobs: dict[str, int], branching: dict[str, Any], tmp_path: Path
) -> None:
    from toolgym.trainers.grpo import GRPOConfig, train

    tok = tiny_tokenizer()
    cfg = GRPOConfig(steps=1, output_dir=str(tmp_path), engine="fast", **branching, **SMALL)
    metrics = train(cfg, tiny_model(len(tok)), tok)
    assert metrics["rollout/episodes"] > 0
    assert_engine_matches_learner(metrics)


def test_grpo_runs_the_same_under_both_prefills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GRPO steps with turn forks on engine=fast, short continuations through the prefill pass: the same
    sampled trees (rewards, token counts, forks) and losses under both prefills."""
    from toolgym.trainers.grpo import GRPOConfig, train

    set_engine_knobs(monkeypatch, inline_prefill=0)
    tok = tiny_tokenizer()
    got = {}
    for m in MODES:
        monkeypatch.setenv("TOOLGYM_PREFILL", m)
        out = tmp_path / m
        cfg = GRPOConfig(
            steps=2, output_dir=str(out), engine="fast", branching="turn_entropy",
            branch_kwargs={"entropy_weight": 0.0, "tau": 0.0}, **SMALL,
        )  # fmt: skip
        train(cfg, tiny_model(len(tok)), tok)
        got[m] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timing = ("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s", "perf/", "system/")
    for a, b in zip(got["varlen"], got["padded"], strict=True):
        keys = [k for k in a if not k.startswith(timing) and isinstance(a[k], int | float) and "_s" not in k]
        assert {k: a[k] for k in keys} == pytest.approx({k: b[k] for k in keys}, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("knobs", KNOBS[:2], indirect=True, ids=KNOB_IDS[:2])
def test_ppo_engine_logprobs_are_the_learners(mode: str, knobs: dict[str, int], tmp_path: Path) -> None:
    from toolgym.trainers.ppo import PPOConfig, train

    tok = tiny_tokenizer()
    metrics = train(
        PPOConfig(steps=1, output_dir=str(tmp_path), engine="fast", **SMALL), tiny_model(len(tok)), tok
    )
    assert_engine_matches_learner(metrics)


@pytest.mark.parametrize("knobs", KNOBS, indirect=True, ids=KNOB_IDS)
def test_selfplay_two_engines_rows_exact(mode: str, knobs: dict[str, int]) -> None:
    """Self-play's continuous tables over the learner's engine and the frozen seats' own engine."""
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.trainers.rollout import RolloutConfig, RolloutTask
    from toolgym.trainers.selfplay import SelfPlayRollout

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 8192
    live = EnginePolicy(model, tok, slots=8, capacity=8192)
    cfg = RolloutConfig(budget=2, max_new_tokens=4, max_total_tokens=8000)
    options = {"learner_seats": 2, "frozen_seats": 1, "max_turns_per_seat": 3}
    roller = SelfPlayRollout(live, cfg, {"n_players": 5, "max_days": 2}, options)
    try:
        forest, _ = roller.run([RolloutTask("toolgym/Werewolf-v0", s) for s in range(4)], seed=0)
        assert roller.frozen.engine.prefill_mode == mode == live.engine.prefill_mode
        assert roller.frozen.engine.stats.decode_tokens > 0
        worst, checked = rows_gap(flatten(forest), live.model)
        assert checked > 0 and worst < 1e-4
    finally:
        roller.close()


@pytest.mark.parametrize("knobs", KNOBS[:2], indirect=True, ids=KNOB_IDS[:2])
def test_async_worker_tokens_carry_their_versions_logprobs(mode: str, knobs: dict[str, int]) -> None:
    """max_staleness 2 on our engine: weights change mid-episode (the engine re-packs, its held caches are
    dropped and the turn is prefilled again under the new weights); every token's logprob is that of the
    version it is tagged with, given its whole context."""
    import gymnasium as gym

    from tests.trainers.test_async import SLOW_ENV, SlowVowelEnv, _fake_learner, _turn_logprobs

    if SLOW_ENV not in gym.registry:
        gym.register(SLOW_ENV, entry_point=SlowVowelEnv, disable_env_checker=True)
    got, versions, pipe = _fake_learner(
        tiny_tokenizer(), max_staleness=2, steps=4, continuous=True, per_tree=False
    )
    assert pipe.taken == [1, 2, 3, 4]
    worst, checked = 0.0, 0
    for b in got:
        for tree in b.forest:
            for n in tree.nodes:
                if n.kind != "model":
                    continue
                assert n.versions is not None
                by_version = {v: _turn_logprobs(versions[v], tree, n.id) for v in set(n.versions)}
                want = [by_version[v][j] for j, v in enumerate(n.versions)]
                worst = max([worst, *(abs(a - w) for a, w in zip(n.logprobs, want, strict=True))])
                checked += len(want)
    assert checked > 0 and worst < 1e-4


@pytest.mark.parametrize("knobs", KNOBS[1:], indirect=True, ids=KNOB_IDS[1:])
def test_async_grpo_on_the_engine_runs(mode: str, knobs: dict[str, int], tmp_path: Path) -> None:
    """grpo.train with max_staleness 1 on engine=fast: turns in flight at a publish are cancelled and prefilled
    again (chunked ones too, cut short in the queue with part of their prompt cached)."""
    from toolgym.trainers.grpo import GRPOConfig, train

    tok = tiny_tokenizer()
    cfg = GRPOConfig(steps=3, max_staleness=1, output_dir=str(tmp_path), engine="fast", **SMALL)
    train(cfg, tiny_model(len(tok)), tok)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["rollout/staleness_max"] <= 1 for r in rows)
    assert rows[0]["losses/is_ratio_spread"] < 1e-5  # step 1: nothing stale, the engine's logprobs are exact
    assert all(r["losses/is_ratio_spread"] < 0.5 for r in rows)  # later: one version behind (~0.1 here)


def test_evaluate_on_the_engine_equals_hf(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy held-out evaluation (trainers/episodes.py) through the engine, with short continuations through
    the prefill pass, gives HF's numbers."""
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.agents.hf import HFPolicy
    from toolgym.trainers.episodes import evaluate
    from toolgym.trainers.rollout import RolloutConfig

    set_engine_knobs(monkeypatch, inline_prefill=0)
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=4)
    cfg = RolloutConfig(budget=1, max_new_tokens=6, max_total_tokens=256, temperature=0.0)
    env_ids, env_kwargs = SMALL["env_ids"], SMALL["env_kwargs"]
    ours = evaluate(EnginePolicy(model, tok, slots=8, capacity=300), env_ids, env_kwargs, cfg, 3)
    theirs = evaluate(HFPolicy(model, tok), env_ids, env_kwargs, cfg, 3)
    assert {k: v for k, v in ours.items() if "_s" not in k} == pytest.approx(
        {k: v for k, v in theirs.items() if "_s" not in k}
    )


def test_lspo_collection_is_the_same_under_both_prefills(monkeypatch: pytest.MonkeyPatch) -> None:
    """LSPO's candidates through the engine (engine=fast), with a prompt limit at the engine's capacity less
    the answer: the same sampled candidates under both prefills."""
    from toolgym.envs.werewolf.env import WerewolfEnv
    from toolgym.trainers.lspo.loop import LSPOConfig, _policy, collect, policy_proposer

    set_engine_knobs(monkeypatch, inline_prefill=0)
    tok = tiny_tokenizer()
    got = {}
    for m in MODES:
        monkeypatch.setenv("TOOLGYM_PREFILL", m)
        model = tiny_model(len(tok))
        model.config.max_position_embeddings = 4096
        cfg = LSPOConfig(
            games=2, text_seats=2, candidates=2, n_players=5, max_new_tokens=8, device="cpu", engine="fast"
        )
        policy, _, max_prompt = _policy(model, tok, cfg)
        assert policy.engine.prefill_mode == m
        rules = WerewolfEnv(n_players=5, opponents="strong")
        turns, _ = collect(
            rules, policy_proposer(policy, 8, max_prompt), 2, 2, 2, seed=0, max_turns_per_seat=4
        )
        got[m] = [[c.ids for c in t.candidates] for t in turns]
    assert got["varlen"] == got["padded"] and any(c for t in got["varlen"] for c in t)
