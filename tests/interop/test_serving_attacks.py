"""``toolgym serve-env`` and ``toolgym serve-reward`` attacked as an outside client would, with an env that
misbehaves on purpose: malformed bodies, huge and slow bodies, unknown routes, an env that raises, hangs or
returns NaN, a reset that fails on a fresh session, concurrent steps on one session. Every answer is the
server's JSON error shape with a clear code, never a trace; no session leaks; an env fault is an
infrastructure error (EXECUTION_ERROR / ENV_TIMEOUT), never the model's."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import httpx
import pytest

pytest.importorskip("fastapi")

from toolgym.serving.base import Limits
from toolgym.serving.env_server import EnvServer

HOSTILE = "toolgym-tests/Hostile-v0"
RELEASE = threading.Event()  # a "hang" step waits for this


class Hostile(gym.Env):  # type: ignore[type-arg]
    """Misbehaves on request: ``reset(seed=13)`` raises; a step's message says what to do (``hang``,
    ``raise``, ``nan``, ``nan-info``, ``slow``); anything else is a normal step, the third one ends it."""

    action_space = gym.spaces.Text(100_000)
    observation_space = gym.spaces.Text(100_000)

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed == 13:
            raise RuntimeError("the sandbox did not start")
        self.steps = 0
        return [{"role": "user", "content": "go"}], {"seed": seed}

    def step(self, action: Any) -> Any:
        text = action if isinstance(action, str) else str(action)
        if text == "hang":
            RELEASE.wait(30)
        if text == "raise":
            raise OSError("the container went away")
        if text == "slow":
            time.sleep(0.05)
        self.steps += 1
        reward = math.nan if text == "nan" else 0.5
        info = {"score": math.inf if text == "nan-info" else 1.0, "step": self.steps}
        return [{"role": "tool", "content": f"step {self.steps}"}], reward, self.steps >= 3, False, info


if HOSTILE not in gym.registry:
    gym.register(HOSTILE, entry_point=Hostile, disable_env_checker=True)


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServer]:
    limits = Limits(max_body_bytes=2**16, body_timeout_s=1.0)
    with EnvServer(HOSTILE, port=0, max_sessions=4, call_timeout_s=1.0, limits=limits) as srv:
        yield srv


@pytest.fixture
def http(server: EnvServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
    RELEASE.set()


def error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert body["code"] == code, body
    assert "Traceback" not in resp.text
    return str(body["message"])


def sessions(http: httpx.Client) -> int:
    return int(http.get("/health").json()["sessions"])


def open_session(http: httpx.Client) -> str:
    return str(http.post("/reset", json={"seed": 1}).json()["observation"]["session_id"])


def step(http: httpx.Client, sid: str, message: Any) -> httpx.Response:
    return http.post("/step", json={"session_id": sid, "action": {"message": message}})


# ----- malformed input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/reset", "{oops", "JSON"),
        ("/reset", '{"seed": -1}', "seed"),
        ("/reset", '{"seed": "x"}', "seed"),
        ("/reset", '{"seed": NaN}', "seed"),
        ("/reset", '{"nope": 1}', "nope"),
        ("/step", "[]", "body"),
        ("/step", '{"action": {"message": "x"}}', "session_id"),
        ("/step", '{"session_id": 5, "action": {"message": "x"}}', "session_id"),
        ("/step", '{"session_id": "x", "action": {}}', "message"),
    ],
)
def test_malformed_bodies_are_422_validation_errors(
    http: httpx.Client, path: str, body: str, needle: str
) -> None:
    resp = http.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert needle in error(resp, 422, "VALIDATION_ERROR")  # (was FastAPI's {"detail": [...]})


def test_unknown_routes_sessions_and_methods(http: httpx.Client) -> None:
    error(http.get("/nothing"), 404, "NOT_FOUND")
    assert http.get("/step").json()["error"]["code"] == "NOT_FOUND"  # (405: a GET of a POST route)
    error(step(http, "f" * 32, "x"), 404, "SESSION_NOT_FOUND")
    error(http.get("/state", params={"session_id": "nope"}), 404, "SESSION_NOT_FOUND")
    error(http.delete("/sessions/nope"), 404, "SESSION_NOT_FOUND")


def test_huge_and_slow_bodies(server: EnvServer, http: httpx.Client) -> None:
    sid = open_session(http)
    error(step(http, sid, "x" * 2**17), 413, "BODY_TOO_LARGE")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # slowloris
        sock.sendall(
            b"POST /step HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 99\r\n\r\n{"
        )
        assert step(http, sid, "ok").status_code == 200  # others are served meanwhile
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"BODY_TIMEOUT" in answer
    http.delete(f"/sessions/{sid}")


# ----- env faults ------------------------------------------------------------------------------------------
def test_a_failed_reset_on_a_new_session_leaks_no_session(http: httpx.Client) -> None:
    before = sessions(http)
    for _ in range(6):  # more than max_sessions: with a leak, the fifth would be CAPACITY_REACHED
        assert "did not start" in error(http.post("/reset", json={"seed": 13}), 500, "EXECUTION_ERROR")
    assert sessions(http) == before


def test_env_faults_are_execution_errors_and_nan_is_never_sent(http: httpx.Client) -> None:
    sid = open_session(http)
    assert "container went away" in error(step(http, sid, "raise"), 500, "EXECUTION_ERROR")
    out = step(http, sid, "nan-info")
    assert out.status_code == 200 and out.json()["observation"]["info"]["score"] is None  # (was a 500)
    assert "non-finite reward" in error(step(http, sid, "nan"), 500, "EXECUTION_ERROR")
    error(step(http, sid, "ok"), 409, "EPISODE_OVER")  # the NaN step ended the episode: reset
    assert http.post("/reset", json={"session_id": sid, "seed": 2}).status_code == 200
    http.delete(f"/sessions/{sid}")


def test_a_hung_env_is_env_timeout_and_its_session_is_freed(http: httpx.Client) -> None:
    RELEASE.clear()
    sid = open_session(http)
    before = sessions(http)
    t0 = time.monotonic()
    assert "did not answer within 1 s" in error(step(http, sid, "hang"), 504, "ENV_TIMEOUT")
    assert time.monotonic() - t0 < 10
    assert sessions(http) == before - 1  # the slot is free though the env's thread is stuck
    error(step(http, sid, "ok"), 410, "SESSION_EXPIRED")
    RELEASE.set()


def test_concurrent_steps_on_one_session_run_one_after_another(http: httpx.Client) -> None:
    sid = open_session(http)
    codes: list[int] = []
    lock = threading.Lock()

    def go() -> None:
        resp = step(http, sid, "slow")
        with lock:
            codes.append(resp.status_code)

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # three steps end the episode: exactly three went through, the rest found it over; none was lost or doubled
    assert sorted(codes) == [200, 200, 200, 409, 409, 409]
    assert http.get("/state", params={"session_id": sid}).json()["step_count"] == 3
    http.delete(f"/sessions/{sid}")


def test_after_shutdown_sessions_are_closed_and_the_port_refuses() -> None:
    srv = EnvServer(HOSTILE, port=0).start()
    client = httpx.Client(base_url=srv.url, timeout=10)
    open_session(client)
    pool = srv.pool
    srv.close()
    assert pool.sessions == {}
    with pytest.raises(httpx.TransportError):
        client.post("/reset", json={})


# ----- the reward server -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reward_url() -> Iterator[str]:
    from toolgym.serving.reward_server import RewardServer

    def score(completions: list[str], **kw: Any) -> list[float | None]:
        out: list[float | None] = []
        for c in completions:
            if c == "boom":
                raise ValueError("the judge is down")
            out.append(math.nan if c == "nan" else None if c == "none" else 1.0)
        return out

    with RewardServer(score, port=0, limits=Limits(max_body_bytes=2**16)) as srv:
        yield srv.url


def test_reward_server_attacks(reward_url: str) -> None:
    post = lambda body: httpx.post(f"{reward_url}/get_reward", json=body, timeout=30)  # noqa: E731
    out = post({"query": ["ok", "nan", "none"]}).json()  # (a NaN was a 500: not JSON)
    assert out["rewards"] == [1.0, 0.0, 0.0] and out["extra_logs"]["valid"] == [1.0, 0.0, 0.0]
    boom = post({"query": ["boom"]})
    assert boom.status_code == 500 and "judge is down" in boom.json()["detail"]
    big = post({"query": ["x" * 2**17]})
    assert big.status_code == 413 and "detail" in big.json()
    assert httpx.get(f"{reward_url}/nothing", timeout=10).json()["detail"]
    assert post({"query": "notalist"}).status_code == 422


def test_websocket_attacks(server: EnvServer, http: httpx.Client) -> None:
    """Over /ws: bad frames are typed errors and the connection goes on (a binary frame was a KeyError in
    the handler); a hung env is ENV_TIMEOUT and ends the connection; no session is left open."""
    websockets = pytest.importorskip("websockets")
    import asyncio
    import json

    RELEASE.clear()
    before = sessions(http)

    async def talk() -> list[Any]:
        got: list[Any] = []
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            for frame in ["{oops", "[]", b"\x00\xff", '{"type": "fly"}', '{"type": "reset", "data": {"seed": 1}}',
                          '{"type": "step", "data": {"message": "hang"}}']:  # fmt: skip
                await ws.send(frame)
                got.append(json.loads(await ws.recv()))
            try:
                got.append(await asyncio.wait_for(ws.recv(), 10))
            except websockets.ConnectionClosed:
                got.append("closed")
        return got

    got = asyncio.run(talk())
    RELEASE.set()
    codes = [g["data"].get("code") if isinstance(g, dict) else g for g in got]
    assert codes == [
        "INVALID_JSON",
        "INVALID_JSON",
        "INVALID_JSON",
        "UNKNOWN_TYPE",
        None,
        "ENV_TIMEOUT",
        "closed",
    ]
    deadline = time.monotonic() + 10
    while sessions(http) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions(http) == before
