"""DPO: the loss by hand on a toy batch, sequence log-probs against a hand sum, and a tiny CPU run whose loss
falls while the chosen responses' log-prob margin grows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.trainers.conftest import tiny_model, tiny_tokenizer  # noqa: E402
from toolgym.errors import ConfigError  # noqa: E402
from toolgym.trainers.dpo import DPOConfig, PreferencePair, dpo_loss, load_pairs, sequence_logps, train  # noqa: E402


def test_loss_by_hand() -> None:
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0])
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # pair 0: h = 0.5 * ((-1 + 1.5) - (-2 + 1.5)) = 0.5; pair 1: h = 0.5 * ((-3 + 2) - (-1 + 2)) = -1
    assert stats["margin"].tolist() == pytest.approx([0.5, -1.0])
    assert loss.tolist() == pytest.approx([math.log1p(math.exp(-0.5)), math.log1p(math.exp(1.0))])
    assert stats["chosen_reward"].tolist() == pytest.approx([0.25, -0.5])
    smooth, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1)
    assert float(smooth[0]) == pytest.approx(
        0.9 * math.log1p(math.exp(-0.5)) + 0.1 * math.log1p(math.exp(0.5))
    )


def test_sequence_logps_sum_only_the_response() -> None:
    model = tiny_model(280).eval()
    prompt, resp = [5, 6, 7], [8, 9]
    with torch.no_grad():
        got = sequence_logps(model, [(prompt, resp), ([5], [6, 7, 8])], pad_id=0, device="cpu")
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + resp])).logits[0].float(), -1)
    want = float(logp[2, 8] + logp[3, 9])  # tokens 8 and 9 given what comes before them
    assert float(got[0]) == pytest.approx(want, abs=1e-5)


def _pairs() -> list[PreferencePair]:
    return [
        PreferencePair([1, 30 + i, 40], [50, 51, 2], [60, 61, 2]) for i in range(4)
    ]  # chosen 50 51, rejected 60 61, after four different prompts


def test_tiny_run_lowers_loss_and_grows_margin(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    cfg = DPOConfig(
        device="cpu", threads=1, steps=15, batch_size=4, micro_batch_rows=4, lr=3e-3, beta=0.5, warmup_steps=1,
        output_dir=str(tmp_path / "run"), tensorboard=False, progress=False,
    )  # fmt: skip
    summary = train(cfg, _pairs(), model=model, tokenizer=tok)
    first, last = summary["first"], summary["last"]
    assert first["dpo/margin"] == pytest.approx(0.0, abs=1e-4)  # policy == reference at the first step
    assert first["dpo/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert last["dpo/loss"] < first["dpo/loss"] - 0.2
    assert last["dpo/margin"] > 0.5 and last["dpo/accuracy"] == 1.0
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def test_pairs_from_jsonl_and_bad_lines(tmp_path: Path) -> None:
    from toolgym.agents.rendering import ChatRenderer

    renderer = ChatRenderer(tiny_tokenizer())
    good = tmp_path / "p.jsonl"
    row = {"messages": [{"role": "user", "content": "vote?"}], "chosen": "P3", "rejected": "P4"}
    good.write_text(json.dumps(row) + "\n")
    (pair,) = load_pairs(good, renderer)
    assert pair.chosen_ids[-1] == renderer.end_of_turn_id and pair.prompt_ids == renderer.prompt_ids(
        row["messages"]
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [], "chosen": 3}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1"):
        load_pairs(bad, renderer)
    with pytest.raises(ConfigError, match="beta"):
        DPOConfig(beta=0.0)


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"messages": [], "chosen": "a", "rejected": "b"}, "messages"),  # (was the template's ValueError)
        ({"messages": [{"role": "user", "content": 5}], "chosen": "a", "rejected": "b"}, "content"),
        ({"messages": [{"role": "user"}], "chosen": "a", "rejected": "b"}, "content"),  # (was accepted)
        ({"messages": [{"role": "wizard", "content": "x"}], "chosen": "a", "rejected": "b"}, "role"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": "calc", "chosen": "a", "rejected": "b"},
            "tools",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "chosen": " ", "rejected": "b"}, "empty"),
        ({"messages": [{"role": "user", "content": "x"}], "chosen": "same", "rejected": "same"}, "identical"),
    ],
)
def test_bad_pairs_are_config_errors_naming_the_line(tmp_path: Path, row: dict, needle: str) -> None:
    from toolgym.agents.rendering import ChatRenderer

    path = tmp_path / "pairs.jsonl"
    good = {"messages": [{"role": "user", "content": "vote?"}], "chosen": "P3", "rejected": "P4"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=rf"pairs\.jsonl:3: .*{needle}"):
        load_pairs(path, ChatRenderer(tiny_tokenizer()))


def test_a_line_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    from toolgym.agents.rendering import ChatRenderer

    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b'{"messages": [], "chosen": "\xff"}\n')
    with pytest.raises(ConfigError, match=r"pairs\.jsonl:1: .*UTF-8"):
        load_pairs(path, ChatRenderer(tiny_tokenizer()))


def test_pairs_past_the_models_positions_are_left_out(tmp_path: Path) -> None:
    """max_pair_tokens above the model's positions (1024 here) does not let a longer pair through: past them
    a RoPE model extrapolates into garbage log-probs and a learned-position one fails."""
    tok = tiny_tokenizer()
    cfg = DPOConfig(
        device="cpu", threads=1, steps=1, batch_size=2, micro_batch_rows=2, max_pair_tokens=4096,
        output_dir=str(tmp_path / "run"), tensorboard=False, progress=False,
    )  # fmt: skip
    long = PreferencePair([1] + [30] * 1100, [50, 2], [60, 2])
    summary = train(cfg, [*_pairs()[:2], long], model=tiny_model(len(tok)), tokenizer=tok)
    assert summary["pairs"] == 2 and summary["left_out"] == 1
