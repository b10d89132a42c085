"""The retrieval server as users run it: ``toolgym serve-retriever`` in its own process (real uvicorn), asked
by an httpx client in Search-R1's shape; and the env against it, alive and dead."""

import json
import os
import socket
import subprocess
import sys
import time

import gymnasium as gym
import httpx
import pytest

import toolgym  # noqa: F401
from tests import processes
from tests.processes import start, stop
from toolgym.envs.search.sources import world


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args, env=None):
    port = _free_port()
    proc = start(
        [sys.executable, "-m", "toolgym", "serve-retriever", *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited: {proc.stdout.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("the server did not come up in 120 s")
    except BaseException:
        stop(proc)
        raise


@pytest.fixture(scope="module")
def server():
    proc, url = _serve(["--synthetic", "10000", "--topk", "3"])
    try:
        yield url
    finally:
        stop(proc)


def test_search_r1_client_request(server):
    # the request Search-R1's generation code sends, and the fields its _passages2string reads
    name = world(0, 10_000).org_names[0]
    payload = {"queries": [name, "capital"], "topk": 3, "return_scores": True}
    response = httpx.post(f"{server}/retrieve", json=payload, timeout=10)
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and all(len(r) == 3 for r in result)
    first = result[0][0]
    assert set(first) == {"document", "score"} and first["score"] > 0
    content = first["document"]["contents"]
    title = content.split("\n")[0]
    assert title == f'"{name}"' and first["document"]["title"] == name
    scores = [h["score"] for h in result[0]]
    assert scores == sorted(scores, reverse=True)


def test_defaults_bare_documents_and_bad_requests(server):
    response = httpx.post(f"{server}/retrieve", json={"queries": ["Gramyst College"]}, timeout=10)
    hits = response.json()["result"][0]
    assert len(hits) == 3 and "contents" in hits[0] and "score" not in hits[0]
    assert httpx.post(f"{server}/retrieve", json={"queries": []}, timeout=10).json() == {"result": []}
    for bad in (
        {"topk": 3},
        {"queries": "x"},
        {"queries": ["x"], "topk": 0},
        {"queries": ["x"], "topk": 10**6},
    ):
        assert httpx.post(f"{server}/retrieve", json=bad, timeout=10).status_code == 422


def test_env_through_the_server_matches_local(server):
    remote = gym.make("toolgym/Search-v0", retriever_url=server, hops=2)
    local = gym.make("toolgym/Search-v0", hops=2)
    for seed in range(5):
        a, b = remote.reset(seed=seed), local.reset(seed=seed)
        assert a[0] == b[0]
        while True:
            action = remote.unwrapped.expert_action()
            ra, rb = remote.step(action), local.step(action)
            assert ra[:4] == rb[:4]
            if ra[2] or ra[3]:
                assert ra[4]["success"]
                break


def test_dead_server_is_an_env_error_not_a_wrong_answer():
    env = gym.make(
        "toolgym/Search-v0", retriever_url=f"http://127.0.0.1:{_free_port()}", retries=2, timeout_s=1
    )
    env.reset(seed=0)
    start = time.monotonic()
    obs, reward, term, trunc, info = env.step(env.unwrapped.expert_action())
    assert trunc and not term and info["truncation"] == "env_error" and reward == 0.0
    assert "retrieval server" in info["infra_error"] and obs == []
    assert info["success"] is False and time.monotonic() - start < 10


@pytest.mark.slow
def test_search_index_writes_a_synthetic_corpus_the_env_and_server_read(tmp_path):
    env = {"TOOLGYM_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "kb"
    done = processes.run(
        [
            sys.executable,
            "-m",
            "toolgym",
            "search-index",
            "--synthetic",
            "2000",
            "--seed",
            "5",
            "--out",
            str(out),
        ],
        env={**os.environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "world.json").read_text())["num_passages"] == 2000
    lines = (out / "corpus.jsonl").read_text().splitlines()
    assert len(lines) == 2000 and {"id", "title", "text", "contents"} <= set(json.loads(lines[0]))
    proc, url = _serve(["--corpus", str(out / "corpus.jsonl")], env)
    try:
        e = gym.make("toolgym/Search-v0", corpus=str(out / "corpus.jsonl"), retriever_url=url, hops=3)
        wins = 0
        for seed in range(10):
            e.reset(seed=seed)
            while True:
                step = e.step(e.unwrapped.expert_action())
                if step[2] or step[3]:
                    wins += step[4]["success"]
                    break
        assert wins >= 9
    finally:
        stop(proc)


def test_a_query_with_a_lone_surrogate_is_searched_not_a_crash(server):
    """The client's JSON encoder raised on a lone surrogate (httpx encodes UTF-8): cleaned before it leaves."""
    from toolgym.envs.search.retriever import RemoteRetriever

    hits = RemoteRetriever(server).retrieve(["Gramyst \ud800 College"], 3)
    assert len(hits) == 1 and len(hits[0]) == 3
