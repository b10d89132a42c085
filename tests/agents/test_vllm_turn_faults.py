"""A turn no rollout server answers (``RequestFailed`` in agents/vllm_policy.py) ends only its path, as an
``env_error`` (no training row, counted in ``rollout/env_errors`` and ``rollout/server_errors``); the other
paths go on and the engine stays usable (was: the exception out of the engine's step ended the rollout)."""

from __future__ import annotations

import json
from typing import Any

from tests.agents.test_vllm_policy import _choice, _stand_in
from toolgym.agents.vllm_policy import ServerBackend, VLLMPolicy
from toolgym.trainers.episodes import episode_metrics
from toolgym.trainers.rollout import RolloutConfig, RolloutTask, TreeRollout
from toolgym.trainers.tree import env_error, flatten

ENV_KW = {"prompt_format": "text", "max_turns": 2}


def failing_first_prompt() -> tuple[Any, dict[str, Any]]:
    """A stand-in server that never answers the first prompt it sees (503) while ``failing["on"]``, and
    answers every other one."""
    failing: dict[str, Any] = {"prompt": None, "on": True}

    def answer(path: str, raw: bytes) -> tuple[int, bytes]:
        prompt = json.loads(raw)["prompt"]
        if failing["on"] and failing["prompt"] in (None, prompt):
            failing["prompt"] = prompt
            return 503, b'{"error": "overloaded"}'
        return 200, _choice()

    return _stand_in(answer), failing


def test_a_turn_no_server_answers_is_its_paths_env_error(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    httpd, failing = failing_first_prompt()
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    backend.backoff_s = 0.01
    policy = VLLMPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer, backend, capacity=1024)
    cfg = RolloutConfig(budget=1, max_new_tokens=4, temperature=0.0, max_total_tokens=900)
    roller = TreeRollout(policy, None, cfg, ENV_KW, env_workers=2)
    tasks = [RolloutTask("toolgym/Calculator-v0", 3), RolloutTask("toolgym/Calculator-v0", 4)]
    try:
        assert roller.continuous
        forest, stats = roller.run(tasks, seed=0)
        assert len(forest) == 2 and stats.env_errors == stats.server_errors == 1
        lost = [(t, leaf) for t in forest for leaf in t.leaves() if env_error(t, leaf)]
        assert len(lost) == 1
        tree, leaf = lost[0]
        node = tree.nodes[leaf]
        assert node.token_ids == [] and node.reward == 0.0 and "rollout server" in node.info["infra_error"]
        assert "503" in node.info["infra_error"] and node.info["episode"]["success"] is False
        other = next(t for t in forest if t is not tree)
        assert not any(env_error(other, x) for x in other.leaves())
        assert other.nodes[other.leaves()[0]].info["episode"]["turns"] >= 1  # it ran on, to its end
        assert len(flatten(forest)) == 1  # the lost path gives no training row
        metrics = episode_metrics(forest, stats)
        assert metrics["rollout/env_errors"] == metrics["rollout/server_errors"] == 1.0
        failing["on"] = False  # the server is back: the same roller and engine roll out both trees
        again, stats2 = roller.run(tasks, seed=0)
        assert stats2.env_errors == 0 and len(flatten(again)) == 2
        assert not policy.engine.live  # nothing left waiting in the engine
    finally:
        roller.close()
        policy.close()
        httpd.shutdown()
