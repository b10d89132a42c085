"""The wire format of ``toolgym serve-env``: OpenEnv's WebSocket protocol, with toolgym's observation inside.

A client opens ``ws://HOST:PORT/ws`` (one connection = one session = one env instance) and sends JSON
messages ``{"type": "reset" | "step" | "state" | "close", "data": {...}}``, as openenv-core's ``EnvClient``
does. Replies:

- ``reset`` / ``step`` -> ``{"type": "observation", "data": {"observation": Observation, "reward", "done"}}``
- ``state`` -> ``{"type": "state", "data": EnvState}``
- a failure -> ``{"type": "error", "data": {"message", "code"}}`` with a code of ``ErrorCode``
  (openenv-core's client raises ``RuntimeError("Server error: MESSAGE (code: CODE)")``).

toolgym adds one message, ``{"type": "expert"}`` -> ``{"type": "expert", "data": {"action": TEXT}}``, the
scripted expert's next action, answered only by a server started with ``--expert`` (it reveals the answer).
Pydantic only: ``toolgym/Remote-v0`` imports this on the client side.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ErrorCode(str, Enum):
    """Why a message failed. The first seven are openenv-core's ``WSErrorCode`` values."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"  # the message's data does not fit its model (the field is named)
    EXECUTION_ERROR = "EXECUTION_ERROR"  # the env raised: an infrastructure fault, not the model's
    CAPACITY_REACHED = "CAPACITY_REACHED"  # --max-sessions sessions are open
    FACTORY_ERROR = "FACTORY_ERROR"  # the env could not be made
    SESSION_ERROR = "SESSION_ERROR"
    SESSION_EXPIRED = "SESSION_EXPIRED"  # closed after --idle-timeout seconds without a message
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"  # an HTTP session id the server never gave or already closed
    NO_EPISODE = "NO_EPISODE"  # step/state/expert before the first reset
    EPISODE_OVER = "EPISODE_OVER"  # step after the episode ended: reset first
    EXPERT_DISABLED = "EXPERT_DISABLED"  # the server was not started with --expert
    ENV_TIMEOUT = "ENV_TIMEOUT"  # the env did not answer within the call timeout: the session is closed
    BODY_TOO_LARGE = "BODY_TOO_LARGE"  # an HTTP body past the server's limit (413)
    BODY_TIMEOUT = "BODY_TIMEOUT"  # an HTTP body that did not arrive in time (408)
    NOT_FOUND = "NOT_FOUND"  # no such route, or not with this method
    INTERNAL_ERROR = "INTERNAL_ERROR"  # a fault of the server itself (a bug): reported, never a trace


class ResetData(BaseModel):
    """``reset``'s data: the seed picks the task (same seed, same task), ``options`` go to ``env.reset``."""

    model_config = ConfigDict(extra="forbid")
    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)
    options: dict[str, Any] | None = None


class StepData(BaseModel):
    """``step``'s data: the model's turn, as text or an assistant message dict (``env.step``'s action).
    ``metadata`` is OpenEnv's action field, accepted and ignored."""

    model_config = ConfigDict(extra="forbid")
    message: Any = Field(description="the model's turn: text, or an assistant message with tool_calls")
    metadata: dict[str, Any] = Field(default_factory=dict)


class Observation(BaseModel):
    """What ``reset`` / ``step`` return inside ``data.observation``."""

    messages: list[dict[str, Any]] = Field(description="new messages: system + task on reset, then results")
    assistant: dict[str, Any] | None = Field(
        default=None, description="step: the model's turn as the env read it (tool calls parsed)"
    )
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict")
    terminated: bool = False
    truncated: bool = False
    session_id: str | None = Field(default=None, description="HTTP sessions: the id to pass to /step")


class EnvState(BaseModel):
    """``state``'s reply: OpenEnv's ``episode_id`` and ``step_count``, and the episode so far."""

    episode_id: str | None = None
    step_count: int = 0
    env_id: str
    task_id: str | None = None
    done: bool = False
    episode_reward: float = 0.0
    transcript: list[dict[str, Any]] = Field(default_factory=list)


class ClientMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["reset", "step", "state", "close", "expert"]
    data: dict[str, Any] = Field(default_factory=dict)


def error_message(code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code.value, **extra}}


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold made plain (numpy scalars and arrays, tuples, sets, objects; NaN and
    infinities become None: strict JSON has no token for them, and a client's parser would refuse the message).

    >>> jsonable({"a": (1, float("nan")), "b": {2}, "c": float("-inf")})
    {'a': [1, None], 'b': [2], 'c': None}
    """
    return _finite(json.loads(json.dumps(value, default=_plain)))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return repr(value)
