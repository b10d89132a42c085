"""Self-play rollouts on Werewolf: one group per learner seat, its budget copies of one deal as leaves,
rewards from the seat's own side, rows that are exactly the seat's tokens; frozen snapshots; a GRPO step
through the rollout hook."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import toolgym  # noqa: E402,F401
from tests.trainers.conftest import tiny_tokenizer  # noqa: E402
from toolgym.agents.policy import Generation  # noqa: E402
from toolgym.agents.rendering import ChatRenderer  # noqa: E402
from toolgym.errors import ConfigError  # noqa: E402
from toolgym.trainers.rollout import RolloutConfig, RolloutTask  # noqa: E402
from toolgym.trainers.selfplay import SelfPlayConfig, SelfPlayRollout, load_snapshot  # noqa: E402
from toolgym.trainers.tree import flatten  # noqa: E402

ENV = "toolgym/Werewolf-v0"
SMALL = {"n_players": 5, "max_days": 2}
_TARGETS = re.compile(r"one of: ([P\d, ]+)\.")


class RulePolicy:
    """A token policy that reads its prompt's last 'Your move:' line and makes a legal move (the first
    a random target; a fixed speech in the discussion), so games run to their end."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.tokenizer = tiny_tokenizer()
        self.renderer = ChatRenderer(self.tokenizer)
        self.calls = 0

    def generate(self, prompts: list[list[int]], sampling: Any = None) -> list[Generation]:
        self.calls += 1
        out = []
        for ids in prompts:
            text = self.renderer.decode(ids)
            move = text.rsplit("Your move:", 1)[-1]
            hit = _TARGETS.search(move)
            tool = next((t for t in ("kill", "inspect", "protect", "vote") if f"{t}(player)" in move), None)
            if hit and tool:
                reply = f'<tool_call>{{"name": "{tool}", "arguments": {{"player": "{self.rng.choice(hit.group(1).split(", "))}"}}}}</tool_call>'
            else:
                reply = "I suspect P1."
            toks = [*self.renderer.encode(reply), self.renderer.end_of_turn_id]
            out.append(Generation(toks, [-0.5] * len(toks), "stop"))
        return out


def test_groups_rewards_and_rows() -> None:
    policy = RulePolicy()
    roller = SelfPlayRollout(
        policy,
        RolloutConfig(budget=3, max_total_tokens=20_000),
        SMALL,
        {"learner_seats": 2, "others": "basic"},
    )
    forest, stats = roller.run([RolloutTask(ENV, 4), RolloutTask(ENV, 9)], seed=0)
    assert (
        3 <= len(forest) <= 4
    )  # 2 tasks x 2 learner seats (a seat killed on night 1 in every copy: no group)
    assert all(1 <= len(t.leaves()) <= 3 for t in forest) and stats.generated_tokens > 0
    for tree in forest:
        if True:
            for leaf in tree.leaves():
                ep = tree.nodes[leaf].info["episode"]
                assert not ep["truncated"]
                # the reward is the seat's side's outcome (no penalties: the rule policy's moves are legal)
                assert tree.nodes[leaf].reward == float(ep["success"])
                assert ep["invalid_turns"] == 0
    rows = flatten(forest)
    assert len(rows) == sum(len(t.leaves()) for t in forest) >= 6
    for row in rows:
        text = policy.renderer.decode(row.token_ids)
        seat = forest[row.tree].meta["seat"]
        assert f"You are {seat}" in text  # the seat's own transcript
        trained = policy.renderer.decode([t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m])
        assert "Your move" not in trained and ("tool_call" in trained or "I suspect" in trained)
    roller.close()


def test_learner_side_and_bad_options() -> None:
    roller = SelfPlayRollout(
        RulePolicy(),
        RolloutConfig(budget=1, max_total_tokens=20_000),
        SMALL,
        {"learner_seats": 1, "side": "werewolves"},
    )
    forest, _ = roller.run([RolloutTask(ENV, s) for s in range(3)], seed=1)
    for tree in forest:
        game = roller.rules(ENV).new_game()
        game.reset(seed=tree.meta["seed"])
        assert game.roles[tree.meta["seat"]] == "werewolf"
    with pytest.raises(ConfigError, match="unknown selfplay options"):
        SelfPlayConfig.from_dict({"seats": 2})
    with pytest.raises(ConfigError, match="snapshot"):
        SelfPlayConfig.from_dict({"snapshot": "/no/such/folder"})


def test_token_budget_truncates_the_table() -> None:
    roller = SelfPlayRollout(RulePolicy(), RolloutConfig(budget=2, max_total_tokens=1000), SMALL, {})
    forest, _ = roller.run([RolloutTask(ENV, 1)], seed=0)
    eps = [t.nodes[leaf].info["episode"] for t in forest for leaf in t.leaves()]
    assert all(
        e["truncated"] and e["truncation"] == "token_budget" and e["episode_reward"] == 0.0 for e in eps
    )


