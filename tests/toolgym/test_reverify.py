"""`toolgym reverify`: saved rollouts of real Calculator-v0 episodes, rescored without a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import toolgym  # noqa: F401  (registers the ids)
from tests.trainers.conftest import tiny_tokenizer
from toolgym.cli import main
from toolgym.envs.base import tool_env
from toolgym.errors import ConfigError
from toolgym.rewards import exact_match, numeric_match
from toolgym.trainers.reverify import reverify
from toolgym.trainers.saved_rollouts import save_step
from toolgym.trainers.tree import RolloutTree


def _answer_call(value: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'answer', 'arguments': {'answer': value}})}</tool_call>"


def play(tok: Any, seed: int, plans: list[list[str]]) -> RolloutTree:
    """One tree: each plan (a list of actions, "{N}" standing for the true answer) is one rollout from the
    prompt, played in a fresh Calculator-v0 episode of `seed`; the nodes hold what TreeRollout records."""
    env = tool_env(gym.make("toolgym/Calculator-v0", digits=3, max_turns=3))
    obs, info = env.reset(seed=seed)
    prompt = "\n".join(m["content"] for m in obs)
    tree = RolloutTree(f"toolgym/Calculator-v0#{seed}", tok.encode(prompt))
    tree.meta.update(env_id="toolgym/Calculator-v0", seed=seed, tools=info["tools"], answer=env.task.answer)
    for plan in plans:
        env.reset(seed=seed)
        parent, total = tree.root, 0.0
        for turn, action in enumerate(plan):
            action = action.replace("{N}", str(env.task.answer)).replace("{N+1}", str(env.task.answer + 1))
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            nid = tree.add(parent, "model", tok.encode(action), turn=turn, step_reward=reward)
            if terminated or truncated:
                tree.nodes[nid].info["episode"] = {
                    "success": info["success"], "truncation": info.get("truncation"),
                    "episode_reward": info["episode_reward"], "turns": turn + 1, "tool_calls": 0,
                    "void": False, "tokens": 0,
                }  # fmt: skip
                tree.set_reward(nid, info["episode_reward"])
                break
            parent = tree.add(nid, "tool", tok.encode("\n".join(m["content"] for m in obs)), turn=turn)
    env.close()
    return tree


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
PLANS = [
    ["<answer>{N}</answer>"],  # right: 1
    ["<think>maybe {N+1}</think><answer>{N+1}</answer>"],  # wrong: 0
    [CALL, _answer_call("{N}")],  # right, through the answer tool
    [CALL, "The answer is <answer>{N}.0</answer>"],  # right (numerically)
    [CALL, CALL, CALL],  # the turn limit: no answer, not rescored
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = tiny_tokenizer()
    out = tmp_path_factory.mktemp("run")
    for step in (2, 4):
        forest = [play(tok, seed, PLANS) for seed in range(step, step + 3)]
        save_step(out, step, forest, [], None, None, tok.decode)
    return out


def test_same_reward_reproduces_the_stored_rewards_exactly(run_dir: Path) -> None:
    report = reverify(run_dir, numeric_match)  # Calculator-v0's correctness reward
    # 2 files x 3 trees x 4 answered rollouts; the turn-limit rollout of each tree is counted, not rescored
    assert report.files == 2 and report.episodes == 24 and report.skipped == {"turn_limit": 6}
    assert report.same == 24 and report.changed == 0 and report.flips_up == report.flips_down == 0
    assert report.old_mean == report.new_mean == 18 / 24  # 3 of 4 answers right in every tree


def test_another_reward_shows_its_flips(run_dir: Path) -> None:
    report = reverify(run_dir, exact_match)  # string equality after SQuAD normalisation: "N.0" != "N"
    assert report.episodes == 24 and report.changed == 6 and report.flips_down == 6 and report.flips_up == 0
    assert {c.final for c in report.changes} == {
        c.final for c in report.changes if c.final.endswith(".0</answer>")
    }
    only_step_4 = reverify(run_dir, exact_match, steps={4})
    assert only_step_4.files == 2 and only_step_4.episodes == 12 and only_step_4.flips_down == 3


def test_cli_prints_counts_and_the_flip_table(run_dir: Path, capsys: Any, tmp_path: Path) -> None:
    out_json = tmp_path / "report.json"
    assert main(["reverify", str(run_dir), "--reward", "exact_match", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "rescored 24 answered episodes from 2 files (not answered: turn_limit 6)" in text
    assert "6 pass->fail" in text and "flips (6):" in text
    assert json.loads(out_json.read_text())["flips_down"] == 6
    assert main(["reverify", str(run_dir), "--reward", "numeric_match"]) == 0
    assert "same 24, changed 0" in capsys.readouterr().out


def test_a_folder_without_rollouts_is_a_clear_error(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(ConfigError, match="save_rollouts"):
        reverify(tmp_path, numeric_match)
    assert main(["reverify", str(tmp_path), "--reward", "numeric_match"]) == 2
    assert "save_rollouts" in capsys.readouterr().err
