"""The policy protocol: a batch of conversations in, one ``AssistantTurn`` per conversation out.

Every backend (``hf``, ``openai``, ``scripted``) answers the same call::

    turns = policy.act(conversations, tools, sampling=SamplingParams(temperature=0.7))

``conversations`` are lists of plain message dicts (what envs return), ``tools`` one list of OpenAI tool
dicts per conversation (``info["tools"]``) or None. Token-level backends (``hf``) also expose
``generate(prompt_ids, sampling)``, which the episode runner and the trainer call with ids they rendered
themselves (see ``toolgym.agents.rendering``), so no token is ever re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from toolgym.messages import Message
from toolgym.parsing import ActionFormat, parse_action
from toolgym.tools import ToolSpec

if TYPE_CHECKING:
    from toolgym.envs.base import ToolEnv

FinishReason = Literal["stop", "length", "error"]
Conversation = list[dict[str, Any]]
ToolDicts = list[dict[str, Any]]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one assistant turn.

    ``temperature=0`` is greedy. Logprobs (and entropies) are those of ``softmax(logits / temperature)``
    (temperature 1 when greedy); with ``top_p`` < 1, over the renormalised nucleus the token was sampled from:
    the behaviour probability that the trainer's importance weights divide by (the learner's side is the
    full softmax).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()  # extra stop strings (the end-of-turn token always stops)
    seed: int | None = None
    return_entropies: bool = False


@dataclass
class AssistantTurn:
    """One generated assistant turn.

    ``token_ids`` are exactly the sampled ids (the end-of-turn token included when the model produced it)
    and ``logprobs[i]`` is the log-probability of ``token_ids[i]``; both are empty for backends that have no
    tokens (scripted, servers that do not return them). ``message`` is the parsed assistant message
    (structured ``tool_calls`` when the text held valid calls).
    """

    text: str
    message: Message
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    entropies: list[float] | None = None
    structured: bool = False  # True when the backend returned tool_calls itself (send `message` to env)
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def action(self) -> str | Message:
        """What to pass to ``env.step``: the raw text, or the message when calls came structured."""
        return self.message if self.structured else self.text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text,
            "message": self.message.to_dict(),
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "finish_reason": self.finish_reason,
        }
        if self.entropies is not None:
            out["entropies"] = list(self.entropies)
        return out


@runtime_checkable
class Policy(Protocol):
    """Anything that answers a batch of conversations. ``envs`` is only read by scripted policies."""

    name: str

    def act(
        self,
        conversations: Sequence[Conversation],
        tools: Sequence[ToolDicts | None] | None = None,
        *,
        sampling: SamplingParams | None = None,
        envs: Sequence[ToolEnv | None] | None = None,
    ) -> list[AssistantTurn]: ...


@dataclass
class Generation:
    """Token-level output of ``TokenPolicy.generate`` for one prompt."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    entropies: list[float] | None = None


@runtime_checkable
class TokenPolicy(Policy, Protocol):
    """A policy the runner can drive with token ids (``hf``): it owns a tokenizer and a renderer."""

    @property
    def renderer(self) -> Any: ...

    def generate(
        self, prompts: Sequence[list[int]], sampling: SamplingParams | None = None
    ) -> list[Generation]: ...


def parse_turn(text: str, tools: ToolDicts | None, fmt: ActionFormat = "hermes") -> Message:
    """The assistant message of a text reply: structured ``tool_calls`` when the text holds valid calls.

    >>> parse_turn('<tool_call>{"name": "f", "arguments": {}}</tool_call>', None).tool_calls[0].name
    'f'
    >>> parse_turn("hello", None).tool_calls is None
    True
    """
    parsed = parse_action(text, _specs(tools), fmt)
    if parsed.ok and parsed.tool_calls:
        return Message(role="assistant", content=text, tool_calls=parsed.tool_calls)
    return Message(role="assistant", content=text)


_SPECS: dict[int, tuple[ToolDicts, list[ToolSpec]]] = {}


def _specs(tools: ToolDicts | None) -> list[ToolSpec] | None:
    """ToolSpecs of a tool list; envs hand out the same list object every turn, so it is converted once."""
    if not tools:
        return None
    hit = _SPECS.get(id(tools))
    if hit is not None and hit[0] is tools:
        return hit[1]
    specs = [ToolSpec.from_dict(t) for t in tools]
    if len(_SPECS) > 1024:
        _SPECS.clear()
    _SPECS[id(tools)] = (tools, specs)
    return specs


def broadcast_tools(tools: Sequence[ToolDicts | None] | None, n: int) -> list[ToolDicts | None]:
    """One tool list per conversation (None for all when ``tools`` is None)."""
    from toolgym.errors import ConfigError

    if tools is None:
        return [None] * n
    out = list(tools)
    if len(out) != n:
        raise ConfigError(f"got {len(out)} tool lists for {n} conversations: pass one list per conversation")
    return out


class RenderedTokenPolicy:
    """``act`` for a token policy: render each conversation with ``self._renderer``, ``generate`` the ids,
    decode and parse each turn. ``HFPolicy`` and ``EnginePolicy`` share it; they differ in ``generate``."""

    _renderer: Any  # a ChatRenderer

    def generate(self, prompts: list[list[int]], sampling: SamplingParams | None = None) -> list[Generation]:
        raise NotImplementedError

    def act(
        self,
        conversations: Sequence[Conversation],
        tools: Sequence[ToolDicts | None] | None = None,
        *,
        sampling: SamplingParams | None = None,
        envs: Sequence[Any] | None = None,
    ) -> list[AssistantTurn]:
        tool_lists = broadcast_tools(tools, len(conversations))
        prompts = [self._renderer.prompt_ids(c, t) for c, t in zip(conversations, tool_lists, strict=True)]
        gens = self.generate(prompts, sampling)
        return [self.to_turn(g, t, len(p)) for g, t, p in zip(gens, tool_lists, prompts, strict=True)]

    def to_turn(
        self, gen: Generation, tools: ToolDicts | None, prompt_len: int = 0, *, parse: bool = True
    ) -> AssistantTurn:
        """An ``AssistantTurn`` from token-level output: decoded text (stop token removed) and parsed message.
        ``parse=False`` leaves the message plain text: for a caller that has the env parse the turn
        (``ToolEnv.read_action``) and records the env's message, so the turn is parsed once."""
        text = self._renderer.decode(self._renderer.strip_stop(gen.token_ids))
        return AssistantTurn(
            text=text,
            message=parse_turn(text, tools) if parse else Message(role="assistant", content=text),
            token_ids=gen.token_ids,
            logprobs=gen.logprobs,
            finish_reason=gen.finish_reason,
            entropies=gen.entropies,
            usage={"prompt_tokens": prompt_len, "completion_tokens": len(gen.token_ids)},
        )


def context_of(policy: Any) -> int | None:
    """The tokens a token policy can hold (prompt + reply): its model's positions
    (``config.max_position_embeddings``), or its engine's capacity a sequence when that is smaller (our engine
    and vLLM's allocate that much, whatever the model's positions); None when unknown (a remote backend, a
    config without it)."""
    model = getattr(policy, "model", policy)
    size = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    cap = getattr(getattr(getattr(policy, "engine", None), "cache", None), "capacity", None)
    sizes = [int(n) for n in (size, cap) if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return min(sizes) if sizes else None
