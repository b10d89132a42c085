"""toolgym/Remote-v0: an env that lives on a server (``toolgym serve-env``, or any OpenEnv server), driven over
OpenEnv's WebSocket protocol (``toolgym.serving.protocol``)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, ClassVar

import gymnasium as gym

from toolgym.envs.base import DEFAULT_MAX_OBSERVATION_CHARS, Task, ToolEnv, cap_messages, cap_text
from toolgym.errors import ConfigError, EpisodeOverError, InfrastructureError
from toolgym.messages import Message
from toolgym.optional import require
from toolgym.parsing import clean_json
from toolgym.tools import Tool, ToolSpec

# a reply with one of these codes means "this connection's session is gone": a fresh connection may work
_RETRYABLE = {"CAPACITY_REACHED", "SESSION_EXPIRED", "SESSION_ERROR"}
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# pydantic error types that say the action's shape (its key, its JSON type) does not fit the server's schema:
# a setting to fix. Any other (a literal, a pattern, a length, a number that does not parse) judges its content
_SHAPE_ERRORS = {"missing", "extra_forbidden"}  # and every "…_type" (a string where a dict goes, …)


class _Broken(Exception):
    """The connection failed (refused, closed, timed out, or garbled): an infrastructure fault."""


class RemoteEnv(ToolEnv):
    """An env served elsewhere, driven over OpenEnv's WebSocket protocol.

    ## Description
    Each instance holds one WebSocket connection to ``url`` (``ws://HOST:PORT``; ``/ws`` is appended), which
    is one session with its own env on the server, reused across episodes. Against ``toolgym serve-env`` the
    episode is exactly the served env's: the same messages, rewards, ``info`` and transcript. Against another
    OpenEnv server, its observation dict becomes one user message (its ``text``/``prompt``/``content``
    field, else the JSON) and its ``reward``/``done`` are passed through. With no ``url``, the env serves
    ``serve`` (default ``toolgym/Calculator-v0``) in this process and drives it over the same protocol: a
    loopback for tests and the env checks.

    ## Action Space
    Text, or an assistant message dict: sent as ``{"type": "step", "data": {action_key: action}}``
    (``action_key`` "message" for toolgym servers; set it to the field another server's action expects). Lone
    surrogates (a JSON ``\\ud800`` in the model's call) are replaced first (``clean_json``): another server failed
    to write them back (an env_error). A message (structured tool calls) that another server's schema refuses
    is sent again as its text (content, then each call as a Hermes ``<tool_call>`` block), and from then on as
    text. Special-token text is sent as it is: an env reads actions, it does not tokenize them as a prompt.

    ## Observation Space
    ``Messages``: on reset the served env's system prompt and task; on each step its new messages.

    ## Tools
    The served env's (its ``info["tools"]`` on reset; none before the first reset).

    ## Rewards
    The server's: each step's ``reward`` as it sent it (``info["reward_components"]`` from toolgym servers).
    ``info["success"]`` at the episode's end is the server's own where it sends one (toolgym servers; a
    boolean ``success`` in another server's observation); otherwise it is derived from the end: the server
    said ``done`` (not a truncation) and the last reward is above ``success_reward`` (0), so a won game
    that rewards 1 (or any positive reward) for winning counts as a success.

    ## Starting State
    ``reset(seed=…)`` sends the seed; the server draws the task (same seed, same task).

    ## Episode End
    When the server says ``done`` (``info["truncation"]`` from toolgym servers). An action whose content the
    server's schema refuses (a ``VALIDATION_ERROR`` naming a literal, a pattern, a length, …; not its key or
    type) is the model's invalid action: a user message saying why, ``format_penalty``, ``invalid_action``; the
    server never saw it, so its episode goes on, and ``max_turns`` refusals in a row end it (``turn_limit``).
    A refusal of the action's shape (the wrong ``action_key``) raises ``ConfigError``. A server that cannot be
    reached on ``reset`` (after ``retries`` fresh connections, ``retry_backoff_s`` apart, doubling) raises
    ``InfrastructureError``. A connection lost or a reply missing ``read_timeout_s`` during a step, or a
    server-side failure, ends the episode with ``truncated=True``, ``info["truncation"]="env_error"`` and
    reward 0: an infrastructure fault, never scored as the model's failure. A step is never retried (the
    episode lived in the lost session).

    ## Arguments
    ``url`` (None: loopback), ``serve`` ("toolgym/Calculator-v0": the loopback's env), ``serve_kwargs``
    (its gym.make kwargs), ``action_key`` ("message"), ``success_reward`` (0: a final reward above it is a
    success, for servers that send no ``success``), ``connect_timeout_s`` (10), ``read_timeout_s`` (60),
    ``retries`` (2), ``retry_backoff_s`` (0.5), ``format_penalty`` (-0.1: a refused action's reward),
    ``max_observation_chars`` (32,000: this side's cap on one message, see docs/envs.md), ``render_mode``.
    The served env's own settings (``max_turns``, ``prompt_format``, …) belong to the server
    (``toolgym serve-env ID --env-kwargs``).

    ## Version History
    - v0: first version (the toolgym and OpenEnv WebSocket protocols; loopback); actions cleaned of lone
      surrogates, refused contents are invalid actions, refused messages are resent as text.
    """

    family: ClassVar[str] = "remote"
    # the loopback's (Calculator-v0's) expert; a server's declared rate is read from its /metadata
    expert_success_rate: ClassVar[float] = 1.0
    supports_fork: ClassVar[bool] = False
    reward_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        url: str | None = None,
        serve: str = "toolgym/Calculator-v0",
        serve_kwargs: dict[str, Any] | None = None,
        action_key: str = "message",
        success_reward: float = 0.0,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        retries: int = 2,
        retry_backoff_s: float = 0.5,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS,
        **served_settings: Any,
    ) -> None:
        if served_settings:
            raise ConfigError(
                f"Remote-v0 got {sorted(served_settings)}: the served env's settings belong to the server "
                "(`toolgym serve-env ID --env-kwargs '{...}'`, or serve_kwargs= for the loopback)"
            )
        if connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise ConfigError("connect_timeout_s and read_timeout_s must be > 0")
        if retries < 0 or retry_backoff_s < 0:
            raise ConfigError("retries and retry_backoff_s must be >= 0")
        self.url = url
        self.serve = serve
        self.serve_kwargs = dict(serve_kwargs or {})
        self.action_key = action_key
        self.success_reward = float(success_reward)
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self._ws: Any = None
        self._stack: contextlib.ExitStack | None = None
        self._meta: dict[str, Any] | None = None
        self._remote_specs: list[ToolSpec] = []
        self._text_actions = False  # the server took a message only as its text: send text from then on
        self._refused = 0  # refused actions in a row (the server never saw them)
        super().__init__(
            render_mode=render_mode,
            format_penalty=format_penalty,
            max_observation_chars=max_observation_chars,
        )

    # ----- the connection ----------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The server's http(s) address (the loopback's once started)."""
        if self.url is None:
            return _loopback(self.serve, self.serve_kwargs).url
        url = self.url.rstrip("/")
        url = url[: -len("/ws")] if url.endswith("/ws") else url
        for ws, http in (("ws://", "http://"), ("wss://", "https://")):
            if url.startswith(ws):
                return http + url[len(ws) :]
        return url if url.startswith(("http://", "https://")) else f"http://{url}"

    def _connect(self) -> None:
        connect = require("websockets.sync.client", why="Remote-v0 speaks WebSocket").connect
        base = self.base_url
        ws_url = "ws" + base[len("http") :] + "/ws"
        stack = contextlib.ExitStack()
        try:
            self._ws = stack.enter_context(
                connect(ws_url, open_timeout=self.connect_timeout_s, max_size=_MAX_MESSAGE_BYTES)
            )
            self._stack = stack
        except Exception as exc:  # refused, DNS, handshake, timeout: all "cannot reach it"
            raise _Broken(f"cannot connect to {ws_url}: {type(exc).__name__}: {exc}") from exc
        if self._meta is None:
            self._meta = self._metadata(base)
            turns = self._meta.get("max_turns")
            if isinstance(turns, int) and turns > 0:
                self.max_turns = turns  # the expert check plays at most this many turns
            rate = self._meta.get("expert_success_rate")
            if isinstance(rate, (int, float)):
                self.__dict__["expert_success_rate"] = float(rate)  # the served env's, over the class default

    def _metadata(self, base: str) -> dict[str, Any]:
        import httpx

        try:
            meta = httpx.get(f"{base}/metadata", timeout=self.connect_timeout_s).json()
        except Exception:  # another server may have no metadata: not needed to play
            return {}
        return meta if isinstance(meta, dict) else {}

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        stack, self._stack = self._stack, None
        if ws is not None:
            with contextlib.suppress(Exception):  # best effort: the server frees the session either way
                ws.send(json.dumps({"type": "close"}))
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.close()

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            raise _Broken("not connected")
        try:
            self._ws.send(json.dumps(clean_json(message)))
            raw = self._ws.recv(timeout=self.read_timeout_s)
        except TimeoutError as exc:
            raise _Broken(f"no reply within {self.read_timeout_s:g} s (read_timeout_s)") from exc
        except Exception as exc:  # the connection closed or failed
            raise _Broken(f"the connection to {self.base_url} failed: {type(exc).__name__}: {exc}") from exc
        try:  # both ways without lone surrogates: a "\\ud800" escape decodes to one, and UTF-8 writers refuse it
            reply = clean_json(json.loads(raw))
        except (TypeError, ValueError) as exc:
            raise _Broken(f"the server sent something that is not JSON: {str(raw)[:200]!r}") from exc
        if not isinstance(reply, dict):
            raise _Broken(f"the server sent {type(reply).__name__}, not a JSON object")
        return reply

    # ----- the gymnasium API ---------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        return []  # the served env's tools arrive with reset (tool_specs)

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return list(self._remote_specs)

    # A proxy: the episode loop runs on the server, so this env alone replaces ToolEnv's final reset/step.
    def reset(  # type: ignore[misc]
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        gym.Env.reset(self, seed=seed)
        data: dict[str, Any] = {} if seed is None else {"seed": seed}
        if options:
            data["options"] = options
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            try:
                if self._ws is None:
                    self._connect()
                reply = self._request({"type": "reset", "data": data})
                if reply.get("type") == "error" and _code(reply) in _RETRYABLE:
                    raise _Broken(_describe(reply))
                break
            except _Broken as exc:
                problem = str(exc)
                self._drop()
        else:
            raise InfrastructureError(
                f"Remote-v0: {self.url or 'the loopback server'} did not answer reset after "
                f"{self.retries + 1} tries: {problem}"
            )
        if reply.get("type") != "observation":
            raise ConfigError(f"Remote-v0: the server refused reset: {_describe(reply)}")
        messages, info, *_ = _read(reply.get("data") or {})
        # another OpenEnv server's observation may be any size: this side caps it as ToolEnv.step does
        messages, cuts = cap_messages(messages, self.max_observation_chars)
        if cuts:
            info["observation_truncated"] = cuts
        self._remote_specs = [ToolSpec.from_dict(t) for t in info.get("tools") or [] if isinstance(t, dict)]
        self._transcript = [_message(m) for m in messages]
        prompt = next((m.text for m in reversed(self._transcript) if m.role == "user"), "")
        self._task = Task(task_id=str(info.get("task_id") or f"remote-{seed}"), prompt=prompt)
        self._turn = 0
        self._done = False
        self._episode_reward = 0.0
        info.setdefault("task_id", self._task.task_id)
        return [m.to_dict() for m in self._transcript], info

    def step(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:  # type: ignore[misc]
        if self._task is None or self._done:
            raise EpisodeOverError("the episode is over (or never started): call reset() before step()")
        self._turn += 1
        action = _wire(action)  # what the server gets, and the transcript records
        if self._text_actions and isinstance(action, dict) and (as_text := _as_text(action)) is not None:
            action = as_text
        try:
            reply = self._request({"type": "step", "data": {self.action_key: action}})
            text = _as_text(action) if isinstance(action, dict) else None
            if _code(reply) == "VALIDATION_ERROR" and text is not None:
                # refused before its env ran, so sending it again repeats nothing
                again = self._request({"type": "step", "data": {self.action_key: text}})
                if _code(again) != "VALIDATION_ERROR" or _content_refusal(again):
                    action, reply, self._text_actions = text, again, True
        except _Broken as exc:
            return self._env_error(action, str(exc))
        if reply.get("type") == "error":
            code = _code(reply)
            if code == "EPISODE_OVER":
                raise EpisodeOverError(f"Remote-v0: {_describe(reply)}")
            if code == "VALIDATION_ERROR":
                if _content_refusal(reply):  # the model's text does not fit: its invalid action
                    return self._refusal(action, reply)
                raise ConfigError(  # the action's shape does not fit the server's schema: a setting to fix
                    f"Remote-v0: the server refused the action ({_describe(reply)}); check action_key"
                )
            return self._env_error(action, f"the server failed: {_describe(reply)}")
        if reply.get("type") != "observation":
            return self._env_error(action, f"unexpected reply {str(reply)[:200]}")
        self._refused = 0
        messages, info, assistant, reward, terminated, truncated = _read(reply.get("data") or {})
        messages, cuts = cap_messages(messages, self.max_observation_chars)
        if cuts:
            info["observation_truncated"] = cuts
        self._transcript.append(_message(assistant) if assistant else _assistant(action))
        self._transcript.extend(_message(m) for m in messages)
        self._episode_reward += reward
        info.setdefault("task_id", self._task.task_id)
        info.setdefault("turn", self._turn)
        info.setdefault("invalid_action", False)
        if terminated or truncated:
            self._done = True
            if not isinstance(info.get("success"), bool):  # a server that does not say: read its end
                info["success"] = bool(terminated and reward > self.success_reward)
            info.setdefault("episode_reward", self._episode_reward)
        return messages, reward, terminated, truncated, info

    def _refusal(
        self, action: Any, reply: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """An action the server's schema refused for its content: an invalid action (it never reached the env)."""
        self._refused += 1
        self._transcript.append(_assistant(action))
        why = "; ".join(
            str(e.get("msg", e)) for e in (reply.get("data") or {}).get("errors") or [] if isinstance(e, dict)
        )
        # the server's error text may quote the whole action
        said = f"Invalid action: the environment refused it ({why or _describe(reply)})."
        feedback = Message(role="user", content=cap_text(said, self.max_observation_chars))
        self._transcript.append(feedback)
        reward = self.format_penalty
        self._episode_reward += reward
        truncated = self._refused >= self.max_turns
        info: dict[str, Any] = {
            "task_id": self.task.task_id,
            "turn": self._turn,
            "invalid_action": True,
            "tool_calls": 0,
            "reward_components": {"format": reward},
        }
        if truncated:
            self._done = True
            info.update(truncation="turn_limit", success=False, episode_reward=self._episode_reward)
        return [feedback.to_dict()], reward, False, truncated, info

    def _env_error(
        self, action: Any, why: str
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """The episode ends as an infrastructure fault: truncated, reward 0, never the model's failure."""
        self._drop()
        self._done = True
        self._transcript.append(_assistant(action))
        info = {
            "task_id": self.task.task_id,
            "turn": self._turn,
            "invalid_action": False,
            "tool_calls": 0,
            "reward_components": {},
            "truncation": "env_error",
            "infra_error": f"Remote-v0: {why}",
            "success": False,
            "episode_reward": self._episode_reward,
        }
        return [], 0.0, False, True, info

    def expert_action(self) -> str:
        """The served env's scripted expert (servers started with ``--expert``; the loopback is)."""
        try:
            reply = self._request({"type": "expert"})
        except _Broken as exc:
            raise InfrastructureError(f"Remote-v0: {exc}") from exc
        if reply.get("type") != "expert":
            raise ConfigError(f"Remote-v0: no expert from the server: {_describe(reply)}")
        return str((reply.get("data") or {}).get("action", ""))

    def server_state(self) -> dict[str, Any]:
        """The server's ``state`` reply (episode id, step count, its transcript)."""
        try:
            reply = self._request({"type": "state"})
        except _Broken as exc:
            raise InfrastructureError(f"Remote-v0: {exc}") from exc
        return dict(reply.get("data") or {})

    def get_state(self) -> dict[str, Any]:
        raise ConfigError("Remote-v0 cannot fork: the episode lives on the server")

    def set_state(self, state: dict[str, Any]) -> None:
        raise ConfigError("Remote-v0 cannot fork: the episode lives on the server")

    def close(self) -> None:
        self._drop()
        super().close()


# ----- wire helpers ----------------------------------------------------------------------------------------
def _code(reply: dict[str, Any]) -> str:
    return str((reply.get("data") or {}).get("code", ""))


def _describe(reply: dict[str, Any]) -> str:
    data = reply.get("data") or {}
    return f"{data.get('message', reply)} ({data.get('code', 'no code')})"


def _wire(action: Any) -> Any:
    """The action as JSON can carry it (a Message as its dict; anything else unknown as its text), with no lone
    surrogate: another server's UTF-8 writer refuses them (toolgym.parsing.clean_json)."""
    if hasattr(action, "to_dict"):
        action = action.to_dict()
    try:
        json.dumps(action)
    except (TypeError, ValueError):
        action = str(action)
    return clean_json(action)


def _as_text(action: dict[str, Any]) -> str | None:
    """An assistant message dict as the text a model would have written (Hermes tool-call blocks); None when
    ``action`` is not one."""
    if action.get("role") != "assistant":
        return None
    parts = [str(action.get("content") or "")] if action.get("content") else []
    for call in action.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(ValueError):  # else kept as the string the model wrote
                args = json.loads(args) if args.strip() else {}
        parts.append(f"<tool_call>{json.dumps({'name': fn.get('name'), 'arguments': args})}</tool_call>")
    return "\n".join(parts)


def _content_refusal(reply: dict[str, Any]) -> bool:
    """A ``VALIDATION_ERROR`` about what the action says, not its shape (``_SHAPE_ERRORS``): each error has a
    pydantic type, and none is a shape one."""
    if _code(reply) != "VALIDATION_ERROR":
        return False
    errors = (reply.get("data") or {}).get("errors")
    if not isinstance(errors, list) or not errors:
        return False
    types = [str(e.get("type", "")) if isinstance(e, dict) else "" for e in errors]
    return all(t and t not in _SHAPE_ERRORS and not t.endswith("_type") for t in types)


def _assistant(action: Any) -> Message:
    if isinstance(action, Message):
        return action
    if isinstance(action, dict) and action.get("role") == "assistant":
        try:
            return Message.from_dict(action)
        except Exception:  # a malformed dict: kept as its text
            pass
    return Message(role="assistant", content=action if isinstance(action, str) else json.dumps(_wire(action)))


def _message(data: Any) -> Message:
    try:
        return Message.from_dict(data)
    except Exception:  # another server's shape: its text as a user message
        return Message(role="user", content=data if isinstance(data, str) else json.dumps(data))


def _text(observation: Any) -> str:
    if isinstance(observation, str):
        return observation
    if isinstance(observation, dict):
        for key in ("text", "prompt", "content", "message", "output", "echoed_message"):
            if isinstance(observation.get(key), str):
                return str(observation[key])
    return json.dumps(observation)


def _read(
    data: dict[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None, float, bool, bool]:
    """(messages, info, assistant turn, reward, terminated, truncated) of an observation reply; a toolgym
    server sends messages, another OpenEnv server one observation dict."""
    obs = data.get("observation")
    reward = float(data.get("reward") or 0.0)
    if isinstance(obs, dict) and isinstance(obs.get("messages"), list):
        info = dict(obs.get("info") or {})
        return (
            list(obs["messages"]),
            info,
            obs.get("assistant"),
            reward,
            bool(obs.get("terminated")),
            bool(obs.get("truncated")),
        )
    done = bool(data.get("done"))
    theirs: dict[str, Any] = {"openenv_observation": obs}
    said = obs.get("success") if isinstance(obs, dict) else None
    if isinstance(said, bool):
        theirs["success"] = said
    return [{"role": "user", "content": _text(obs)}], theirs, None, reward, done, False


# ----- the loopback ----------------------------------------------------------------------------------------
_LOOPBACKS: dict[tuple[int, str, str], Any] = {}
_LOOPBACK_LOCK = threading.Lock()


def _loopback(env_id: str, kwargs: dict[str, Any]) -> Any:
    """One in-process ``EnvServer`` per (process, env id, kwargs), with the expert on, started once."""
    import os

    key = (os.getpid(), env_id, json.dumps(kwargs, sort_keys=True, default=str))
    with _LOOPBACK_LOCK:
        server = _LOOPBACKS.get(key)
        if server is None:
            from toolgym.serving.env_server import EnvServer

            server = EnvServer(env_id, kwargs, port=0, max_sessions=4096, idle_timeout_s=None, expert=True)
            _LOOPBACKS[key] = server.start()
        return server
