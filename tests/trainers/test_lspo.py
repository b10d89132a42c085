"""LSPO's pieces on CPU: the latent space (canonical texts, clusters per role, expansion), the abstracted game
(CFR's σ̄ beats the uniform latent strategy), pairs that follow σ̄, and two tiny iterations end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolgym.envs.werewolf.env import WerewolfEnv
from toolgym.trainers.lspo.game import key_of, play_latent
from toolgym.trainers.lspo.loop import (
    LSPOConfig,
    collect,
    preference_pairs,
    scripted_proposer,
    solve,
)
from toolgym.trainers.lspo.space import LatentSpace, canonical

UTTERANCES = [
    ("seer", "I am the seer. P3 is a werewolf."),
    ("seer", "I am the seer. P2 is innocent."),
    ("seer", "I have no information yet."),
    ("villager", "I suspect P4."),
    ("villager", "I have no information yet."),
    ("doctor", "I suspect P4."),
    ("doctor", "I have nothing to say."),
    ("werewolf", "I suspect P1."),
    ("werewolf", "I am the seer. P5 is a werewolf."),
    ("werewolf", "I have nothing to say."),
]


def test_space_clusters_per_role_and_expands() -> None:
    space = LatentSpace.build(UTTERANCES * 2, k=4, k_public=4)
    assert canonical("I suspect P7.") == "I suspect PX."
    assert space.sizes()["seer"] == 3 and space.sizes()["werewolf"] == 3
    seer = space.roles["seer"]
    assert (
        seer[space.role_latent("seer", "I am the seer. P6 is a werewolf.")].template
        == "I am the seer. PX is a werewolf."
    )
    grown = space.expand(
        [("villager", "Vote P3 out, he lied about being the doctor.")] * 3 + [("villager", "I suspect P2.")]
    )
    assert (
        grown.sizes()["villager"] == space.sizes()["villager"] + 1
    )  # only the far utterance is a new strategy
    assert grown.sizes()["seer"] == space.sizes()["seer"]


def test_cfr_strategy_beats_uniform_in_the_latent_game() -> None:
    space = LatentSpace.build(UTTERANCES, k=4, k_public=4)
    table = solve(space, 1500, n_players=7, seed=0)
    sigma = table.policy()
    uniform = play_latent(space, {}, 300, seed=1)
    village = play_latent(space, {0: sigma}, 300, seed=1)
    wolves = play_latent(space, {1: sigma}, 300, seed=1)
    assert village["village"] > uniform["village"] + 0.05
    assert wolves["werewolves"] > uniform["werewolves"] + 0.03


def test_pairs_follow_the_solver() -> None:
    rules = WerewolfEnv(n_players=7, opponents="strong")
    turns, stats = collect(rules, scripted_proposer(rules), games=6, text_seats=3, candidates=4, seed=0)
    assert stats["finished"] == 6 and stats["discussion_turns"] == len(turns) > 0
    assert stats["invalid_candidates"] == 0.0
    space = LatentSpace.build([(t.role, c.speech) for t in turns for c in t.candidates], k=4, k_public=4)
    table = solve(space, 1500, n_players=7, seed=0)
    pairs = preference_pairs(turns, space, table, min_gap=0.1, reject_invalid=True)
    assert pairs
    for p in pairs:
        role = p.messages[1]["content"].split(", a ")[1].split(" ")[0]
        sigma = table.average(p.key)
        hi = sigma[space.role_latent(role, p.chosen.speech)]
        lo = sigma[space.role_latent(role, p.rejected.speech)]
        assert hi - lo == pytest.approx(p.gap) and p.gap >= 0.1
    # the real games' information sets are the abstracted game's: most discussion turns were reached by CFR
    reached = sum(key_of(t.parts, space) in table.sums for t in turns)
    assert reached >= len(turns) // 2


def test_two_tiny_iterations(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.trainers.conftest import tiny_model, tiny_tokenizer
    from toolgym.trainers.lspo.loop import run

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 4096
    cfg = LSPOConfig(
        iterations=2, games=4, text_seats=2, candidates=3, n_players=5, k=3, k_public=3, cfr_iterations=1000,
        dpo_epochs=1, batch_size=8, lr=1e-3, proposer="scripted", device="cpu", out=str(tmp_path),
    )  # fmt: skip
    summaries = run(cfg, model, tok)
    assert [s["iteration"] for s in summaries] == [1, 2]
    assert summaries[0]["pairs"] > 0 and "dpo" in summaries[0]
    assert (tmp_path / "iter_1" / "model" / "config.json").is_file()
    assert all(summaries[1]["space"][r] >= n for r, n in summaries[0]["space"].items())
    assert json.loads((tmp_path / "summary.json").read_text())["iterations"][1]["iteration"] == 2
    assert np.isfinite(summaries[1]["dpo"]["last"]["dpo/loss"])
    again = run(cfg, model, tok)  # finished iterations are read back (resume), not run again
    assert [s["pairs"] for s in again] == [s["pairs"] for s in summaries]


def test_illegal_night_moves_fall_back_to_the_scripted_player() -> None:
    """A policy that cannot kill or vote yet (a weak model) still reaches the discussions: its illegal night
    moves and votes are the strong player's; without the fallback its games are abandoned at night."""
    from toolgym.trainers.lspo.loop import Candidate

    rules = WerewolfEnv(n_players=5, opponents="strong")
    scripted = scripted_proposer(rules)

    def weak(batch: list, rng: np.random.Generator) -> list:
        good = scripted(batch, rng)
        return [
            c if n > 1 else [Candidate("zzz no move", "")] for (_, _, n), c in zip(batch, good, strict=True)
        ]

    turns, stats = collect(rules, weak, games=4, text_seats=3, candidates=2, seed=0, max_turns_per_seat=20)
    assert stats["finished"] == 4 and stats["fallback_moves"] == 1.0 and turns
    _, without = collect(
        rules, weak, games=4, text_seats=3, candidates=2, seed=0, max_turns_per_seat=20, fallback=False
    )
    assert without["finished"] < 4 and without["discussion_turns"] < stats["discussion_turns"]


