"""The loops on CPU with a tiny random Llama: every trainable parameter moves; save -> resume is exact."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.conftest import FAKE_ENV, register_fake_env, tiny_model
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.grpo import train as train_grpo
from toolgym.trainers.metrics_log import NAMESPACES
from toolgym.trainers.ppo import PPOConfig
from toolgym.trainers.ppo import train as train_ppo

SMALL: dict[str, Any] = dict(
    env_ids=[FAKE_ENV], env_kwargs={}, prompts_per_step=2, budget=4, max_new_tokens=6, max_total_tokens=256,
    lr=1e-2, device="cpu", tensorboard=False, progress=False, eval_episodes=2, micro_batch_rows=4,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _env() -> None:
    register_fake_env()


def snapshot(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (folder / "metrics.jsonl").read_text().splitlines()]


def documented_metrics() -> list[re.Pattern[str]]:
    """The metric names of docs/trainer.md's table (`rollout/dropped_<filter>` matches any filter)."""
    text = (Path(__file__).parents[2] / "docs" / "trainer.md").read_text()
    table = text.split("## Logged metrics", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"`((?:charts|losses|rollout|eval|time)/[^`]+)`", table)
    return [re.compile(re.sub(r"<[a-z]+>", "[a-z_]+", re.escape(n)) + "$") for n in names]


def assert_namespaced(folder: Path, metrics: dict[str, float]) -> None:
    """Every logged key lies under charts/, losses/, rollout/, eval/ or time/ and has a row in docs/trainer.md."""
    keys = set(metrics) | {k for r in records(folder) for k in r if k != "step"}
    assert keys and not sorted(k for k in keys if not k.startswith(NAMESPACES))
    documented = documented_metrics()
    assert not sorted(k for k in keys if not any(p.match(k) for p in documented))


