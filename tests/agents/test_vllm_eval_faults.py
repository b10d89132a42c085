"""``toolgym eval``'s runner (agents/runner.py) with a turn no rollout server answers (``RequestFailed``, a
``TurnFailed``): that episode is an infrastructure failure (``error`` set, ``truncation == "env_error"``),
counted in the scoreboard's infra column and never scored as the model's failure; the other episodes run to
their end in the same engine (was: the exception out of the engine's step ended the whole evaluation)."""

from __future__ import annotations

from typing import Any

from tests.agents.test_vllm_policy import _stand_in
from tests.agents.test_vllm_turn_faults import failing_first_prompt
from toolgym.agents.policy import SamplingParams
from toolgym.agents.runner import EpisodeRunner, episode_specs
from toolgym.agents.scoreboard import score
from toolgym.agents.vllm_policy import ServerBackend, VLLMPolicy
from toolgym.cli.agent_commands import _infra_verdict

ENV = "toolgym/Calculator-v0"


def test_eval_a_turn_no_server_answers_is_that_episodes_infra_failure(
    chatml_tokenizer: Any, make_tiny_model: Any
) -> None:
    httpd, failing = failing_first_prompt()
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    backend.backoff_s = 0.01
    policy = VLLMPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer, backend, capacity=1024)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    specs = episode_specs([ENV], 2, prompt_format="text", max_turns=2)  # seeds 0 and 1: two prompts
    try:
        with EpisodeRunner(policy, concurrency=2, sampling=sampling) as runner:
            assert runner.continuous
            trajs = runner.run(specs)
            assert len(trajs) == 2  # every episode came back, in the order of the specs
            lost = [t for t in trajs if t.infra_failure]
            assert len(lost) == 1
            bad = lost[0]
            assert bad.truncation == "env_error" and bad.truncated and not bad.success
            assert bad.error is not None and "rollout server" in bad.error and "503" in bad.error
            other = next(t for t in trajs if t is not bad)
            assert other.error is None and other.turns >= 1  # it ran on, to its end
            board = score(trajs)[0]
            assert (board.episodes, board.scored, board.infra_failures) == (2, 1, 1)
            assert _infra_verdict(trajs) == 0  # some failed among others: reported in the table only
            assert not policy.engine.live  # nothing left waiting in the engine
            failing["on"] = False  # the server is back: the same runner (its pooled envs) runs both
            again = runner.run(specs)
            assert [t.error for t in again] == [None, None]
    finally:
        policy.close()
        httpd.shutdown()


def test_eval_every_turn_lost_is_an_infra_verdict(chatml_tokenizer: Any, make_tiny_model: Any) -> None:
    """No server answers at all: every episode is an infra failure and ``toolgym eval`` exits 1 saying so
    (a scoreboard of zeros would read as the model's failure)."""
    httpd = _stand_in(lambda path, raw: (503, b'{"error": "down"}'))
    backend = ServerBackend([f"http://127.0.0.1:{httpd.server_address[1]}"])
    backend.backoff_s = 0.01
    policy = VLLMPolicy(make_tiny_model(len(chatml_tokenizer)), chatml_tokenizer, backend, capacity=1024)
    specs = episode_specs([ENV], 3, prompt_format="text", max_turns=2)
    try:
        with EpisodeRunner(policy, concurrency=3, sampling=SamplingParams(max_new_tokens=4)) as runner:
            trajs = runner.run(specs)
        assert len(trajs) == 3 and all(t.truncation == "env_error" for t in trajs)
        assert score(trajs)[0].infra_failures == 3 and _infra_verdict(trajs) == 1
    finally:
        policy.close()
        httpd.shutdown()
