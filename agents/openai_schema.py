"""The request body of ``POST /v1/chat/completions`` as pydantic models (``toolgym serve``): a malformed
request fails validation here and is answered 400 by the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from toolgym.agents.policy import SamplingParams


class _Function(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDef(BaseModel):
    """One entry of ``tools``: ``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"] = "function"
    function: _Function


class _CallFunction(BaseModel):
    name: str
    arguments: str = "{}"


class _ToolCallIn(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: _CallFunction


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """A message of the conversation (``developer`` is read as ``system``)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_Part] | None = None
    name: str | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatMessage:
        if isinstance(self.content, list):
            bad = [p.type for p in self.content if p.type != "text" or p.text is None]
            if bad:
                raise ValueError(f"only text content parts are supported, got {bad}")
        if self.role == "assistant":
            if self.content is None and not self.tool_calls:
                raise ValueError("an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def to_plain(self) -> dict[str, Any]:
        """The message as the renderer takes it (text parts joined, ``developer`` as ``system``)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text or "" for p in content)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        out["content"] = content or ""
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class _StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampled:
    """What both request bodies turn into ``SamplingParams`` the same way (OpenAI's defaults where a field is
    left out); each says how many new tokens it allows."""

    if TYPE_CHECKING:  # the fields, declared by the pydantic models that take this in
        temperature: float | None
        top_p: float | None
        stop: str | list[str] | None
        seed: int | None

    def max_new_tokens(self) -> int:
        raise NotImplementedError

    def check_stops(self, most: int) -> None:
        """At most ``most`` stop strings of at most 1024 characters each: every sampled token is checked against
        them, so a client sending thousands would slow the batch every other client shares."""
        stop = self.stop or ()
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
        if len(stops) > most:
            raise ValueError(f"at most {most} stop sequences, got {len(stops)}")
        if any(len(x) > 1024 for x in stops):
            raise ValueError("a stop sequence is at most 1024 characters")

    @property
    def stops(self) -> tuple[str, ...]:
        stop = self.stop or ()
        return tuple(s for s in ((stop,) if isinstance(stop, str) else stop) if s)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            max_new_tokens=self.max_new_tokens(),
            stop=self.stops,
            seed=self.seed,
        )


class ChatCompletionRequest(_Sampled, BaseModel):
    """The body of ``POST /v1/chat/completions`` (fields the API has that we cannot honour are refused)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # torch's seed range (else a 500)
    n: int = Field(default=1, ge=1, le=64)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: _StreamOptions | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        self.check_stops(4)
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, dict):
            name = self.chosen_function()
            known = [t.function.name for t in self.tools or ()]
            if name not in known:
                raise ValueError(f"tool_choice names the function {name!r}, which is not in tools {known}")
        return self

    def chosen_function(self) -> str | None:
        """The function a ``tool_choice`` object names (``{"type": "function", "function": {"name": …}}``)."""
        if not isinstance(self.tool_choice, dict):
            return None
        fn = self.tool_choice.get("function")
        if self.tool_choice.get("type") != "function" or not isinstance(fn, dict):
            raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", ...}')
        name = fn.get("name")
        if not isinstance(name, str):
            raise ValueError("tool_choice.function.name must be a string")
        return name

    def max_new_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        chosen = self.chosen_function()
        return [
            t.model_dump(exclude_none=True) for t in self.tools if chosen is None or t.function.name == chosen
        ]


class CompletionRequest(_Sampled, BaseModel):
    """The body of ``POST /v1/completions`` as vLLM's server takes it from RL trainers: the prompt as token ids
    (one list, or a list of lists; a string is tokenized without special tokens), ``logprobs`` (the k likeliest
    tokens at each step beside the sampled one), ``return_token_ids`` and ``return_tokens_as_token_ids``
    (tokens written ``token_id:N``), ``stop_token_ids``. Fields our policies cannot honour are refused."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    # strict: JSON true or 1.0 is not a token id (pydantic's lax mode would read them as 1)
    prompt: list[StrictInt] | list[list[StrictInt]] | str
    max_tokens: int = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = Field(default=None, max_length=1024)
    ignore_eos: bool = False  # (the end-of-turn token always ends a turn here)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # torch's seed range (else a 500)
    n: int = Field(default=1, ge=1, le=64)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    include_stop_str_in_output: bool = False
    stream: bool = False
    echo: bool = False

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.stream:
            raise ValueError("stream: true is not supported on /v1/completions (use /v1/chat/completions)")
        if self.echo:
            raise ValueError("echo is not supported")
        if self.top_k not in (None, 0, -1):
            raise ValueError("top_k is not supported (give 0, -1 or leave it out)")
        if self.repetition_penalty not in (None, 1.0):
            raise ValueError("repetition_penalty is not supported (give 1.0 or leave it out)")
        self.check_stops(64)
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is empty")
        if isinstance(self.prompt, list) and any(isinstance(p, list) and not p for p in self.prompt):
            raise ValueError("a prompt of the batch is empty")
        return self

    def max_new_tokens(self) -> int:
        return self.max_tokens
