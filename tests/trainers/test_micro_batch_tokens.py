"""`micro_batch_tokens`: micro-batches cut by a token budget instead of a row count (`batch.micro_batches`).
The rule on hand examples; GRPO's and PPO's updates reach the same weights as with row micro-batches (only the
grouping of a minibatch's gradient sum changes); the config key, flag and its check."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.processes import run
from tests.trainers.conftest import register_fake_env, tiny_model
from tests.trainers.test_train import SMALL
from toolgym.cli import build_parser
from toolgym.cli.train import resolve
from toolgym.errors import ConfigError
from toolgym.trainers.batch import TrainBatch, micro_batches
from toolgym.trainers.grpo_config import GRPOConfig
from toolgym.trainers.grpo_update import optimize
from toolgym.trainers.packing import update_forward
from toolgym.trainers.ppo_config import PPOConfig

# ----- the chunking rule ----------------------------------------------------------------------------------------


def chunks_of(lengths: list[int], tokens: int, order: list[int] | None = None) -> list[list[int]]:
    o = torch.tensor(order) if order is not None else None
    n = len(order) if order is not None else len(lengths)
    return [c.tolist() for c in micro_batches(n, 3, o, lengths, tokens)]


def test_rows_go_longest_first_while_the_padded_size_fits() -> None:
    lengths = [4, 10, 3, 6, 5, 2]  # longest first: 1 (10), 3 (6), 4 (5), 0 (4), 2 (3), 5 (2)
    # 10 + 6 would pad to 2 x 10 = 20 > 12; 6, 5 pad to 12; 4, 3, 2 pad to 12
    assert chunks_of(lengths, 12) == [[1], [3, 4], [0, 2, 5]]
    # a large budget: one chunk whatever micro_batch_rows (here 3) says
    assert chunks_of(lengths, 1000) == [[1, 3, 4, 0, 2, 5]]


def test_a_row_longer_than_the_budget_goes_alone() -> None:
    assert chunks_of([3, 50, 2, 40], 8) == [[1], [3], [0, 2]]
    assert chunks_of([50, 40], 8) == [[0], [1]]


@pytest.mark.parametrize("tokens", [1, 7, 16, 33, 100, 10_000])
def test_every_row_once_and_every_chunk_within_budget(tokens: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    lengths = torch.randint(1, 40, (23,), generator=g).tolist()
    order = torch.randperm(23, generator=g)[:15].tolist()  # a minibatch's rows, in the update's order
    got = chunks_of(lengths, tokens, order)
    assert sorted(r for c in got for r in c) == sorted(order)
    flat = [lengths[r] for c in got for r in c]
    assert flat == sorted(flat, reverse=True)  # longest first across the chunks
    for c in got:
        assert len(c) == 1 or len(c) * max(lengths[r] for r in c) <= tokens


def test_no_rows_no_chunks_and_a_budget_needs_lengths() -> None:
    assert micro_batches(0, 4, lengths=[], tokens=10) == []
    with pytest.raises(ValueError, match="lengths"):
        micro_batches(3, 4, tokens=10)


def test_budget_off_chunks_as_before() -> None:
    lengths = [3, 9, 1, 8, 5]
    want = [c.tolist() for c in micro_batches(5, 2, lengths=lengths)]
    assert (
        [c.tolist() for c in micro_batches(5, 2, lengths=lengths, tokens=0)] == want == [[1, 3], [4, 0], [2]]
    )


# ----- the GRPO update: same weights as with row micro-batches ------------------------------------------------

VOCAB = 48


def varied_batch(lengths: list[int], seed: int = 0) -> TrainBatch:
    """Rows of random tokens, the second half of each trained, with a random advantage per row."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    adv = torch.zeros((B, T))
    turns = torch.full((B, T), -1, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        attn[i, :n] = 1
        mask[i, n // 2 : n] = 1
        adv[i, :n] = torch.randn((), generator=g)
        turns[i, n // 2 : n] = 0
    return TrainBatch(ids, attn, mask, adv, torch.zeros((B, T)), turns, torch.zeros(B), torch.zeros(B))


def grpo_weights(packed: bool = False, **kw: Any) -> dict[str, torch.Tensor]:
    base: dict[str, Any] = dict(
        env_ids=["x"],
        device="cpu",
        is_mode="none",
        progress=False,
        epochs=2,
        minibatches=2,
        entropy_coef=0.01,
    )
    cfg = GRPOConfig(**{**base, **kw})
    model: Any = tiny_model(VOCAB, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = varied_batch([5, 31, 9, 18, 3, 26, 12, 7, 22, 14])
    optimize(cfg, 1, batch, model, model, opt, fwd=update_forward(packed, chunk=16))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    ("agg", "packed"), [("token_mean", False), ("seq_mean", False), ("token_mean", True)]
)
def test_grpo_update_with_a_token_budget_equals_row_micro_batches(agg: str, packed: bool) -> None:
    rows = grpo_weights(packed, agg=agg, micro_batch_rows=2)
    start = {k: v.detach().clone() for k, v in tiny_model(VOCAB, seed=3).state_dict().items()}  # type: ignore[attr-defined]
    assert any(not torch.equal(rows[k], start[k]) for k in rows)  # the update moved the weights
    for tokens in (40, 64, 10_000):  # rows of 31 alone, several chunks, one chunk per minibatch
        budget = grpo_weights(packed, agg=agg, micro_batch_rows=2, micro_batch_tokens=tokens)
        for k in rows:
            torch.testing.assert_close(budget[k], rows[k], rtol=1e-5, atol=1e-6, msg=f"{k} (tokens={tokens})")


# ----- whole steps (PPO; GRPO with the KL in the reward): the same weights from the same seed -------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "opts"),
    [("ppo", {}), ("grpo", {"epochs": 2, "kl_coef": 0.05, "kl_in_reward": True})],
    ids=["ppo", "grpo_kl_in_reward"],
)
def test_one_step_with_a_token_budget_equals_row_micro_batches(
    tmp_path: Path, tokenizer: Any, algorithm: str, opts: dict[str, Any]
) -> None:
    """Every pass that chunks rows (old logprobs, PPO's values, the KL-in-reward scoring, the update) on a
    real rollout step."""
    from toolgym.trainers import grpo, ppo

    register_fake_env()
    cls, train = {"ppo": (PPOConfig, ppo.train), "grpo": (GRPOConfig, grpo.train)}[algorithm]
    weights = []
    # rows of ~100-150 tokens: 300 makes micro-batches of 2 rows where micro_batch_rows gives 4
    for name, kw in (("rows", {}), ("tokens", {"micro_batch_tokens": 300})):
        model: Any = tiny_model(len(tokenizer))
        cfg = cls(
            steps=1,
            output_dir=str(tmp_path / name),
            minibatches=2,
            **{**SMALL, "eval_episodes": 1},
            **opts,
            **kw,
        )
        train(cfg, model, tokenizer)
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    start = tiny_model(len(tokenizer)).state_dict()  # type: ignore[attr-defined]
    assert any(not torch.equal(weights[0][k], start[k]) for k in start)
    # AdamW (lr 1e-2, 2 epochs x 2 minibatches) turns float32 summation-order noise into ~4e-6 here
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], rtol=1e-4, atol=3e-5, msg=k)


