"""`toolgym train grpo|ppo`: each subcommand shows its own defaults; a YAML names the algorithm; the old
`--algorithm` flag and renamed keys still work, with a warning."""

import json
from pathlib import Path

import pytest

from toolgym.cli import build_parser, main
from toolgym.cli.train import resolve
from toolgym.errors import ConfigError
from toolgym.trainers.grpo_config import GRPOConfig
from toolgym.trainers.ppo_config import PPOConfig


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare on single spaces


@pytest.mark.parametrize(
    ("algorithm", "epochs", "eps_high"), [("ppo", 2, 0.2), ("grpo", 1, 0.28)], ids=["ppo", "grpo"]
)
def test_each_subcommand_shows_its_own_defaults(capsys, algorithm, epochs, eps_high) -> None:
    text = help_text(capsys, "train", algorithm)
    assert f"(default: {epochs})" in text.split("--epochs EPOCHS", 2)[2][:120]
    assert f"(default: {eps_high})" in text.split("--eps-high EPS_HIGH", 2)[2][:80]
    cls = {"ppo": PPOConfig, "grpo": GRPOConfig}[algorithm]
    assert (cls().epochs, cls().eps_high) == (epochs, eps_high)


def test_ppo_lists_only_ppo_flags(capsys) -> None:
    assert "--critic" in help_text(capsys, "train", "ppo")
    assert "--estimator" not in help_text(capsys, "train", "ppo")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "ppo", "--estimator", "gigpo"])


def test_yaml_names_the_algorithm(tmp_path: Path, capsys) -> None:
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("algorithm: ppo\nsteps: 3\n")
    algorithm, cfg = resolve(build_parser().parse_args(["train", "--config", str(cfg_file), "--epochs", "4"]))
    assert (
        algorithm == "ppo"
        and isinstance(cfg, PPOConfig)
        and (cfg.steps, cfg.epochs, cfg.eps_high) == (3, 4, 0.2)
    )
    for argv in (["train", "ppo", "--config", str(cfg_file)], ["train", "--config", str(cfg_file), "ppo"]):
        assert resolve(build_parser().parse_args(argv))[0] == "ppo"
    with pytest.raises(ConfigError, match="named twice"):
        resolve(build_parser().parse_args(["train", "grpo", "--config", str(cfg_file)]))
    assert main(["train", "--config", str(cfg_file), "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["algorithm"] == "ppo" and printed["critic"] == "token"


def test_without_algorithm_anywhere_it_is_grpo(tmp_path: Path) -> None:
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("steps: 3\n")
    algorithm, cfg = resolve(build_parser().parse_args(["train", "--config", str(cfg_file)]))
    assert algorithm == "grpo" and isinstance(cfg, GRPOConfig)


def test_old_algorithm_flag_maps_with_a_warning() -> None:
    args = build_parser().parse_args(["train", "--algorithm", "ppo", "--steps", "2"])
    with pytest.warns(FutureWarning, match="toolgym train ppo"):
        algorithm, cfg = resolve(args)
    assert algorithm == "ppo" and cfg.steps == 2


def test_renamed_key_is_accepted_with_a_deprecation_warning(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="overlong_factor"):
        assert GRPOConfig.from_dict({"overlong_penalty": 0.5}).overlong_factor == 0.5
    with pytest.raises(ConfigError, match="not both"), pytest.warns(DeprecationWarning):
        GRPOConfig.from_dict({"overlong_penalty": 0.5, "overlong_factor": 0.5})
    args = build_parser().parse_args(["train", "grpo", "--overlong-penalty", "0.25"])
    with pytest.warns(DeprecationWarning):
        assert resolve(args)[1].overlong_factor == 0.25


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_yaml_algorithm_runs_that_loop(tmp_path: Path, monkeypatch, capsys, algorithm) -> None:
    import importlib

    loop = importlib.import_module(f"toolgym.trainers.{algorithm}")
    ran: list[object] = []
    monkeypatch.setattr(loop, "train", lambda cfg: ran.append(cfg) or {"charts/success": 0.5})
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(f"algorithm: {algorithm}\nsteps: 1\noutput_dir: {tmp_path / 'run'}\n")
    assert main(["train", "--config", str(cfg_file)]) == 0
    assert [type(c) for c in ran] == [{"ppo": PPOConfig, "grpo": GRPOConfig}[algorithm]]
    assert "charts/success=0.5" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        # the subcommand is not eaten as --resume's word
        (["train", "--resume", "grpo", "--steps", "3"], True),
        (["train", "grpo", "--resume", "--steps", "3"], True),
        (["train", "grpo", "--steps", "3", "--resume"], True),
        (["train", "grpo", "--resume", "auto", "--steps", "3"], "auto"),
        (["train", "--resume", "auto", "grpo", "--steps", "3"], "auto"),
        (["train", "grpo", "--resume=false", "--steps", "3"], False),
        (["train", "grpo", "--no-resume", "--steps", "3"], False),
    ],
)
def test_resume_takes_a_word_only_when_one_follows(capsys, argv: list[str], want: object) -> None:
    assert main([*argv, "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["resume"] == want and cfg["steps"] == 3


def test_a_path_longer_than_the_models_positions_is_caught_at_start() -> None:
    """max_total_tokens + max_new_tokens past config.max_position_embeddings: learned positions (GPT-2) would
    fail mid-run (a ConfigError at start); rotary ones run past what they trained on (a warning)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from toolgym.trainers.modeling import check_positions

    cfg = GRPOConfig(max_total_tokens=1000, max_new_tokens=64)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_positions=512, n_embd=32, n_layer=1, n_head=2, vocab_size=100))
    with pytest.raises(ConfigError, match=r"1064 tokens pass the model's 512 positions"):
        check_positions(cfg, gpt2)
    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    )  # fmt: skip
    with pytest.warns(UserWarning, match="rotary positions"):
        check_positions(cfg, llama)
    check_positions(GRPOConfig(max_total_tokens=400, max_new_tokens=64), gpt2)  # fits: nothing
