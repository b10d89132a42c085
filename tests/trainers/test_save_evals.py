"""``save_evals``: each held-out evaluation's episodes land in evals/ in the viewer's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_grpo_writes_each_evaluation(tmp_path: Path) -> None:
    from tests.trainers.conftest import FAKE_ENV, register_fake_env, tiny_model, tiny_tokenizer
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.grpo import train as train_grpo

    register_fake_env()
    tokenizer = tiny_tokenizer()
    cfg = GRPOConfig(
        steps=2, output_dir=str(tmp_path), env_ids=[FAKE_ENV], env_kwargs={}, prompts_per_step=1, budget=2,
        max_new_tokens=6, max_total_tokens=256, device="cpu", tensorboard=False, progress=False,
        eval_episodes=3, eval_every=2, micro_batch_rows=4, save_evals=True,
    )  # fmt: skip
    train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert sorted(p.name for p in (tmp_path / "evals").iterdir()) == [
        "step_000000.jsonl",
        "step_000002.jsonl",
    ]
    trees = [json.loads(x) for x in (tmp_path / "evals" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trees) == 3  # one greedy episode a held-out seed
    for tree in trees:
        leaves = [n for n in tree["nodes"] if not n["children"] and n["id"] != 0]
        assert len(leaves) == 1 and leaves[0]["reward"] is not None
    assert not (tmp_path / "rollouts").exists()  # the training rollouts stay opt-in on their own


def test_off_by_default(tmp_path: Path) -> None:
    from toolgym.trainers.grpo import GRPOConfig

    assert GRPOConfig().save_evals is False
