"""``toolgym serve-env ID``: any registered toolgym env over WebSocket (OpenEnv's protocol) and HTTP.

- ``WS /ws``: one connection is one session with its own env instance, made when the connection opens and
  closed when it ends; messages and replies are those of ``toolgym.serving.protocol`` (openenv-core's
  ``EnvClient`` / ``GenericEnvClient`` drive it as they are).
- HTTP sessions, for clients without WebSockets: ``POST /reset`` opens a session (or resets the one named
  by ``session_id``) and returns its id in ``observation.session_id``; ``POST /step`` takes
  ``{"session_id", "action": {"message": ...}}``; ``GET /state?session_id=``; ``DELETE /sessions/{id}``.
  A session the server never gave is 404 ``SESSION_NOT_FOUND``, one closed for idling 410
  ``SESSION_EXPIRED``.
- ``GET /health``, ``GET /metadata`` (the env's id, family, tools, declared expert success), ``GET /schema``
  (the action, observation and state JSON schemas), ``GET /docs`` (OpenAPI).

Sessions run concurrently: each has one worker thread, so envs that are tied to their thread (a browser)
keep it, and a slow step of one session never holds up another. ``max_sessions`` caps the open sessions
(``CAPACITY_REACHED`` past it); a session without a message for ``idle_timeout_s`` is closed and its env
released (a step in progress is not idle), and its next message is answered ``SESSION_EXPIRED``.

Faults: an env call that raises is ``EXECUTION_ERROR`` (500: an infrastructure fault, never the model's); one
that does not answer within ``call_timeout_s`` is ``ENV_TIMEOUT`` (504) and its session is closed (its slot
is freed; the stuck thread is left to finish); a reset that fails on a session it just opened closes that
session (no slot leaks until the idle timeout); a non-finite reward is ``EXECUTION_ERROR``, and NaN or an
infinity elsewhere in an observation is sent as null (strict JSON). Every HTTP error is
``{"error": {"code", "message"}}``: validation (422 ``VALIDATION_ERROR``), unknown routes (404
``NOT_FOUND``), bodies past ``limits`` (413 ``BODY_TOO_LARGE``, 408 ``BODY_TIMEOUT``), a bug of ours (500
``INTERNAL_ERROR``). Concurrent calls on one session run one after another, in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolgym.errors import ConfigError, EpisodeOverError
from toolgym.optional import require
from toolgym.serving.base import AppServer, Limits
from toolgym.serving.protocol import (
    ClientMessage,
    EnvState,
    ErrorCode,
    Observation,
    ResetData,
    StepData,
    error_message,
    jsonable,
)
from toolgym.special_text import SpecialText, SpecialTextEscaper, escaper_for, outgoing

require("fastapi")  # first: a missing package says which extra brings it
# at module level: FastAPI reads the handlers' annotations (strings here) from these globals
from fastapi import FastAPI, Query, Request, WebSocket, WebSocketDisconnect  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402

T = TypeVar("T")


class SessionError(Exception):
    """A message that cannot be served; ``code`` says why (the reply's ``data.code``)."""

    def __init__(self, code: ErrorCode, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass
class Session:
    id: str
    env: Any
    executor: ThreadPoolExecutor
    last_active: float = field(default_factory=time.monotonic)
    busy: int = 0  # calls in progress: a long step is not idleness
    step_count: int = 0
    episode_id: str | None = None
    started: bool = False
    done: bool = False
    episode_reward: float = 0.0
    closed: bool = False
    # what the client's trainer tokenizes itself: special-token text in the observations escaped (None: kept)
    escaper: SpecialTextEscaper | None = None


class SessionPool:
    """The open sessions: made on demand, run on their own thread, reaped when idle."""

    def __init__(
        self,
        make_env: Callable[[], Any],
        max_sessions: int,
        idle_timeout_s: float | None,
        call_timeout_s: float | None = None,
        escaper: SpecialTextEscaper | None = None,
    ) -> None:
        self.make_env = make_env
        self.escaper = escaper
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.call_timeout_s = call_timeout_s
        self.sessions: dict[str, Session] = {}
        self._reserved = 0  # sessions whose env is being made
        self._expired: OrderedDict[str, str] = OrderedDict()  # recently closed ids -> why (bounded)

    async def open(self) -> Session:
        if len(self.sessions) + self._reserved >= self.max_sessions:
            raise SessionError(
                ErrorCode.CAPACITY_REACHED,
                f"{self.max_sessions} sessions are open (--max-sessions); close one or retry later",
                503,
            )
        self._reserved += 1
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolgym-env-session")
        try:
            env = await asyncio.get_running_loop().run_in_executor(executor, self.make_env)
        except Exception as exc:
            executor.shutdown(wait=False)
            raise SessionError(
                ErrorCode.FACTORY_ERROR, f"the env could not be made: {type(exc).__name__}: {exc}", 500
            ) from exc
        finally:
            self._reserved -= 1
        session = Session(uuid.uuid4().hex, env, executor, escaper=self.escaper)
        self.sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        why = self._expired.get(session_id)
        if why is not None:
            raise SessionError(ErrorCode.SESSION_EXPIRED, why, 410)
        raise SessionError(
            ErrorCode.SESSION_NOT_FOUND,
            f"no session {session_id!r}: POST /reset without a session_id opens one",
            404,
        )

    def check_live(self, session: Session) -> None:
        if session.closed:
            raise SessionError(
                ErrorCode.SESSION_EXPIRED,
                self._expired.get(session.id, f"session {session.id} is closed"),
                410,
            )

    async def run(self, session: Session, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the session's thread; the session counts as active throughout."""
        self.check_live(session)
        session.busy += 1
        try:
            call = asyncio.get_running_loop().run_in_executor(session.executor, fn, *args)
            try:
                return await asyncio.wait_for(call, timeout=self.call_timeout_s)
            except asyncio.TimeoutError:
                why = (
                    f"the env did not answer within {self.call_timeout_s:g} s (call_timeout_s): session "
                    f"{session.id} is closed; open a new one"
                )
                session.busy -= 1  # (so close does not wait for it: the call is stuck)
                try:
                    await self.close(session, why, wait=False)
                finally:
                    session.busy += 1
                raise SessionError(ErrorCode.ENV_TIMEOUT, why, 504) from None
        finally:
            session.busy -= 1
            session.last_active = time.monotonic()

    async def close(self, session: Session, why: str | None = None, *, wait: bool = True) -> None:
        """Frees the session's slot at once; its env is closed on its thread after any call in progress
        (``wait=False``: without waiting for that, for a call that is stuck)."""
        if session.closed:
            return
        session.closed = True
        self.sessions.pop(session.id, None)
        if why is not None:
            self._expired[session.id] = why
            while len(self._expired) > 10_000:
                self._expired.popitem(last=False)
        closing = asyncio.get_running_loop().run_in_executor(session.executor, session.env.close)
        session.executor.shutdown(wait=False)
        if wait:
            with contextlib.suppress(Exception):  # closing is best effort: the slot is free either way
                await closing
        else:
            closing.add_done_callback(lambda f: f.cancelled() or f.exception())  # (never "never retrieved")

    async def reap_forever(self) -> None:
        timeout = self.idle_timeout_s
        if not timeout:
            return
        interval = min(max(timeout / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if not session.busy and now - session.last_active > timeout:
                    why = (
                        f"session {session.id} was closed after {timeout:g} s without a message "
                        "(--idle-timeout); open a new session"
                    )
                    await self.close(session, why)

    async def close_all(self) -> None:
        for session in list(self.sessions.values()):
            await self.close(session)


# ----- what a session does, on its own thread -----------------------------------------------------------
def _assistant_turn(env: Any, n_obs: int) -> dict[str, Any] | None:
    transcript = getattr(env.unwrapped, "transcript", None)
    if not transcript or len(transcript) <= n_obs:
        return None
    turn = transcript[-(n_obs + 1)]
    return turn if turn.get("role") == "assistant" else None


def _do_reset(session: Session, data: ResetData) -> dict[str, Any]:
    obs, info = session.env.reset(seed=data.seed, options=data.options)
    session.started, session.done, session.step_count, session.episode_reward = True, False, 0, 0.0
    session.episode_id = data.episode_id or uuid.uuid4().hex
    observation = Observation(messages=_outgoing(session, obs), info=jsonable(info))
    return {"observation": observation.model_dump(), "reward": None, "done": False}


def _outgoing(session: Session, obs: Any) -> Any:
    """The observation's messages as the client gets them: the client's trainer renders and tokenizes them
    with special tokens on, so special-token text in them (a web page, a file, an echoed reply) is escaped
    (toolgym.special_text), unless the server keeps it (``special_text="keep"``)."""
    return outgoing(jsonable(obs), session.escaper)


def _do_step(session: Session, data: StepData) -> dict[str, Any]:
    if not session.started:
        raise SessionError(ErrorCode.NO_EPISODE, "no episode yet: send reset first")
    if session.done:
        raise SessionError(ErrorCode.EPISODE_OVER, "the episode is over: send reset to start another")
    try:
        obs, reward, terminated, truncated, info = session.env.step(data.message)
    except EpisodeOverError as exc:
        raise SessionError(ErrorCode.EPISODE_OVER, str(exc)) from exc
    if not math.isfinite(float(reward)):  # the env's fault: a NaN would poison every mean it joins
        session.done = True
        raise ValueError(f"the env returned a non-finite reward ({reward}); the episode is over")
    session.step_count += 1
    session.done = bool(terminated or truncated)
    session.episode_reward += float(reward)
    observation = Observation(
        messages=_outgoing(session, obs),
        assistant=_assistant_turn(session.env, len(obs)),
        info=jsonable(info),
        terminated=bool(terminated),
        truncated=bool(truncated),
    )
    return {"observation": observation.model_dump(), "reward": float(reward), "done": session.done}


def _do_state(session: Session, env_id: str) -> dict[str, Any]:
    inner = session.env.unwrapped
    task = inner.task if session.started and hasattr(inner, "task") else None
    return EnvState(
        episode_id=session.episode_id,
        step_count=session.step_count,
        env_id=env_id,
        task_id=getattr(task, "task_id", None),
        done=session.done,
        episode_reward=session.episode_reward,
        transcript=jsonable(getattr(inner, "transcript", [])) if session.started else [],
    ).model_dump()


def _do_expert(session: Session) -> dict[str, Any]:
    if not session.started or session.done:
        raise SessionError(ErrorCode.NO_EPISODE, "the expert needs an episode in progress: send reset")
    return {"action": session.env.unwrapped.expert_action()}


# ----- HTTP bodies ---------------------------------------------------------------------------------------
class HTTPReset(ResetData):
    session_id: str | None = Field(default=None, description="reset this session instead of opening one")


class HTTPStep(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenEnv's timeout_s, request_id: accepted, ignored
    session_id: str = Field(description="the id POST /reset returned in observation.session_id")
    action: StepData


class EnvServer(AppServer):
    """Serves ``env_id`` (made with ``env_kwargs``) on ``host:port``; see the module docstring."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_sessions: int = 64,
        idle_timeout_s: float | None = 600.0,
        expert: bool = False,
        call_timeout_s: float | None = 1800.0,
        limits: Limits | None = None,
        special_text: SpecialText = "escape",
        tokenizer: Any = None,
    ) -> None:
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the ids)

        if env_id not in gym.registry:
            from toolgym.cli.ids import unknown_id_message

            raise ConfigError(f"{unknown_id_message(env_id)}; `toolgym list` shows every id")
        if max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {max_sessions}")
        if idle_timeout_s is not None and idle_timeout_s <= 0:
            raise ConfigError(f"idle_timeout_s must be > 0 (or None: never), got {idle_timeout_s}")
        if call_timeout_s is not None and call_timeout_s <= 0:
            raise ConfigError(f"call_timeout_s must be > 0 (or None: wait), got {call_timeout_s}")
        # the client's tokenizer when named, else the known chat markers; None: kept
        escaper = escaper_for(special_text, tokenizer, who="serve-env")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        probe = gym.make(env_id, **self.env_kwargs)  # a bad kwarg fails here, not in each session
        try:
            inner = probe.unwrapped
            doc = (type(inner).__doc__ or "").strip().splitlines()
            self.metadata = {
                "name": env_id,
                "description": doc[0] if doc else env_id,
                "version": _version(),
                "env_id": env_id,
                "env_kwargs": jsonable(self.env_kwargs),
                "family": getattr(inner, "family", None),
                "tools": [s.name for s in getattr(inner, "tool_specs", [])],
                "expert_success_rate": float(getattr(inner, "expert_success_rate", 0.0)),
                "max_turns": getattr(inner, "max_turns", None),
                "expert": expert,
                "max_sessions": max_sessions,
                "idle_timeout_s": idle_timeout_s,
                "protocol": "openenv-ws",
                "special_text": special_text,
            }
        finally:
            probe.close()
        self.expert = expert
        self.pool = SessionPool(
            lambda: gym.make(env_id, **self.env_kwargs), max_sessions, idle_timeout_s, call_timeout_s, escaper
        )
        super().__init__(build_env_app(self), host, port, limits=limits, error_body=_guard_error)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)


def _guard_error(status: int, message: str, code: str) -> dict[str, Any]:
    """The error body of the guards in front of the app (toolgym.serving.base.GuardBody)."""
    return {"error": {"code": code.upper(), "message": message}}


def _version() -> str:
    import toolgym

    return toolgym.__version__


def build_env_app(server: EnvServer) -> Any:
    """The FastAPI application of ``server``."""
    pool = server.pool

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        reaper = asyncio.create_task(pool.reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            await pool.close_all()

    app = FastAPI(
        title=f"toolgym serve-env {server.env_id}",
        description="A toolgym env over OpenEnv's WebSocket protocol (/ws) and HTTP sessions.",
        lifespan=lifespan,
    )

    def http_error(exc: SessionError, **extra: Any) -> Any:
        body = {"error": {"code": exc.code.value, "message": str(exc), **extra}}
        return JSONResponse(status_code=exc.status, content=body)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        )
        err = SessionError(ErrorCode.VALIDATION_ERROR, f"invalid request: {problems}", 422)
        return http_error(err, errors=jsonable(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Any:  # unknown routes, wrong methods
        err = SessionError(ErrorCode.NOT_FOUND, f"{request.method} {request.url.path}: {exc.detail}")
        err.status = exc.status_code
        return http_error(err)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Any:  # a bug of ours: a JSON 500, never a trace
        return http_error(SessionError(ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}", 500))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy", "sessions": len(pool.sessions), "max_sessions": pool.max_sessions}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return server.metadata

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": StepData.model_json_schema(),
            "observation": Observation.model_json_schema(),
            "state": EnvState.model_json_schema(),
        }

    @app.post("/reset", response_model=None)
    async def http_reset(req: HTTPReset | None = None) -> Any:
        req = req or HTTPReset()
        opened = None
        try:
            if req.session_id:
                session = pool.get(req.session_id)
            else:
                session = opened = await pool.open()
            data = ResetData(**req.model_dump(exclude={"session_id"}))
            try:
                out = await pool.run(session, _do_reset, session, data)
            except SessionError:
                raise
            except Exception as exc:
                raise SessionError(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}", 500) from exc
        except SessionError as exc:
            if opened is not None:  # its id was never given out: nobody could close it but the reaper
                await pool.close(opened)
            return http_error(exc)
        out["observation"]["session_id"] = session.id
        return out

    @app.post("/step", response_model=None)
    async def http_step(req: HTTPStep) -> Any:
        try:
            session = pool.get(req.session_id)
            try:
                out = await pool.run(session, _do_step, session, req.action)
            except SessionError:
                raise
            except Exception as exc:
                raise SessionError(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}", 500) from exc
        except SessionError as exc:
            if exc.code is ErrorCode.EPISODE_OVER or exc.code is ErrorCode.NO_EPISODE:
                exc.status = 409
            return http_error(exc)
        out["observation"]["session_id"] = session.id
        return out

    @app.get("/state", response_model=None)
    async def http_state(session_id: str = Query(...)) -> Any:
        try:
            session = pool.get(session_id)
            return await pool.run(session, _do_state, session, server.env_id)
        except SessionError as exc:
            return http_error(exc)

    @app.delete("/sessions/{session_id}", response_model=None)
    async def http_close(session_id: str) -> Any:
        try:
            await pool.close(pool.get(session_id))
        except SessionError as exc:
            return http_error(exc)
        return {"closed": session_id}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session = await pool.open()
        except SessionError as exc:
            # answer the client's first message (a client sends before it reads: an error sent at once
            # races its send against our close), then close
            with contextlib.suppress(Exception):
                await asyncio.wait_for(websocket.receive_text(), timeout=30)
                await websocket.send_text(json.dumps(error_message(exc.code, str(exc))))
            with contextlib.suppress(Exception):
                await websocket.close()
            return
        try:
            while True:
                raw = await _receive(websocket)
                if raw is None:
                    break
                reply, end = await _answer(server, session, raw)
                if reply is not None:
                    await websocket.send_text(json.dumps(reply))
                if end:
                    break
        except WebSocketDisconnect:
            pass
        finally:
            await pool.close(session)
            with contextlib.suppress(Exception):
                await websocket.close()

    return app


async def _receive(websocket: WebSocket) -> str | bytes | None:
    """The next message's text (a binary frame's bytes, answered as invalid JSON unless they are UTF-8 JSON),
    or None when the client has gone."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    return text if text is not None else bytes(message.get("bytes") or b"")


async def _answer(
    server: EnvServer, session: Session, raw: str | bytes
) -> tuple[dict[str, Any] | None, bool]:
    """The reply to one WebSocket message, and whether the connection ends after it."""
    pool = server.pool
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return error_message(ErrorCode.INVALID_JSON, f"invalid JSON: {exc}"), False
    if not isinstance(payload, dict):
        return error_message(
            ErrorCode.INVALID_JSON,
            f'a message is a JSON object {{"type", "data"}}, not {type(payload).__name__}',
        ), False
    kind = payload.get("type")
    if kind not in ("reset", "step", "state", "close", "expert"):
        return error_message(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}; use reset, step, state or close"
        ), False
    try:
        msg = ClientMessage.model_validate(payload)
        if msg.type == "close":
            return None, True
        if msg.type == "reset":
            out = await pool.run(session, _do_reset, session, ResetData.model_validate(msg.data))
            return {"type": "observation", "data": out}, False
        if msg.type == "step":
            out = await pool.run(session, _do_step, session, StepData.model_validate(msg.data))
            return {"type": "observation", "data": out}, False
        if msg.type == "state":
            out = await pool.run(session, _do_state, session, server.env_id)
            return {"type": "state", "data": out}, False
        if not server.expert:
            raise SessionError(
                ErrorCode.EXPERT_DISABLED,
                "this server does not answer expert requests (start it with --expert)",
            )
        return {"type": "expert", "data": await pool.run(session, _do_expert, session)}, False
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()
        )
        return error_message(
            ErrorCode.VALIDATION_ERROR, f"invalid {kind} message: {problems}", errors=jsonable(exc.errors())
        ), False
    except SessionError as exc:
        # an expired session (or one closed for a stuck env) is over for good: say so, then end the connection
        return error_message(exc.code, str(exc)), exc.code in (
            ErrorCode.SESSION_EXPIRED,
            ErrorCode.ENV_TIMEOUT,
        )
    except Exception as exc:  # the env itself failed: an infrastructure fault, reported, never a crash
        return error_message(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}"), False
