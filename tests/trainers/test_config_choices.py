"""A bad categorical value fails when the config is built, with the choices listed; --help lists them too."""

import pytest

from toolgym.cli import build_parser
from toolgym.errors import ConfigError
from toolgym.trainers.branching import POLICIES
from toolgym.trainers.config import BRANCHINGS
from toolgym.trainers.grpo import GRPOConfig
from toolgym.trainers.ppo import PPOConfig

BAD = [
    (GRPOConfig, "estimator", "foo", "grpo, dr_grpo"),
    (GRPOConfig, "agg", "fooo", "token_mean, seq_mean, seq_mean_token_sum, constant"),
    (GRPOConfig, "is_mode", "x", "token_truncate"),
    (GRPOConfig, "shared", "foo", "repeat, once"),
    (GRPOConfig, "branching", "bogus", "turn_entropy"),
    (GRPOConfig, "engine", "tgi", "auto, fast, hf, vllm"),
    (PPOConfig, "critic", "x", "token, turn"),
    (PPOConfig, "ratio_level", "x", "token, sequence, turn"),
]


@pytest.mark.parametrize(("cls", "name", "value", "listed"), BAD)
def test_bad_choice_fails_at_construction(cls, name, value, listed):
    with pytest.raises(ConfigError, match=f"{name} must be one of .*{listed}"):
        cls(**{name: value})


def test_branching_choices_match_the_policies():
    assert set(BRANCHINGS) == set(POLICIES)


def test_help_lists_the_choices(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--agg", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0.0, -0.1, 0.95])
def test_engine_memory_out_of_range_fails_at_construction(value):
    with pytest.raises(ConfigError, match="engine_memory must be in"):
        GRPOConfig(engine_memory=value)


def test_engine_slots_follow_the_memory_share():
    import torch

    from toolgym.agents.engine.select import slots_for

    assert slots_for(64, 2048, 1000, torch.device("cpu")) == 128  # no cap off CUDA
    assert slots_for(1000, 2048, 1000, torch.device("cpu")) == 512


@pytest.mark.parametrize(("value", "want"), [(True, "on"), (False, "off"), ("auto", "auto"), ("on", "on")])
def test_compile_takes_old_booleans_and_the_new_choices(value, want):
    # `compile: true` configs (and YAML's bare on/off, which load as booleans) keep working
    assert GRPOConfig(env_ids=["toolgym/Calculator-v0"], compile=value).compile == want


def test_compile_auto_only_on_cuda_with_packing():
    import torch

    from toolgym.trainers.packing import use_compile

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_compile("on", True, cpu) and not use_compile("auto", True, cpu)
    assert use_compile("auto", True, cuda) and not use_compile("auto", False, cuda)
    assert use_compile("on", False, cuda) and not use_compile("off", True, cuda)
