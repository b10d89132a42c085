"""The rollout-server client's CPU a turn (``ServerBackend``, agents/vllm_policy.py), beside plain httpx and the
openai SDK posting the same turns, and what that CPU does to a learner thread sharing the process.

Why: with ``engine: vllm`` and ``rollout_servers`` in the asynchronous layout, the client runs in the trainer's
process beside the learner's update, so every millisecond of Python it spends on a turn (building the body,
the HTTP exchange, parsing and checking the answer, routing) is taken from the GIL that update needs to launch
its kernels. This times that client alone, against a stand-in server that answers at once (a child process:
its CPU is not counted), so the number is the client's own cost, not the engine's.

- client CPU: R turns (prompts of ``--prompt`` ids, replies of ``--reply`` ids) submitted at once and polled
  until all ended, after one warm-up burst; ``time.process_time()`` of this process over the burst.
- anchors in the same run: the same turns posted by a plain ``httpx.Client`` from a thread pool of the same
  size (roughly the client before the urllib3/queue/numpy fixes), and by the openai SDK's
  ``client.completions.create`` (when ``openai`` is installed), each answer checked by the same
  ``completed_from_answer`` / ``completed_from_choice`` as ours. (The SDK's CPU is mostly its request-params
  transform, which walks the prompt's ids one by one: ~40 of 47 ms a call under cProfile, 2026-11-28.)
- learner beside it: a thread running a fixed Python loop with short GIL-free sleeps (an update launching
  kernels and waiting on them), timed alone and while a client posts turns; the ratio is the slowdown. Two
  ways: at ``--pace`` turns/s (``--tick`` turns at a time: a real server's pace is set by its GPU, the same
  for every client, so the slowdowns compare clients at equal work; ``learner_slowdown_ours`` / ``_httpx``),
  and flat out (turns back to back against a server that answers at once: a faster client posts more turns
  a second, so read that slowdown with the turns/s beside it).

    python benchmarks/server_client.py            # 384 turns, writes benchmarks/results/server_client.{md,json}
    python benchmarks/server_client.py --quick    # 32 turns (the test's smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import device_name

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "server_client"


# ----- the stand-in server (a child process) ----------------------------------------------------------------
def serve(reply: int) -> None:
    """Answer every completions request at once with a vLLM-shaped body of ``reply`` ids; print the port."""
    ids = list(range(100, 100 + reply))
    # everything but the echoed prompt is the same in every answer: rendered once
    head = json.dumps({"id": "cmpl-bench", "object": "text_completion", "model": "m", "choices": [{
        "index": 0, "text": "x" * reply, "finish_reason": "length", "token_ids": ids,
        "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * reply,
                     "top_logprobs": None},
        "prompt_token_ids": None}]})  # fmt: skip
    before, after = head.rsplit("null", 1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the clients reuse their connections, as with vLLM

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            raw = (before + json.dumps(body["prompt"]) + after).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 1024  # (the default backlog of 5 drops the connects of a 256-thread burst)
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


# ----- the clients ------------------------------------------------------------------------------------------
Burst = Callable[[list[list[int]], list[int]], None]  # (prompts, a counter of ended turns)


def ours(url: str, workers: int, body: dict[str, Any]) -> tuple[Burst, Callable[[], None]]:
    from toolgym.agents.vllm_policy import ServerBackend

    backend = ServerBackend([url], workers=workers)

    def burst(prompts: list[list[int]], ended: list[int]) -> None:
        for r, ids in enumerate(prompts):
            backend.submit(f"t{r}", ids, body)
        got = 0
        while got < len(prompts):
            n = len(backend.poll())
            got += n
            ended[0] += n

    def close() -> None:
        backend.pool.shutdown()
        backend.turns.clear()
        backend.client.close()

    return burst, close


def pooled(workers: int, one: Callable[[list[int]], object]) -> Burst:
    pool = ThreadPoolExecutor(workers)

    def burst(prompts: list[list[int]], ended: list[int]) -> None:
        for fut in [pool.submit(one, ids) for ids in prompts]:
            fut.result()
            ended[0] += 1

    return burst


def plain_httpx(url: str, workers: int, body: dict[str, Any]) -> tuple[Burst, Callable[[], None]]:
    import httpx

    from toolgym.agents.vllm_policy import completed_from_answer

    client = httpx.Client(timeout=600.0, limits=httpx.Limits(max_connections=workers))

    def one(ids: list[int]) -> object:
        payload = dict(body, prompt=ids, return_token_ids=True, return_tokens_as_token_ids=True)
        resp = client.post(f"{url}/v1/completions", json=payload)
        resp.raise_for_status()
        return completed_from_answer(resp.content, body["max_tokens"], None, ids)

    return pooled(workers, one), client.close


def openai_sdk(url: str, workers: int, body: dict[str, Any]) -> tuple[Burst, Callable[[], None]]:
    import openai

    from toolgym.agents.vllm_policy import completed_from_choice

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600.0)

    def one(ids: list[int]) -> object:
        out = client.completions.create(
            model="m",
            prompt=ids,
            max_tokens=body["max_tokens"],
            temperature=body["temperature"],
            logprobs=body["logprobs"],
            extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
        )
        return completed_from_choice(out.choices[0].model_dump())  # (token_ids: an extra field it keeps)

    return pooled(workers, one), client.close


# ----- the learner stand-in ---------------------------------------------------------------------------------
def learner(steps: int) -> float:
    """Seconds for ``steps`` of a little Python (holding the GIL) then a short sleep (releasing it, as a kernel
    launch and wait would): a thread slowed only by waiting for the GIL back after each sleep."""
    t = time.perf_counter()
    x = 0
    for _ in range(steps):
        for j in range(300):
            x += j
        time.sleep(0.0002)
    return time.perf_counter() - t


def beside(
    burst: Burst, prompts: list[list[int]], ended: list[int], args: argparse.Namespace, pace: float | None
) -> tuple[float, float]:
    """(the learner stand-in's median seconds over 3 runs, turns/s ended meanwhile) while a thread posts turns:
    ``--tick`` at a time, ``pace`` turns a second (a server whose GPU sets the pace), or back to back (None)."""
    stop = threading.Event()
    ticks = [prompts[i : i + args.tick] for i in range(0, len(prompts), args.tick)]

    def posting() -> None:
        due, k = time.perf_counter(), 0
        while not stop.is_set():
            if pace is None:
                burst(prompts, ended)
                continue
            burst(ticks[k % len(ticks)], ended)
            k += 1
            due += args.tick / pace
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                due = time.perf_counter()  # fell behind (a client slower than the pace): no catch-up rush

    poster = threading.Thread(target=posting, daemon=True)
    poster.start()
    time.sleep(0.2)  # (its first turns in flight)
    runs, turns = [], 0
    for _ in range(3):
        n0 = ended[0]
        runs.append(learner(args.learner_steps))
        turns += ended[0] - n0
    stop.set()
    poster.join()
    return statistics.median(runs), turns / sum(runs)


def measure(
    key: str,
    name: str,
    make: Callable[[], tuple[Burst, Callable[[], None]]],
    args: argparse.Namespace,
    alone: float,
) -> dict[str, Any]:
    prompts = [list(range(1000 + r, 1000 + r + args.prompt)) for r in range(args.turns)]
    burst, close = make()
    ended = [0]
    try:
        burst(prompts, ended)  # warm-up: threads started, connections open
        t, c = time.perf_counter(), time.process_time()
        burst(prompts, ended)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        paced = beside(burst, prompts, ended, args, pace=args.pace)
        flat = beside(burst, prompts, ended, args, pace=None)
    finally:
        close()
    row = {
        "key": key,
        "client": name,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_turn": round(1000 * cpu / args.turns, 3),
        "turns_per_s": round(args.turns / wall, 1),
        "learner_beside_s": round(paced[0], 3),
        "learner_slowdown": round(paced[0] / alone, 2),
        "turns_per_s_beside_learner": round(paced[1], 1),
        "learner_beside_flat_out_s": round(flat[0], 3),
        "learner_slowdown_flat_out": round(flat[0] / alone, 2),
        "turns_per_s_beside_learner_flat_out": round(flat[1], 1),
    }
    print(json.dumps(row), flush=True)
    return row


def report(result: dict[str, Any]) -> str:
    lines = [
        "# Rollout-server client: CPU a turn, and a learner thread beside it",
        "",
        "What the trainer's process spends on each turn it posts to a rollout server (`ServerBackend`,",
        "agents/vllm_policy.py), in the GIL its update shares in the asynchronous layout; benchmarks/server_client.py",
        "says how. The stand-in server (stdlib `ThreadingHTTPServer`, a child process) answers at once.",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']}; {result['date']}  ",
        f"Turns: {result['turns']} (prompts of {result['prompt_ids']} ids, replies of {result['reply_ids']}), "
        f"{result['workers']} threads; learner stand-in alone {result['learner_alone_s']} s "
        f"({result['learner_steps']} steps, median of 3)",
        "",
        f"| client | wall s | client CPU s | CPU ms a turn | turns/s | learner slowdown at {result['pace']} turns/s "
        "(turns/s reached) | learner slowdown flat out (turns/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['client']} | {row['wall_s']} | {row['cpu_s']} | {row['cpu_ms_per_turn']} | "
            f"{row['turns_per_s']} | {row['learner_slowdown']}x ({row['turns_per_s_beside_learner']}) | "
            f"{row['learner_slowdown_flat_out']}x ({row['turns_per_s_beside_learner_flat_out']}) |"
        )
    if result.get("note"):
        lines += ["", result["note"]]
    lines += [
        "",
        "CPU is `time.process_time()` of the client's process over one timed burst (after a warm-up burst): every",
        "thread of it, the server's excluded. Learner slowdown: the learner stand-in's time (a Python loop with",
        "short GIL-free sleeps, median of 3) while that client posts turns, over its time alone; at the pace every",
        f"client posts the same turns a second ({result['tick']} at a time; a client that cannot keep up posts",
        "fewer, see the turns/s reached), flat out it posts back to back against a server that answers at once",
        "(a faster client posts more). Timings on a shared 2-core machine are noisy.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=384)
    ap.add_argument("--prompt", type=int, default=500, help="ids a prompt")
    ap.add_argument("--reply", type=int, default=80, help="ids a reply")
    ap.add_argument("--workers", type=int, default=256, help="threads (the trainer's ServerBackend: >= 256)")
    ap.add_argument("--learner-steps", type=int, default=2000)
    ap.add_argument(
        "--pace", type=float, default=100.0, help="turns/s posted beside the learner (a GPU's pace)"
    )
    ap.add_argument("--tick", type=int, default=8, help="turns posted at a time at that pace")
    ap.add_argument("--quick", action="store_true", help="32 turns, a shorter learner (the test's smoke run)")
    ap.add_argument("--out", type=Path, default=OUT, help="writes OUT.md and OUT.json")
    ap.add_argument(
        "--serve", action="store_true", help=argparse.SUPPRESS
    )  # (the child: the stand-in server)
    args = ap.parse_args()
    if args.serve:
        serve(args.reply)
        return
    if args.quick:
        args.turns, args.learner_steps = 32, 300

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--reply", str(args.reply)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        body = {"max_tokens": args.reply, "temperature": 1.0, "logprobs": 0}
        learner(args.learner_steps // 4)  # (warm)
        alone = statistics.median(learner(args.learner_steps) for _ in range(3))
        rows = [
            measure("ours", "ServerBackend (urllib3)", lambda: ours(url, args.workers, body), args, alone),
            measure(
                "httpx",
                "httpx.Client, thread pool",
                lambda: plain_httpx(url, args.workers, body),
                args,
                alone,
            ),
        ]
        note = ""
        try:
            import openai  # noqa: F401

            rows.append(
                measure(
                    "openai",
                    "openai SDK completions.create",
                    lambda: openai_sdk(url, args.workers, body),
                    args,
                    alone,
                )
            )
        except ImportError:
            note = "openai is not installed here: its row is left out (pip install openai)."
    finally:
        server.terminate()
        server.wait(timeout=30)

    by = {row["key"]: row for row in rows}
    result = {
        "command": " ".join(["python", "benchmarks/server_client.py", *sys.argv[1:]]),
        "machine": f"{device_name()}, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.1f}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "turns": args.turns,
        "prompt_ids": args.prompt,
        "reply_ids": args.reply,
        "workers": args.workers,
        "learner_steps": args.learner_steps,
        "pace": args.pace,
        "tick": args.tick,
        "learner_alone_s": round(alone, 3),
        "client_cpu_ms_per_turn": by["ours"]["cpu_ms_per_turn"],
        "httpx_cpu_ms_per_turn": by["httpx"]["cpu_ms_per_turn"],
        "openai_cpu_ms_per_turn": by["openai"]["cpu_ms_per_turn"] if "openai" in by else None,
        "learner_slowdown_ours": by["ours"]["learner_slowdown"],
        "learner_slowdown_httpx": by["httpx"]["learner_slowdown"],
        "learner_slowdown_flat_out_ours": by["ours"]["learner_slowdown_flat_out"],
        "learner_slowdown_flat_out_httpx": by["httpx"]["learner_slowdown_flat_out"],
        "rows": rows,
        "note": note,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
