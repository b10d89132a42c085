"""``make_policy(spec)``: a policy from the CLI's ``--agent`` string.

- ``scripted``: the env's expert.
- ``hf:NAME``: a transformers model: ``smollm2-135m`` (embedded), a local folder or a hub id.
- ``engine:NAME``: the same model on our decode engine (``EnginePolicy``: Llama/Qwen2 shapes, continuous
  batching, CUDA graphs on a GPU); e.g. ``toolgym serve --agent engine:MODEL --weight-updates`` is a fast
  rollout server a trainer pushes weights to.
- ``openai:URL`` or ``openai:URL@MODEL``: an OpenAI-compatible server (``/v1`` is added when missing);
  the model name defaults to the server's first model. The API key comes from ``$OPENAI_API_KEY``.
"""

from __future__ import annotations

import os
from typing import Any

from toolgym.agents.policy import Policy
from toolgym.errors import ConfigError

AGENT_HELP = "scripted | hf:smollm2-135m | hf:PATH_OR_HUB_ID | engine:PATH_OR_HUB_ID | openai:URL[@MODEL]"


def make_policy(spec: str, **kwargs: Any) -> Policy:
    """Build the policy named by ``spec`` (see the module docstring); ``kwargs`` go to its constructor.

    >>> make_policy("scripted").name
    'scripted'
    """
    kind, _, rest = spec.partition(":")
    if kind == "scripted" and not rest:
        from toolgym.agents.scripted import ScriptedPolicy

        return ScriptedPolicy()
    if kind == "hf":
        from toolgym.agents.hf import HFPolicy

        return HFPolicy(rest or "smollm2-135m", **kwargs)
    if kind == "engine":
        from toolgym.agents.engine import EnginePolicy

        return EnginePolicy(rest or "smollm2-135m", **kwargs)
    if kind == "openai" and rest:
        from toolgym.agents.openai_client import OpenAIPolicy

        url, model = split_openai_spec(rest)
        return OpenAIPolicy(url, model=model, api_key=os.environ.get("OPENAI_API_KEY"), **kwargs)
    raise ConfigError(f"unknown agent {spec!r}; expected {AGENT_HELP}")


def split_openai_spec(rest: str) -> tuple[str, str | None]:
    """``URL[@MODEL]`` into its parts (the model name may hold slashes).

    >>> split_openai_spec("http://localhost:8000/v1@Qwen/Qwen2.5-7B-Instruct")
    ('http://localhost:8000/v1', 'Qwen/Qwen2.5-7B-Instruct')
    >>> split_openai_spec("http://localhost:8000")
    ('http://localhost:8000', None)
    """
    scheme, sep, after = rest.partition("://")
    if not sep:
        scheme, after = "", rest
    if "@" not in after:
        return rest, None
    address, _, model = after.partition("@")
    return f"{scheme}{sep}{address}", model or None
