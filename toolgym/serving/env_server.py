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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from toolgym.serving.base import AppServer
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

require("fastapi")  # first: a missing package says which extra brings it
# at module level: FastAPI reads the handlers' annotations (strings here) from these globals
from fastapi import FastAPI, Query, WebSocket, WebSocketDisconnect  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

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


class SessionPool:
    """The open sessions: made on demand, run on their own thread, reaped when idle."""

    def __init__(self, make_env: Callable[[], Any], max_sessions: int, idle_timeout_s: float | None) -> None:
        self.make_env = make_env
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
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
        session = Session(uuid.uuid4().hex, env, executor)
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
            return await asyncio.get_running_loop().run_in_executor(session.executor, fn, *args)
        finally:
            session.busy -= 1
            session.last_active = time.monotonic()

    async def close(self, session: Session, why: str | None = None) -> None:
        if session.closed:
            return
        session.closed = True
        self.sessions.pop(session.id, None)
        if why is not None:
            self._expired[session.id] = why
            while len(self._expired) > 10_000:
                self._expired.popitem(last=False)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):  # closing is best effort: the slot is free either way
            await loop.run_in_executor(session.executor, session.env.close)
        session.executor.shutdown(wait=False)

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
    observation = Observation(messages=jsonable(obs), info=jsonable(info))
    return {"observation": observation.model_dump(), "reward": None, "done": False}


def _do_step(session: Session, data: StepData) -> dict[str, Any]:
    if not session.started:
        raise SessionError(ErrorCode.NO_EPISODE, "no episode yet: send reset first")
    if session.done:
        raise SessionError(ErrorCode.EPISODE_OVER, "the episode is over: send reset to start another")
    try:
        obs, reward, terminated, truncated, info = session.env.step(data.message)
    except EpisodeOverError as exc:
        raise SessionError(ErrorCode.EPISODE_OVER, str(exc)) from exc
    session.step_count += 1
    session.done = bool(terminated or truncated)
    session.episode_reward += float(reward)
    observation = Observation(
        messages=jsonable(obs),
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
            }
        finally:
            probe.close()
        self.expert = expert
        self.pool = SessionPool(lambda: gym.make(env_id, **self.env_kwargs), max_sessions, idle_timeout_s)
        super().__init__(build_env_app(self), host, port)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)


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

    def http_error(exc: SessionError) -> Any:
        body = {"error": {"code": exc.code.value, "message": str(exc)}}
        return JSONResponse(status_code=exc.status, content=body)

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
        try:
            session = pool.get(req.session_id) if req.session_id else await pool.open()
            data = ResetData(**req.model_dump(exclude={"session_id"}))
            try:
                out = await pool.run(session, _do_reset, session, data)
            except SessionError:
                raise
            except Exception as exc:
                raise SessionError(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}", 500) from exc
        except SessionError as exc:
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
                raw = await websocket.receive_text()
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


async def _answer(server: EnvServer, session: Session, raw: str) -> tuple[dict[str, Any] | None, bool]:
    """The reply to one WebSocket message, and whether the connection ends after it."""
    pool = server.pool
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        return error_message(ErrorCode.INVALID_JSON, f"invalid JSON: {exc}"), False
    kind = payload.get("type") if isinstance(payload, dict) else None
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
        # an expired session is over for good: say so, then end the connection
        return error_message(exc.code, str(exc)), exc.code is ErrorCode.SESSION_EXPIRED
    except Exception as exc:  # the env itself failed: an infrastructure fault, reported, never a crash
        return error_message(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}"), False
