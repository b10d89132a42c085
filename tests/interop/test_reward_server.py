"""``toolgym serve-reward`` on FastAPI: OpenRLHF's request shape, pydantic validation (422), OpenAPI docs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from tests.processes import start, stop
from toolgym.rewards import Rubric, exact_match, tag_balance
from toolgym.serving.reward_server import RewardServer


@pytest.fixture(scope="module")
def url() -> object:
    with RewardServer(Rubric({"em": exact_match, "tags": tag_balance}, weights=[1.0, 0.0]), port=0) as server:
        yield server.url


def test_scores_in_openrlhf_shape(url: str) -> None:
    prompts = ["<|user|>Capital of France? Reply <answer>X</answer><|assistant|>"] * 3
    responses = ["<answer>Paris</answer>", "no idea", "<answer>Paris</answer>"]
    body = {"query": [p + r for p, r in zip(prompts, responses, strict=True)], "prompts": prompts}
    out = httpx.post(f"{url}/get_reward", json={**body, "labels": ["Paris", "Paris", ""]}, timeout=30)
    assert out.status_code == 200, out.text
    data = out.json()
    assert data["rewards"] == data["scores"] == [1.0, 0.0, 0.0]  # the prompt's example tag is not scored
    assert data["extra_logs"]["valid"] == [1.0, 1.0, 0.0] and data["extra_logs"]["tags"] == [1.0, 1.0, 1.0]
    # "queries" is accepted for "query", and an extra column reaches the rubric under its name
    alt = httpx.post(
        f"{url}/get_reward", json={"queries": ["<answer>4</answer>"], "answer": ["4"]}, timeout=30
    )
    assert alt.json()["rewards"] == [1.0]
    assert httpx.get(f"{url}/health", timeout=30).json() == {"ok": True, "parts": ["em", "tags"]}
    assert "/get_reward" in httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompts": ["x"]}, "query"),
        ({"query": []}, "query"),
        ({"query": [1, 2]}, "query"),
        ({"query": ["a", "b"], "labels": ["a"]}, "labels"),
        ({"query": ["a"], "prompts": ["a", "b"]}, "prompts"),
    ],
)
def test_bad_requests_are_422_with_the_field(url: str, body: dict[str, object], needle: str) -> None:
    out = httpx.post(f"{url}/get_reward", json=body, timeout=30)
    assert out.status_code == 422 and needle in out.text
    assert httpx.post(f"{url}/get_reward", content=b"{not json", timeout=30).status_code == 422


def test_the_cli_serves_on_uvicorn() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "toolgym", "serve-reward", "--reward", "exact_match", "--port", str(port)]
    proc = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                out = httpx.post(
                    f"http://127.0.0.1:{port}/get_reward",
                    json={"query": ["<answer>4</answer>"], "labels": ["4"]},
                    timeout=10,
                )
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()
                time.sleep(0.2)
        assert out.json()["rewards"] == [1.0]
        assert httpx.get(f"http://127.0.0.1:{port}/docs", timeout=10).status_code == 200
        assert httpx.post(f"http://127.0.0.1:{port}/get_reward", json={}, timeout=10).status_code == 422
    finally:
        stop(proc)
