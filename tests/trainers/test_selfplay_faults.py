"""Self-play with a turn no rollout server answers (``RequestFailed``, a ``TurnFailed``): that table's game
ends and its learner seats are ``env_error`` leaves (no row, counted in ``rollout/env_errors`` and
``rollout/server_errors``); the other tables play to their end (was: the exception out of the batch's
``generate`` ended the rollout). ``generate_each`` on our engine is the policy's ``generate``; a prompt with no
room left in the engine is ``None`` (the table's ``token_budget``), not an error."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.agents.test_vllm_policy import _choice, _stand_in
from tests.trainers.conftest import tiny_model, tiny_tokenizer
from toolgym.agents.episode_loop import Fault
from toolgym.agents.policy import Generation, SamplingParams
from toolgym.agents.vllm_policy import ServerBackend, VLLMPolicy
from toolgym.trainers.episodes import episode_metrics
from toolgym.trainers.rollout import RolloutConfig, RolloutTask
from toolgym.trainers.selfplay import SelfPlayRollout, generate_each
from toolgym.trainers.tree import env_error, flatten

ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}


def test_a_turn_no_server_answers_ends_only_its_table() -> None:
    tok = tiny_tokenizer()
    seen: list[str] = []  # distinct prompts, in the order they came
    failing = {"on": True}

    def answer(path: str, raw: bytes) -> tuple[int, bytes]:
        prompt = str(json.loads(raw)["prompt"])
        if prompt not in seen:
            seen.append(prompt)
        # the third distinct prompt (a seat's second turn: its first turn is a row) never gets an answer
        if failing["on"] and len(seen) >= 3 and prompt == seen[2]:
            return 503, b'{"error": "overloaded"}'
        return 200, _choice()

    httpd = _stand_in(answer)
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    backend.backoff_s = 0.01
    policy = VLLMPolicy(tiny_model(len(tok)), tok, backend, capacity=8192)
    cfg = RolloutConfig(budget=1, max_new_tokens=4, temperature=0.0, max_total_tokens=8000)
    roller = SelfPlayRollout(
        policy, cfg, SMALL, {"learner_seats": 1, "others": "basic", "max_turns_per_seat": 3}
    )
    tasks = [RolloutTask(ENV, 4), RolloutTask(ENV, 9)]  # two deals: two different first prompts
    try:
        forest, stats = roller.run(tasks, seed=0)
        assert stats.env_errors == stats.server_errors == 1
        lost = [(t, leaf) for t in forest for leaf in t.leaves() if env_error(t, leaf)]
        assert len(lost) == 1
        tree, leaf = lost[0]
        node = tree.nodes[leaf]
        assert "rollout server" in node.info["infra_error"] and "503" in node.info["infra_error"]
        assert node.reward == 0.0 and node.info["episode"]["success"] is False
        others = [t for t in forest if t is not tree]
        assert others and not any(env_error(t, x) for t in others for x in t.leaves())
        assert len(flatten(forest)) == sum(len(t.leaves()) for t in others)  # the lost seat has no row
        metrics = episode_metrics(forest, stats)
        assert metrics["rollout/env_errors"] == metrics["rollout/server_errors"] == 1.0
        failing["on"] = False  # the server is back: the same roller and engine play every table
        again, stats2 = roller.run(tasks, seed=0)
        assert stats2.env_errors == 0 and not any(env_error(t, x) for t in again for x in t.leaves())
        assert not policy.engine.live
    finally:
        roller.close()
        policy.close()
        httpd.shutdown()


def test_generate_each_on_our_engine_is_generate_and_a_full_slot_is_none() -> None:
    from toolgym.agents.engine.engine_policy import EnginePolicy

    tok = tiny_tokenizer()
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
    prompts = [tok.encode("system user aeiou"), tok.encode("assistant tool 2146")]
    a = EnginePolicy(tiny_model(len(tok)), tok, slots=4, capacity=64)
    b = EnginePolicy(tiny_model(len(tok)), tok, slots=4, capacity=64)
    want = a.generate(prompts, sp)
    got = generate_each(b, prompts, sp)
    assert all(isinstance(g, Generation) for g in got)
    assert [(g.token_ids, g.logprobs) for g in got] == [(w.token_ids, w.logprobs) for w in want]  # type: ignore[union-attr]
    long = tok.encode("aeiou " * 80)[:63]  # fills the slot: no room for one token
    out = generate_each(b, [long, prompts[0]], SamplingParams(max_new_tokens=2))
    assert out[0] is None and isinstance(out[1], Generation)
    assert not b.engine.busy()
    assert not isinstance(out[1], Fault)
