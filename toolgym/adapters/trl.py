"""TRL's ``GRPOTrainer(environment_factory=…)`` on any toolgym env.

``environment_factory("toolgym/Calculator-v0", **env_kwargs)`` returns a class; TRL calls it with no
arguments for each rollout slot and reads, off the class:

- one public method per env tool, with a typed signature and a Google-style docstring generated from the
  tool's JSON schema (TRL renders them as the prompt's tool list through the chat template), plus
  ``answer(answer)``, which submits the final answer and ends the episode (TRL never shows the env the
  final reply text, so the answer has to arrive as a call);
- ``reset(**row)``: starts an episode and returns its text (the env's instructions and the task), which
  TRL appends to the last user message. A ``seed`` column in the row picks the task, so the ``num_generations``
  rollouts of a GRPO group get the same one: build such rows with ``dataset(env_id, n)``;
- ``get_reward()``: the episode reward so far (the sum of the env's step rewards), or ``None`` when the env
  failed (``truncation == "env_error"``), which TRL leaves out of the group instead of scoring a fault as the
  model's failure.

A malformed call (wrong argument types, a missing argument) is the env's business: it comes back as the
env's feedback text and format penalty, as it would in toolgym's own runner.

``tool_tokenizer(model)`` is a model's tokenizer for TRL's tool loop: for the embedded ``smollm2-135m`` (no
download) its ``tool_use`` chat template (tools in the system message, Hermes ``<tool_call>`` JSON, tool
results as user turns) becomes the only one, with the parser TRL reads calls back with.

TRL's ``max_completion_length`` bounds the whole multi-turn completion (every model turn and every tool
result); a tool result that would pass it is dropped without a word and the rollout ends there, so a tool loop
needs room for all its turns (docs/interop.md).
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, ClassVar, Literal

from toolgym.errors import ConfigError
from toolgym.messages import Message, ToolCall
from toolgym.optional import require
from toolgym.parsing import ANSWER_TOOL
from toolgym.special_text import SpecialText, SpecialTextEscaper, escaper_for, outgoing
from toolgym.tools import ToolSpec

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}
_RESERVED = {"reset", "get_reward", ANSWER_TOOL}


def _annotation(schema: dict[str, Any]) -> Any:
    """The Python type of a JSON-schema property (string enums become ``Literal``)."""
    enum = schema.get("enum")
    if enum and all(isinstance(v, str) for v in enum):
        return Literal[tuple(enum)]
    kind = schema.get("type", "string")
    if isinstance(kind, list):  # ["string", "null"]: the first real type
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "array":
        item = _JSON_TYPES.get(schema.get("items", {}).get("type", ""))
        return list[item] if item is not None else list  # type: ignore[valid-type]
    return _JSON_TYPES.get(kind, str)


def _docstring(description: str, params: dict[str, Any]) -> str:
    lines = [description.strip() or "Call this tool.", ""]
    if params:
        lines.append("Args:")
        for name, schema in params.items():
            text = " ".join(str(schema.get("description") or name.replace("_", " ")).split())
            lines.append(f"    {name}: {text}")
        lines.append("")
    lines += ["Returns:", "    The tool's output."]
    return "\n".join(lines)


def tool_method(spec: ToolSpec) -> Any:
    """A method ``(self, **arguments) -> str`` for ``spec``, signature and docstring from its schema."""
    if not spec.name.isidentifier() or spec.name.startswith("_") or spec.name in _RESERVED:
        raise ConfigError(
            f"tool {spec.name!r} cannot be a TRL environment method (needs a public identifier other than "
            f"{sorted(_RESERVED)})"
        )
    props: dict[str, Any] = dict(spec.parameters.get("properties") or {})
    required = set(spec.parameters.get("required") or ())
    bad = [p for p in props if not p.isidentifier()]
    if bad:
        raise ConfigError(f"tool {spec.name!r} has parameters that are not identifiers: {bad}")
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    # required parameters first: a Python signature cannot have them after defaulted ones
    for name in sorted(props, key=lambda p: p not in required):
        kind = _annotation(props[name])
        annotation = kind if name in required else kind | None
        default = inspect.Parameter.empty if name in required else None
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
        annotations[name] = annotation
    annotations["return"] = str
    signature = inspect.Signature(params, return_annotation=str)
    tool_name = spec.name

    def method(self: Any, *args: Any, **kwargs: Any) -> str:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as exc:  # TRL shows the message to the model as the tool result
            from toolgym.envs.base import cap_text  # it quotes an unknown argument's name, of any length

            return self._out(cap_text(f"Invalid call of {tool_name}: {exc}", self.env.max_observation_chars))
        arguments = {k: v for k, v in bound.arguments.items() if k != "self" and v is not None}
        return self._call(tool_name, arguments)

    method.__name__ = method.__qualname__ = tool_name
    method.__doc__ = _docstring(spec.description, props)
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    return method


class ToolgymTRLEnv:
    """The base of the classes ``environment_factory`` makes (see the module docstring)."""

    env_id: ClassVar[str] = ""
    env_kwargs: ClassVar[dict[str, Any]] = {}
    _seeds: ClassVar[Any] = None
    # TRL renders what the methods return with the chat template and tokenizes it with special tokens on: a
    # tool output (a web page, a file, the model's own echoed text) holding "<|im_end|>" would become a real
    # turn marker there. None: sent as it is (`special_text="keep"`).
    escaper: ClassVar[SpecialTextEscaper | None] = None

    def __init__(self) -> None:
        import gymnasium as gym

        import toolgym  # noqa: F401 - registers the toolgym/ ids

        self._env = gym.make(self.env_id, **self.env_kwargs)
        self._done = True
        self._reward: float | None = 0.0
        self._last_info: dict[str, Any] = {}

    @property
    def env(self) -> Any:
        """The underlying toolgym env (unwrapped)."""
        return self._env.unwrapped

    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Start an episode (``seed`` from the dataset row, else the next of a counter) and return its text."""
        if seed is None:
            seed = next(type(self)._seeds)
        messages, info = self._env.reset(seed=int(seed))
        self._done, self._reward, self._last_info = False, 0.0, info
        task = "\n\n".join(m["content"] for m in messages if m["role"] != "system" and m.get("content"))
        how = f"When you know the final answer, call the `{ANSWER_TOOL}` tool with it."
        return self._out(f"{self.env.instructions()}\n\n{how}\n\n{task}")

    def answer(self, answer: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            answer: The final answer to the task.

        Returns:
            Whether the answer was received.
        """
        return self._call(ANSWER_TOOL, {"answer": str(answer)})

    def get_reward(self) -> float | None:
        """The episode reward so far; ``None`` when the env failed (not the model's fault)."""
        return self._reward

    def _out(self, text: str) -> str:
        """What goes back to TRL: no lone surrogates (its tokenizer's UTF-8 encode would raise), special-token
        text escaped (``escaper``)."""
        return str(outgoing(text, type(self).escaper))

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self._out(self._step(name, arguments))

    def _step(self, name: str, arguments: dict[str, Any]) -> str:
        if self._done:
            return "The episode is over: no more calls are taken."
        action = Message(role="assistant", content="", tool_calls=(ToolCall(name=name, arguments=arguments),))
        obs, reward, terminated, truncated, info = self._env.step(action)
        self._last_info = info
        if info.get("truncation") == "env_error":
            self._reward = None
        elif self._reward is not None:
            self._reward += float(reward)
        if terminated or truncated:
            self._done = True
        text = "\n".join(str(m.get("content") or "") for m in obs)
        if terminated:
            return text or "Answer received."
        if truncated:
            return f"{text}\n(The episode is over: {info.get('truncation')}.)".strip()
        return text


def environment_factory(
    env_id: str,
    *,
    first_seed: int = 0,
    tokenizer: Any = None,
    special_text: SpecialText = "escape",
    **env_kwargs: Any,
) -> type[ToolgymTRLEnv]:
    """A class for ``GRPOTrainer(environment_factory=…)`` running ``env_id`` made with ``env_kwargs``.

    Rows without a ``seed`` column take seeds ``first_seed, first_seed + 1, …`` (then the rollouts of a GRPO
    group see different tasks: pass ``train_dataset=dataset(env_id, n)`` to keep groups on one task).
    ``special_text="escape"`` (default) breaks special-token text in everything handed to TRL (task text, tool
    results) so that TRL's tokenizer cannot read it as turn markers: exactly ``tokenizer``'s special tokens
    when given (pass the trainer's ``processing_class``), else a known list of chat markers
    (``toolgym.special_text``); ``"keep"`` hands the text over as it is.
    """
    escaper = escaper_for(special_text, tokenizer, who="environment_factory")
    import gymnasium as gym

    import toolgym  # noqa: F401

    probe = gym.make(env_id, **env_kwargs)
    try:
        probe.reset(seed=first_seed)
        unwrapped: Any = probe.unwrapped
        specs = [s for s in unwrapped.tool_specs if s.name != ANSWER_TOOL]
    finally:
        probe.close()
    methods = {spec.name: tool_method(spec) for spec in specs}
    name = "".join(ch for ch in env_id.split("/")[-1].replace("-", "_") if ch.isalnum() or ch == "_")
    namespace: dict[str, Any] = {
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs),
        "_seeds": itertools.count(first_seed),
        "escaper": escaper,
        "__doc__": f"{env_id} as a TRL environment (tools: {', '.join(methods) or 'none'}).",
        **methods,
    }
    return type(f"Toolgym_{name}", (ToolgymTRLEnv,), namespace)


def tool_tokenizer(model: str = "smollm2-135m") -> Any:
    """The tokenizer of ``model`` (a path, hub id or embedded name) ready for TRL's tool loop: a ``tool_use``
    chat template, where the tokenizer has one (the embedded model's: ``toolgym.agents.embedded``), becomes its
    only template, since TRL renders and checks tool conversations without naming a template; left padding."""
    AutoTokenizer = require("transformers", why="the tokenizer of TRL's tool loop").AutoTokenizer
    from toolgym.agents.embedded import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    template = tokenizer.chat_template
    if isinstance(template, dict) and "tool_use" in template:
        tokenizer.chat_template = template["tool_use"]
    tokenizer.padding_side = "left"
    return tokenizer


def dataset(env_id: str, n: int, *, first_seed: int = 0, prompt: str = "") -> Any:
    """A ``datasets.Dataset`` of ``n`` rows (``prompt``, ``seed``) whose tasks the env's ``reset`` picks."""
    Dataset = require("datasets", why="TRL's trainers take a datasets.Dataset").Dataset

    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    rows = [[{"role": "user", "content": prompt}]] * n
    return Dataset.from_dict({"prompt": rows, "seed": list(range(first_seed, first_seed + n))})