# ----- 2 ranks: a budget gives the ranks different micro-batch counts; they stay in step ----------------------

# uneven_worker's cases (rows of 6, 9 or 12 tokens): under a 20-token budget rank 0's six rows take 4 micro-batches
# (12 | 12 | 9, 9 | 6, 6) and rank 1's two rows 1 (9, 6); with epochs 2 the old-logprob pass runs too
TOKEN_CASES: dict[str, tuple[list[int], list[int], bool, dict[str, Any]]] = {
    "tokens_unequal": ([0, 1, 2, 3, 4, 5], [6, 7], True, {"micro_batch_tokens": 20}),
    "tokens_epochs": ([0, 1, 2, 3, 4, 5], [6, 7], True, {"micro_batch_tokens": 20, "epochs": 2}),
}


def _rank_main() -> None:
    """Under torchrun (2 gloo ranks): each TOKEN_CASES update, rank 0's result saved as OUT/{case}.pt."""
    from tests.trainers import uneven_worker
    from toolgym.trainers.distributed import Dist

    torch.set_num_threads(1)
    out, parallel = sys.argv[1:3]
    uneven_worker.CASES.update(TOKEN_CASES)
    dist = Dist.from_env("cpu")
    for case in TOKEN_CASES:
        got = uneven_worker.update_case(out, parallel, case, dist)
        if dist.rank == 0:
            torch.save(got, f"{out}/{case}.pt")
    dist.close()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_with_a_token_budget_take_the_one_process_step(
    tmp_path: Path, parallel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.trainers import uneven_worker
    from tests.trainers.test_distributed import free_port
    from toolgym.trainers.distributed import Dist

    root = str(Path(__file__).resolve().parents[2])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), __file__, str(tmp_path), parallel]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    proc = run(cmd, timeout=300, env=env)  # TimeoutError on a hang
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in TOKEN_CASES:
        monkeypatch.setitem(uneven_worker.CASES, case, TOKEN_CASES[case])
        torch.manual_seed(0)
        want = uneven_worker.update_case(str(tmp_path), "ddp", case, Dist())
        got = torch.load(tmp_path / f"{case}.pt", weights_only=False)
        for name, w in want["weights"].items():
            torch.testing.assert_close(got["weights"][name], w, rtol=1e-5, atol=1e-6, msg=f"{case}: {name}")
        assert got["metrics"]["losses/updates"] == want["metrics"]["losses/updates"] > 0


# ----- config: YAML key, CLI flag, a negative value ------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_config_key_and_flag(tmp_path: Path, algorithm: str) -> None:
    cls = {"grpo": GRPOConfig, "ppo": PPOConfig}[algorithm]
    assert cls().micro_batch_tokens == 0  # off by default
    assert cls.from_dict({"micro_batch_tokens": 4096}).micro_batch_tokens == 4096
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(f"algorithm: {algorithm}\nmicro_batch_tokens: 2048\n")
    _, cfg = resolve(build_parser().parse_args(["train", "--config", str(cfg_file)]))
    assert cfg.micro_batch_tokens == 2048
    _, cfg = resolve(build_parser().parse_args(["train", algorithm, "--micro-batch-tokens", "512"]))
    assert isinstance(cfg, cls) and cfg.micro_batch_tokens == 512


def test_negative_budget_is_a_config_error() -> None:
    for cls in (GRPOConfig, PPOConfig):
        with pytest.raises(ConfigError, match="micro_batch_tokens must be >= 0"):
            cls(micro_batch_tokens=-1)


if __name__ == "__main__":
    _rank_main()


def test_micro_batch_rows_beside_a_token_budget_is_named_inert() -> None:
    from toolgym.trainers.grpo import GRPOConfig
    from toolgym.trainers.ppo import PPOConfig

    for cls in (GRPOConfig, PPOConfig):
        both = cls(micro_batch_tokens=4096, micro_batch_rows=32)
        assert any(w.startswith("micro_batch_rows: inert") for w in both.inert_options())
        assert not any("micro_batch_rows" in w for w in cls(micro_batch_tokens=4096).inert_options())