def test_frozen_snapshot_seats(tmp_path: Path) -> None:
    from tests.trainers.conftest import tiny_model
    from toolgym.agents.hf import HFPolicy

    tok = tiny_tokenizer()
    live = HFPolicy(tiny_model(len(tok)), tok)
    frozen = load_snapshot(live, "initial")
    assert frozen.model is not live.model
    with torch.no_grad():
        for p in live.model.parameters():
            p.add_(1.0)
    torch.save(live.model.state_dict(), tmp_path / "model.pt")
    loaded = load_snapshot(live, str(tmp_path))
    first = next(iter(loaded.model.parameters()))
    assert torch.equal(first, next(iter(live.model.parameters())))
    assert not torch.equal(first, next(iter(frozen.model.parameters())))

    rule = RulePolicy()
    rule.model = tiny_model(len(tok))  # the frozen copy's weights; its answers come from HF generation
    roller = SelfPlayRollout(
        rule, RolloutConfig(budget=1, max_new_tokens=4, max_total_tokens=20_000), SMALL,
        {"learner_seats": 1, "frozen_seats": 1, "max_turns_per_seat": 3},
    )  # fmt: skip
    roller.frozen = _Counting(roller.frozen)
    forest, _ = roller.run([RolloutTask(ENV, 2)], seed=0)
    assert roller.frozen.calls > 0  # the frozen seat answered with its own model (random: no legal move)
    assert (
        all(t.meta["seat"] != "frozen" for t in forest) and len(forest) <= 1
    )  # only the learner has a group


class _Counting:
    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def generate(self, prompts: list[list[int]], sampling: Any = None) -> list[Generation]:
        self.calls += 1
        return list(self.inner.generate(prompts, sampling))


def test_grpo_step_through_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """grpo.train rolls out with SelfPlayRollout when cfg.selfplay is set (the seats' policy swapped here)."""
    from tests.trainers.conftest import tiny_model
    from toolgym.trainers import grpo

    seen: list[Any] = []

    def roller(
        policy: Any, cfg: RolloutConfig, env_kwargs: dict[str, Any], options: Any, initial: str | None = None,
        engine_memory: float = 1 / 3, kv_budget: int | None = None,
    ) -> Any:  # fmt: skip
        # the rule policy plays (same tokenizer): games end with wins and losses, so the advantages are not 0
        # the hook names the run's starting model: a resumed run's "initial" snapshot is that, not the checkpoint
        # and the run's engine_memory (the frozen engine's budget; no byte budget off CUDA)
        assert initial and engine_memory == 0.25 and kv_budget is None
        seen.append(options)
        return SelfPlayRollout(RulePolicy(), cfg, env_kwargs, options)

    cfg_selfplay = {"learner_seats": 3}
    monkeypatch.setattr(grpo, "SelfPlayRollout", roller)
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.config.max_position_embeddings = 4096
    cfg = grpo.GRPOConfig(
        env_ids=[ENV], env_kwargs=SMALL, steps=1, prompts_per_step=2, budget=3, max_new_tokens=4,
        max_total_tokens=4000, lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_every=0,
        eval_episodes=1, micro_batch_rows=4, output_dir=str(tmp_path), selfplay=cfg_selfplay, engine_memory=0.25,
    )  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    metrics = grpo.train(cfg, model, tok)
    assert 6.0 <= metrics["rollout/episodes"] <= 18.0  # 2 deals x 3 seats x 3 copies (less: seats out early)
    assert "losses/policy_loss" in metrics or any(k.startswith("losses/") for k in metrics)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert seen == [cfg_selfplay]


def test_selfplay_refuses_async(tmp_path: Path) -> None:
    from tests.trainers.conftest import tiny_model
    from toolgym.errors import ConfigError
    from toolgym.trainers import grpo

    tok = tiny_tokenizer()
    with pytest.raises(ConfigError, match="selfplay"):  # at config load (it was at the start of the run)
        cfg = grpo.GRPOConfig(
            env_ids=[ENV], env_kwargs=SMALL, steps=1, prompts_per_step=2, budget=3, max_new_tokens=4,
            max_total_tokens=4000, device="cpu", tensorboard=False, progress=False, eval_every=0,
            output_dir=str(tmp_path), selfplay={"learner_seats": 3}, max_staleness=1,
        )  # fmt: skip
        grpo.train(cfg, tiny_model(len(tok)), tok)


def test_initial_snapshot_is_the_starting_model_after_a_resume(tmp_path: Path) -> None:
    """A resumed run builds its roller after loading the checkpoint: with ``initial`` (the run's starting
    model) the "initial" snapshot is that model's weights, not the resumed live weights."""
    from tests.trainers.conftest import tiny_model
    from toolgym.agents.hf import HFPolicy

    tok = tiny_tokenizer()
    start = tiny_model(len(tok))
    start.save_pretrained(tmp_path / "start")
    tok.save_pretrained(tmp_path / "start")
    live = HFPolicy(tiny_model(len(tok), seed=1), tok)  # the checkpoint's weights, after some training
    first = next(iter(live.model.parameters()))
    kept = load_snapshot(live, "initial", str(tmp_path / "start"))
    assert torch.equal(next(iter(kept.model.parameters())), next(iter(start.parameters())))
    assert not torch.equal(next(iter(kept.model.parameters())), first)
    assert torch.equal(
        next(iter(load_snapshot(live, "initial").model.parameters())), first
    )  # no initial given
    rule = RulePolicy()
    rule.model = live.model
    roller = SelfPlayRollout(
        rule, RolloutConfig(budget=1, max_new_tokens=4, max_total_tokens=20_000), SMALL,
        {"learner_seats": 1, "frozen_seats": 1, "max_turns_per_seat": 2}, initial=str(tmp_path / "start"),
    )  # fmt: skip
    forest, _ = roller.run([RolloutTask(ENV, 2)], seed=0)
    assert all(t.meta["snapshot"] == f"initial:{tmp_path / 'start'}" for t in forest)