def test_the_policy_proposer_on_our_engine_and_prompts_past_its_capacity(tmp_path: Path) -> None:
    """engine=fast (what auto picks on CUDA) proposes through the engine; a prompt longer than the engine
    holds gets an empty candidate (no speech, an illegal move: the fallback plays it) instead of an error."""
    pytest.importorskip("torch")
    from tests.trainers.conftest import tiny_model, tiny_tokenizer
    from toolgym.agents.engine.engine_policy import EnginePolicy
    from toolgym.trainers.lspo.loop import _policy, policy_proposer

    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 4096
    cfg = LSPOConfig(
        games=2, text_seats=2, candidates=2, n_players=5, max_new_tokens=8, device="cpu", engine="fast"
    )
    policy, hf, max_prompt = _policy(model, tok, cfg)
    assert isinstance(policy, EnginePolicy) and policy.model is hf.model and max_prompt == 4096 - 8 - 2
    rules = WerewolfEnv(n_players=5, opponents="strong")
    turns, stats = collect(
        rules, policy_proposer(policy, 8, max_prompt), 2, 2, 2, seed=0, max_turns_per_seat=6
    )
    assert stats["games"] == 2.0 and turns and all(len(t.candidates) == 2 for t in turns)
    short = policy_proposer(policy, 8, max_prompt=10)  # every prompt is longer: no generation at all
    turns, _ = collect(rules, short, 2, 2, 2, seed=0, max_turns_per_seat=6)
    assert all(c.text == "" and c.ids == [] for t in turns for c in t.candidates)
    assert _policy(model, tok, LSPOConfig(device="cpu"))[2] is None  # auto on CPU: HF, no limit