def test_grpo_two_steps_move_every_parameter(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model(len(tokenizer))
    before = snapshot(model)
    metrics = train_grpo(GRPOConfig(steps=2, output_dir=str(tmp_path), **SMALL), model, tokenizer)
    after = snapshot(model)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    assert [r["step"] for r in records(tmp_path)] == [1, 2]
    for key in ("charts/episode_reward", "charts/success", "losses/policy", "losses/approx_kl", "losses/clipfrac",
                "rollout/tokens_per_s", "eval/success", "rollout/zero_variance_fraction"):  # fmt: skip
        assert key in metrics, key
    assert (tmp_path / "reward.png").is_file() and (tmp_path / "checkpoint" / "model.pt").is_file()
    assert_namespaced(tmp_path, metrics)


def test_grpo_resume_gives_the_same_next_step(tmp_path: Path, tokenizer: Any) -> None:
    """A fixed trainer bug: with kl_coef > 0 the reference must stay the initial policy after a resume (it was
    the checkpoint, so the step-2 KL was 0 instead of its uninterrupted value)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    opts = dict(SMALL, kl_coef=0.1)
    m1 = tiny_model(len(tokenizer))
    train_grpo(GRPOConfig(steps=2, output_dir=str(straight), **opts), m1, tokenizer)
    train_grpo(GRPOConfig(steps=1, output_dir=str(split), **opts), tiny_model(len(tokenizer)), tokenizer)
    m2 = tiny_model(len(tokenizer), seed=123)  # different init: everything must come from the checkpoint
    train_grpo(GRPOConfig(steps=2, output_dir=str(split), resume=True, **opts), m2, tokenizer)
    a, b = records(straight)[-1], records(split)[-1]
    assert a["step"] == b["step"] == 2
    assert a["losses/kl_ref"] > 0  # the policy moved away from the initial one in step 1
    for k in a:
        if not k.startswith(("time/", "rollout/generate_s", "rollout/env_s", "rollout/tokens_per_s")):
            assert a[k] == b[k], k
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2), n


def test_grpo_with_arpo_branching_and_gigpo(tmp_path: Path, tokenizer: Any) -> None:
    cfg = GRPOConfig(
        steps=1, output_dir=str(tmp_path), branching="turn_entropy", estimator="gigpo", budget=6, epochs=2,
        branch_kwargs={"entropy_weight": 0.0, "tau": 0.0}, **{k: v for k, v in SMALL.items() if k != "budget"},
    )  # fmt: skip
    metrics = train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert metrics["rollout/branches_per_tree"] == 3.0  # tau 0: every tool boundary forks until 6 leaves
    assert metrics["rollout/episodes"] == 12.0
    assert metrics["losses/approx_kl"] > 0  # the second epoch sees a moved policy


def test_ppo_two_steps_move_every_parameter(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model(len(tokenizer))
    before = snapshot(model)
    metrics = train_ppo(PPOConfig(steps=2, output_dir=str(tmp_path), **SMALL), model, tokenizer)
    after = snapshot(model)
    assert not [n for n in before if torch.equal(before[n], after[n])]
    assert "losses/value" in metrics and "losses/policy" in metrics and "losses/explained_variance" in metrics
    assert_namespaced(tmp_path, metrics)


def test_forward_aligns_logprobs_and_entropy(tokenizer: Any) -> None:
    from toolgym.trainers.batch import collate, forward
    from toolgym.trainers.tree import Row

    model = tiny_model(len(tokenizer))
    rows = [Row(0, 1, (0, 1), [5, 6, 7, 8], [0, 1, 1, 1], [0, 1, 1, 1], [-1, 0, 0, 0], [0.0] * 4, [0.0] * 4),
            Row(0, 2, (0, 2), [5, 9], [0, 1], [0, 2], [-1, 0], [0.0] * 2, [0.0] * 2)]  # fmt: skip
    batch = collate(rows, [[0.0] * 4, [0.0] * 2], [1.0, 0.0], [True, False], pad_id=0)
    assert batch.loss_mask[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # dropped row keeps no loss mask
    logp, ent, _ = forward(model, batch, temperature=0.5, entropy=True)
    logits = model(input_ids=batch.input_ids[:1]).logits[0].float() / 0.5  # [T, V]
    ref = torch.log_softmax(logits, -1)
    expect = [0.0] + [ref[t - 1, batch.input_ids[0, t]].item() for t in range(1, 4)]
    assert logp[0].tolist() == pytest.approx(expect, abs=1e-5)
    assert ent is not None and ent[0, 2].item() == pytest.approx(
        -(ref[1].exp() * ref[1]).sum().item(), abs=1e-4
    )


def test_ppo_resume_gives_the_same_next_step(tmp_path: Path, tokenizer: Any) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    opts = dict(SMALL, kl_coef=0.1)
    m1 = tiny_model(len(tokenizer))
    train_ppo(PPOConfig(steps=2, output_dir=str(straight), **opts), m1, tokenizer)
    train_ppo(PPOConfig(steps=1, output_dir=str(split), **opts), tiny_model(len(tokenizer)), tokenizer)
    m2 = tiny_model(len(tokenizer), seed=7)
    train_ppo(PPOConfig(steps=2, output_dir=str(split), resume=True, **opts), m2, tokenizer)
    a, b = records(straight)[-1], records(split)[-1]
    assert a["losses/policy"] == b["losses/policy"] and a["losses/value"] == b["losses/value"]
    assert a["losses/kl_ref"] == b["losses/kl_ref"] > 0
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2), n


@pytest.mark.parametrize(
    "options",
    [
        dict(kl_coef=0.01, filter_void=True, overlong_buffer=100, estimator="tree", shared="once", ratio_level="turn",
             llds_coef=0.2, entropy_advantage=0.2, entropy_coef=0.01, agg="seq_mean", is_mode="sequence_mask",
             aepo_clip=True, minibatches=2),
        dict(branching="token_entropy", estimator="treerl", agg="constant", dual_clip=0.0, epochs=2),
        dict(branching="branching_score", estimator="rloo", ratio_level="sequence"),
        dict(estimator="igpo", filter_zero_variance=False, igpo_norm="separate", igpo_gamma=0.9),
        dict(objective="cispo", minibatches=2, kl_coef=0.01, kl_estimator="k3+", top_entropy_quantile=0.5,
             grpo_scale="batch", mask_truncated_completions=True),
        dict(branching="fixed_segments", branch_kwargs={"segment_tokens": 3, "iterations": 1}, estimator="treepo",
             shared="once", delta=4.0, epochs=2, remove_clip=True),
        dict(branching="turn_entropy", branch_kwargs={"dynamic_split": True}, estimator="spo_std",
             acc_filter_low=0.0, acc_filter_high=0.99, kl_coef=0.01, kl_estimator="k1", kl_in_reward=True),
        dict(estimator="hgpo", hgpo_base_group=True, gigpo_mode="mean_std_norm"),
        dict(estimator="gigpo", gigpo_similarity=0.9, gigpo_mode="mean_std_norm"),
    ],
    ids=["many-loss-options", "treerl", "appo", "igpo", "cispo", "treepo", "aepo-split", "hgpo", "gigpo-sim"],
)  # fmt: skip
def test_grpo_options_run_one_step(tmp_path: Path, tokenizer: Any, options: dict[str, Any]) -> None:
    metrics = train_grpo(
        GRPOConfig(steps=1, output_dir=str(tmp_path), **SMALL, **options),
        tiny_model(len(tokenizer)),
        tokenizer,
    )
    assert metrics["rollout/episodes"] >= 8 and "losses/policy" in metrics


def test_toolgym_train_command(tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from toolgym.cli import main

    model_dir = tmp_path / "tiny"
    tiny_model(len(tokenizer)).save_pretrained(model_dir)  # type: ignore[attr-defined]
    tokenizer.save_pretrained(model_dir)
    argv = ["train", "--model", str(model_dir), "--env-ids", FAKE_ENV, "--env-kwargs", "{}", "--steps", "1",
            "--prompts-per-step", "2", "--budget", "2", "--max-new-tokens", "4", "--device", "cpu",
            "--eval-episodes", "1", "--no-tensorboard", "--no-progress", "--output-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0
    assert "charts/episode_reward=" in capsys.readouterr().out
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_minibatches_make_llds_act(tmp_path: Path, tokenizer: Any) -> None:
    """A fixed trainer bug: with one optimizer step per batch old = logp.detach(), so LLDS's drop term is 0 and
    the weights after a step are the same for llds_coef 0 and 5. With two minibatches the second step sees
    a moved policy, and LLDS changes the result."""

    def run(llds: float, minibatches: int, name: str) -> dict[str, torch.Tensor]:
        model = tiny_model(len(tokenizer))
        small = {**SMALL, "budget": 2, "max_new_tokens": 4, "eval_episodes": 1}
        cfg = GRPOConfig(steps=1, output_dir=str(tmp_path / name), llds_coef=llds, minibatches=minibatches,
                         filter_zero_variance=False, **small)  # fmt: skip
        metrics = train_grpo(cfg, model, tokenizer)
        assert metrics["losses/updates"] == minibatches
        return snapshot(model)

    same_a, same_b = run(0.0, 1, "a"), run(5.0, 1, "b")
    assert all(torch.equal(same_a[n], same_b[n]) for n in same_a)
    diff_a, diff_b = run(0.0, 2, "c"), run(5.0, 2, "d")
    assert any(not torch.equal(diff_a[n], diff_b[n]) for n in diff_a)


def test_refill_draws_until_enough_groups_survive(tmp_path: Path, tokenizer: Any) -> None:
    """An accuracy filter that no group passes here (success rate must be 0; the fake env succeeds 6 times in
    7) makes refill draw max_gen_batches rounds of prompts_per_step tasks: the data position advances 3 x 2."""
    small = {**SMALL, "max_new_tokens": 4, "eval_episodes": 1}
    cfg = GRPOConfig(steps=1, output_dir=str(tmp_path), refill=True, max_gen_batches=3, acc_filter_low=0.0,
                     acc_filter_high=0.0, **small)  # fmt: skip
    metrics = train_grpo(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert metrics["rollout/gen_batches"] == 3.0
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    assert state["data_pos"] == 6


@pytest.mark.parametrize(
    "options",
    [
        dict(critic="turn", ratio_level="turn", kl_coef=0.05, kl_in_reward=True, minibatches=2),
        dict(kl_coef=0.05, kl_estimator="k2", epochs=1, max_total_tokens=60),
    ],
    ids=["st-ppo", "truncating"],
)
def test_ppo_options_run_one_step(tmp_path: Path, tokenizer: Any, options: dict[str, Any]) -> None:
    opts = {**SMALL, **options}
    metrics = train_ppo(
        PPOConfig(steps=1, output_dir=str(tmp_path), **opts), tiny_model(len(tokenizer)), tokenizer
    )
    assert "losses/value" in metrics
    if opts["max_total_tokens"] == 60:  # (the 54-token first prompt fits; the second does not)
        assert metrics["rollout/truncated_rows"] > 0  # token-budget truncation reaches GAE as truncated


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_evaluations_run_on_eval_env_kwargs(
    tmp_path: Path, tokenizer: Any, algo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held-out evaluations get env_kwargs with eval_env_kwargs on top (PPO once passed env_kwargs alone, it
    had no eval_env_kwargs: a `split: test` evaluation was not possible)."""
    from toolgym.trainers import grpo, ppo

    module: Any = grpo if algo == "grpo" else ppo
    seen: list[dict[str, Any]] = []

    def spy(policy: Any, env_ids: Any, env_kwargs: dict[str, Any], *args: Any, **kw: Any) -> dict[str, float]:
        seen.append(dict(env_kwargs))
        return {}

    monkeypatch.setattr(module, "evaluate", spy)
    opts = dict(
        SMALL, env_kwargs={"max_turns": 2, "format_penalty": -0.1}, eval_env_kwargs={"format_penalty": 0.0}
    )
    cfg: Any = (GRPOConfig if algo == "grpo" else PPOConfig)(steps=1, output_dir=str(tmp_path), **opts)
    (train_grpo if algo == "grpo" else train_ppo)(cfg, tiny_model(len(tokenizer)), tokenizer)
    assert seen and all(kw == {"max_turns": 2, "format_penalty": 0.0} for kw in seen)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_curves_start_at_the_initial_policy(
    tmp_path: Path, tokenizer: Any, algo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both trainers evaluate before their first step (PPO's curves once began at its first eval_every step,
    so a comparison at equal tokens had no common starting point)."""
    from toolgym.trainers import grpo, ppo

    module: Any = grpo if algo == "grpo" else ppo
    monkeypatch.setattr(module, "evaluate", lambda *a, **k: {"eval/success": 0.25})
    cfg: Any = (GRPOConfig if algo == "grpo" else PPOConfig)(
        steps=1, output_dir=str(tmp_path), **dict(SMALL, eval_every=1)
    )
    (train_grpo if algo == "grpo" else train_ppo)(cfg, tiny_model(len(tokenizer)), tokenizer)
    records = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval/success" in r] == [0, 1]
