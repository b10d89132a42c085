"""Asynchronous rollouts (`max_staleness`, trainers/async_rollout.py) against the synchronous loop, same run.

Two parts, each run in a child process per configuration (so GPU memory and threads start clean), merged
into benchmarks/results/async.{json,md}:

- ``speed`` -> ``async_speedup_1gpu``: samples/s (episodes trained per second of learner steps, the first
  ``--warmup`` steps left out: engine start, CUDA graphs, compilation) of ``max_staleness`` k vs 0, on
  Search-v0 multi-turn episodes whose searches go over HTTP to a local Search-R1-style retriever
  (``toolgym serve-retriever`` on the synthetic corpus, BM25 over ``--passages`` passages). Why this env:
  the GPU machine has no docker (Coding-v0's sandbox) and no network (Web-v0); Search-v0's retriever is a
  real service doing real work per call, in its own process, as in Search-R1 training. BM25 is fast
  (ms a query), so most of the gain here comes from overlapping the update with generation; slower tools
  (dense retrievers, sandboxes) leave more to overlap.
  The timed policy is a warm start that calls the tool (the untrained SmolLM2-135M searched 0.01 times an
  episode, writing format errors instead, so a run from it timed no tool work): SFT on ``--sft-episodes``
  Search-v0 expert episodes (``toolgym sft``'s data: the env's scripted expert, successful episodes only)
  into WORK/warm_start, run once per call before the arms (skipped when WORK/warm_start/model is there, e.g.
  a second call with the same ``--work``); every arm (k = 0 and k, and speed2's) starts from that model.
  The JSON records its steps, seconds and greedy held-out success and searches an episode
  (``speed_setup.warm_start``), and each arm's searches an episode and env seconds a step.
- ``learning`` -> ``async_learning``: trainers/configs/learning_rl_alone.yaml (Calculator, held-out test
  templates), synchronous vs ``max_staleness`` 2, each stopped after ``--minutes`` of wall time; held-out
  success against wall minutes (stamped when each metrics.jsonl record appears). ``--learning-env search``: the
  same pair on Search-v0 from the speed part's warm start (the issue's "multi-turn env of your choice"), with
  ``--tool-latency-s`` its searches' added latency; runs are keyed by env, mode and seed (and ``_mbROWS`` for
  micro-batches other than 16 rows), summarised over seeds per setting (env, ``--minutes``, micro-batch rows:
  ``async_learning_summary_15min``, ``async_learning_summary_12min_mb64``, ``async_learning_summary_search_7min``).
  A run's steps are set past what its minutes hold (the YAML's 400 ended fast runs before their minutes).
  A learning run may span several invocations (a device call lasts ~9 minutes; ``--minutes`` is the run's
  total): on SIGTERM (gpu_jobs.sh's ``timeout`` signals the whole group at the call's deadline) the child
  finishes its step and saves its checkpoint (the trainer's own preemption save: ``save_every`` stays 0, a save
  of the 135M model with its AdamW state is 1.6 GB, 3-6 s on a CPU VM's disk), this process waits up to
  ``CHILD_GRACE_S`` for it, writes the JSON and report of what is done and exits 143 (so gpu_jobs.sh runs the
  line again). The same command then continues each unfinished run from its checkpoint (``resume: auto``),
  keeping its records, and stamps the new ones with the minutes already spent (WORK/learning_KEY.wall.json,
  the run's ledger, written as records appear) plus the minutes since this child started; a run whose minutes
  are up (or whose trainer finished) starts no child. Restarts count in its wall minutes (the report says
  which runs spanned several invocations). A run folder without a ledger, or whose ledger holds another
  config, starts over.
- ``--micro-batch-rows N``: the update's rows a forward/backward (speed, speed2, servers: default 16;
  learning: the YAML's), recorded in the setup blocks (learning: in each run's record).

- ``servers`` -> ``async_speedup_2gpu_servers``: the same run with the learner on GPU 0 and its rollouts on a
  rollout server on GPU 1 (``toolgym serve --agent engine:MODEL --weight-updates``: our engine, as a vLLM server
  would be used: ``engine: vllm``, ``rollout_servers``, ``weight_sync: disk``; trainers/async_servers.py),
  asynchronous vs the synchronous loop on one GPU (``--servers-sync``: also synchronous on the server).
- ``speed2`` -> ``async_speedup_2gpu``: the same Search-v0 run, samples/s of the split layout on two GPUs
  (``rollout_ranks: 1``: GPU 1 generates, GPU 0 learns, weights broadcast over NCCL after every step;
  trainers/async_split.py; launched with torchrun as users launch it) vs the synchronous loop on one GPU
  (GPU 0), in the same invocation. ``--quick`` runs it on CPU with 2 gloo processes.

    python benchmarks/async.py --quick                  # CPU smoke test: tiny random model, every part
    python benchmarks/async.py --quick --part speed2    # CPU: the split layout only (2 gloo processes)
    python benchmarks/async.py --part speed             # GPU, ~7 min on one H100/H200 with SmolLM2-135M (below)
    python benchmarks/async.py --part speed2            # 2 GPUs (nvidia-h100-x2), ~8 min: sync on GPU 0 vs split
    python benchmarks/async.py --part speed2 --admission tree   # the same with per-tree admission
    python benchmarks/async.py --part servers           # 2 GPUs: learner on GPU 0, our engine serving on GPU 1
    python benchmarks/async.py --part speed --tool-latency-s 0.1  # each search 0.1 s slower (a local proxy)

Time of ``--part speed`` on one GPU (estimate from the H200 call of 2026-11-27, which took 294 s for 2 arms
x 14 steps: ~10 s retriever + 2 x ~100 s per arm outside its timed steps (process start, model load, engine
and CUDA graphs, compilation in the 2 warm-up steps, final evaluation and save) + 12 timed steps x (4.14 +
2.99) s):
- warm start ~90 s: 512 expert episodes of ~730 tokens (SmolLM2 tokenizer; 2 searches, 3 turns), ~490
  kept, 31 steps of 16 = ~360k tokens; the Werewolf SFT trained 877k tokens in 148 s on an H200 with data
  and evaluations (~5.9k tokens/s all in), so ~60 s, + ~10 s process start and model load, ~5-10 s expert
  episodes over HTTP, ~10 s for the 32-episode greedy evaluation;
- arms: 2 x ~100 s + 18 timed steps x (k0 + k2) <= 7.1 s (the untrained model's pair; the warm start's
  turns are ~15 tokens instead of up to 128, so its steps should be shorter) = 128 s;
- total ~10 + 90 + 200 + 128 = ~430 s (~7 min), inside gpu_jobs.sh's 590 s call (its deadline: 515 s).
  ``--sft-episodes 0`` times the untrained model as before (~5.5 min at 20 steps). ``--tool-latency-s L``
  adds L s to each search (~2 searches an episode x 128 episodes a step over 16 env threads: ~16 L s a step
  where nothing hides it, i.e. the synchronous arm): L = 0.1 adds ~30 s; with the same ``--work`` on a warm
  machine the warm start is reused (-90 s).

On the device machines (results come back under $OUT; merge them here afterwards):

    python benchmarks/async.py --part speed2 --out $OUT/async_2gpu --work /root/async_runs2   # nvidia-h100-x2
    python benchmarks/async.py --part speed --admission tree --out $OUT/async_tree      # one GPU
    python benchmarks/async.py --merge FILES_AT/async_2gpu.json FILES_AT/async_tree.json
    python benchmarks/async.py --part learning --mode sync  --minutes 7     # GPU, ~8 min
    python benchmarks/async.py --part learning --mode async --minutes 7     # GPU, ~8 min
    bash benchmarks/gpu_jobs.sh 560 benchmarks/jobs/async_learning_long_x4.txt  # twice: 15-minute runs, continued
    bash benchmarks/gpu_jobs.sh 560 benchmarks/jobs/async_learning_mb64_x4.txt  # twice: 12 min, 64-row micro-batches
    python benchmarks/async.py --report                 # rewrite async.md from async.json
    python benchmarks/async.py --merge A.json B.json    # merge the device calls' results into async.json/.md
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import device_name

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LEARNING_YAML = ROOT / "trainers" / "configs" / "learning_rl_alone.yaml"
# a learning run's micro-batch rows unless --micro-batch-rows (the YAML's; the search runs': the speed parts'
# default), and what a record from before micro_batch_rows was recorded ran with
LEARNING_MICRO_BATCH_ROWS = 16
LEARNING_STEPS = 100_000  # a learning run with a wall budget: more steps than its minutes hold


# ----- one training run (in the child process) -------------------------------------------------------------------
def _tiny(model_name: str) -> tuple[Any, Any]:
    """A 2-layer random Llama with the real tokenizer of `model_name` (--quick: checks the script on CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolgym.agents.hf import load_model

    _, tok = load_model(model_name, device="cpu", dtype="float32")
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), tok


def child(spec: dict[str, Any]) -> int:
    """Trains the spec's run; its exit code (a stop on SIGTERM: 143, as `toolgym train` exits, after the save
    and the trainer's own line saying so)."""
    from toolgym.trainers.preemption import Preempted, exit_status

    model = tok = None
    if spec.get("tiny"):
        model, tok = _tiny(spec["config"].get("model", "smollm2-135m"))
    try:
        if spec.get("algorithm") == "sft":
            from toolgym.trainers.sft import SFTConfig
            from toolgym.trainers.sft import train as sft_train

            sft_train(SFTConfig.from_dict(spec["config"]), model, tok)
            return 0
        from toolgym.trainers.grpo import GRPOConfig, train

        train(GRPOConfig.from_dict(spec["config"]), model, tok)
    except Preempted as stop:
        return exit_status(stop)
    return 0


class Stopped(Exception):
    """This process got SIGTERM (`timeout` at a device call's deadline signals the whole group): the child in
    progress was let finish its step and save, and what is done so far is written before the exit."""


class _Signal:
    got: int | None = None  # the signal this process got (None: none)
    at = 0.0  # when (time.monotonic)


def _on_signal(signum: int, frame: Any) -> None:
    # (only a flag: the child got the same signal from the group and is saving; `run_child` waits for it)
    if _Signal.got is None:
        _Signal.got, _Signal.at = signum, time.monotonic()


CHILD_GRACE_S = (
    35.0  # a stopped child's time to finish its step and save (gpu_jobs.sh's SIGKILL comes at 45 s)
)
LEDGER_EVERY_S = 5.0  # the ledger's minutes are written this often (a SIGKILL loses at most this much)


@dataclass
class Ledger:
    """A resumable run's wall clock, FOLDER.wall.json beside its run folder: the config it was started with,
    the wall minutes its children ran (process start, model load and redone steps of each restart included),
    how many children ran it, whether the trainer finished its steps, and the wall minute each metrics record
    appeared at (keyed by a digest of its line: a record the resumed trainer drops and writes again is a new
    line, stamped anew)."""

    path: Path
    config: dict[str, Any]
    minutes: float = 0.0
    invocations: int = 0
    finished: bool = False
    stamps: dict[str, float] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, config: dict[str, Any]) -> Ledger:
        """The ledger of a run of `config`; a new one (and the run folder's checkpoint and metrics removed:
        a fresh start) when there is none or it was started with another config."""
        if path.is_file():
            got = json.loads(path.read_text())
            if got.get("config") == _fingerprint(config):
                return cls(path, config, got["minutes"], got["invocations"], got["finished"], got["stamps"])
            print(
                f"{path}: another config than this one; starting {config['output_dir']} over", file=sys.stderr
            )
        out = Path(config["output_dir"])
        for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp"):
            shutil.rmtree(out / name, ignore_errors=True)
        (out / "metrics.jsonl").unlink(missing_ok=True)
        return cls(path, config)

    def done(self, minutes: float | None) -> bool:
        """Whether the run is over: its trainer finished, or it has had its `minutes` (None: no budget)."""
        return self.finished or (minutes is not None and self.minutes >= minutes)

    def write(self) -> None:
        state = {
            "config": _fingerprint(self.config), "minutes": self.minutes, "invocations": self.invocations,
            "finished": self.finished, "stamps": self.stamps,
        }  # fmt: skip
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(state) + "\n")
        os.replace(tmp, self.path)  # (a SIGKILL mid-write leaves the previous ledger)


def _fingerprint(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as the ledger compares it: without what changes between invocations of one command (the
    retriever's port)."""
    out = json.loads(json.dumps(config))
    (out.get("env_kwargs") or {}).pop("retriever_url", None)
    return out


def _digest(line: str) -> str:
    return hashlib.sha1(line.encode()).hexdigest()[:16]


def _lines(log: Path) -> list[str]:
    """metrics.jsonl's complete lines (not one being written)."""
    try:
        text = log.read_text()
    except FileNotFoundError:
        return []
    return [ln for ln in text.split("\n")[:-1] if ln.strip()]


def run_child(
    config: dict[str, Any],
    tiny: bool,
    minutes: float | None = None,
    nproc: int = 1,
    gpus: str | None = None,
    algorithm: str = "grpo",
    env_extra: dict[str, str] | None = None,
    ledger: Ledger | None = None,
) -> list[dict[str, Any]]:
    """Trains `config` (GRPO, or SFT with `algorithm` "sft") in a child process (`nproc` > 1: torchrun with
    that many ranks; `gpus`: its CUDA_VISIBLE_DEVICES); returns rank 0's metrics records, each stamped with
    `wall_min` (minutes since the child started when the record appeared). With `minutes`, the child is
    stopped at that time.

    With a `ledger` the run is resumable: the child continues from the checkpoint in output_dir (``resume:
    auto``; the trainer writes one when it is stopped), the earlier children's records are kept, the minutes
    count on from the ledger's, `minutes` is the run's total, and a run that is over starts no child.

    When this process gets SIGTERM the child (signalled too, as `timeout` signals the group) has
    `CHILD_GRACE_S` to save; then `Stopped` is raised, except for a ledger's run, whose records come back."""
    out = Path(config["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    log = out / "metrics.jsonl"
    resumable = ledger is not None
    # (a run that is not resumable keeps its stamps in a ledger that is never written: it starts over)
    book = ledger if ledger is not None else Ledger(out.with_name(out.name + ".wall.json"), config)
    if not resumable:
        log.unlink(missing_ok=True)
    elif book.done(minutes):
        return [
            json.loads(ln) | {"wall_min": book.stamps.get(_digest(ln), book.minutes)} for ln in _lines(log)
        ]
    if _Signal.got is not None:
        raise Stopped
    # (resume: auto only for a ledger's run: a speed arm's folder may hold the finished checkpoint of an
    # earlier call with the same --work, which would then train nothing)
    run = config | {"resume": "auto"} if resumable else config
    spec = json.dumps({"config": run, "tiny": tiny, "algorithm": algorithm})
    before = book.minutes
    t0 = time.perf_counter()

    def now() -> float:
        return before + (time.perf_counter() - t0) / 60

    cmd = [sys.executable, __file__, "--child", spec]
    if nproc > 1:  # as a user launches the split layout (torchrun ends its ranks when it is terminated)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(free_port()), *cmd[1:]]  # fmt: skip
    env = child_env(gpus, env_extra)
    if config.get("device") == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    book.invocations += 1
    if resumable:
        book.write()
    written = time.monotonic()

    seen: list[tuple[int, int] | None] = [None]

    def stamp() -> bool:
        try:
            st = log.stat()
            now_seen: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            now_seen = None
        if now_seen == seen[0]:  # (the log is read again only when it changed: it grows to ~1 MB)
            return False
        seen[0] = now_seen
        new = [d for d in map(_digest, _lines(log)) if d not in book.stamps]
        for d in new:
            book.stamps[d] = now()
        return bool(new)

    stopped = False
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            fresh = stamp()
            if resumable and (fresh or time.monotonic() - written > LEDGER_EVERY_S):
                book.minutes, written = now(), time.monotonic()
                book.write()
            over = minutes is not None and now() > minutes
            if over or _Signal.got is not None:
                stopped = _Signal.got is not None
                proc.terminate()  # (a second SIGTERM to a child the group's already reached: no harm)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=CHILD_GRACE_S if stopped else 60)
                break
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stamp()
    book.minutes = now()
    book.finished = proc.returncode == 0
    lines = _lines(log)
    keep = {_digest(ln) for ln in lines}
    book.stamps = {d: m for d, m in book.stamps.items() if d in keep}  # (the dropped records' stamps)
    if resumable:
        book.write()
    if stopped and not resumable:
        raise Stopped
    if minutes is None and proc.returncode != 0 and not stopped:
        raise RuntimeError(f"training {out} failed with exit code {proc.returncode}")
    return [json.loads(ln) | {"wall_min": book.stamps[_digest(ln)]} for ln in lines]


# ----- the retriever ------------------------------------------------------------------------------------------
def visible(gpus: str, parent: str | None) -> str:
    """`gpus` ("0" or "0,1": this script's own numbering) as the child's CUDA_VISIBLE_DEVICES: through the
    parent's, when it has one (gpu_jobs.sh gives each job line its GPUs: "0" must stay that line's GPU, not
    the machine's first)."""
    if not parent:
        return gpus
    mine = [g.strip() for g in parent.split(",") if g.strip()]
    want = [int(g) for g in gpus.split(",")]
    if max(want) >= len(mine):
        raise SystemExit(f"this part needs GPUs {gpus} of its own; CUDA_VISIBLE_DEVICES gives it {parent!r}")
    return ",".join(mine[i] for i in want)


def child_env(gpus: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child process's environment: this one's, `extra`, and `gpus` (this script's numbering) as its
    CUDA_VISIBLE_DEVICES (`visible`)."""
    env = dict(os.environ) | (extra or {})
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(args: list[str], what: str, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """``python -m toolgym ARGS --port P`` in its own process, once it answers ``/health`` (within 10 minutes:
    an index to build, a model to load): the process and its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolgym", *args, "--port", str(port)], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}: {' '.join(args)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not come up in 10 minutes")
        time.sleep(0.5)


def start_retriever(passages: int) -> tuple[Any, str]:
    """The synthetic corpus's BM25 retriever (its index builds first: ~1 min for 100k passages on a loaded
    host): the process and its /retrieve URL."""
    proc, url = start_service(["serve-retriever", "--synthetic", str(passages)], "the retriever")
    return proc, url + "/retrieve"


def slow_proxy(upstream: str, delay_s: float) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A local HTTP proxy (threads of this process, idle while the children train) that holds every search
    `delay_s` seconds before passing it to `upstream`: a stand-in for slower tools (a dense retriever on
    another machine, a web search API) on a machine with no network. Returns the server and its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(delay_s)
            req = urllib.request.Request(upstream, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    status, data = r.status, r.read()
            except urllib.error.HTTPError as exc:  # the retriever's refusal goes back as it was
                status, data = exc.code, exc.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: not one line a search
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="slow-proxy", daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/retrieve"


# ----- parts ------------------------------------------------------------------------------------------------------
SPEED_MICRO_BATCH_ROWS = (
    16  # the speed parts' update micro-batch (rows a forward/backward), unless --micro-batch-rows
)


def speed_config(args: argparse.Namespace, url: str, passages: int) -> dict[str, Any]:
    """The Search-v0 run both speed parts time."""
    base: dict[str, Any] = dict(
        env_ids=["toolgym/Search-v0"],
        env_kwargs=dict(
            retriever_url=url, num_passages=passages, max_turns=4, action_format="tags", prompt_format="text",
            hops=2,
        ),
        model=args.model or "smollm2-135m", steps=args.steps, prompts_per_step=args.prompts, budget=args.budget,
        max_new_tokens=args.max_new_tokens, max_total_tokens=2048, lr=1e-6,
        micro_batch_rows=args.micro_batch_rows or SPEED_MICRO_BATCH_ROWS,
        eval_episodes=4, tensorboard=False, progress=False, is_mode="token_mask", is_min=0.2, is_max=5.0,
        filter_zero_variance=False,  # every step runs the full update (a 135M model often scores all 0)
    )  # fmt: skip
    if args.quick:
        base.update(
            steps=4,
            prompts_per_step=2,
            budget=2,
            max_new_tokens=16,
            max_total_tokens=1024,
            device="cpu",
            threads=1,
        )
    return base


def warm_start(args: argparse.Namespace, base: dict[str, Any], work: Path) -> dict[str, Any] | None:
    """SFT on Search-v0 expert episodes into WORK/warm_start (skipped when its model is already there), so
    the timed policy calls the search tool: the untrained SmolLM2-135M writes format errors instead (0.01
    searches an episode on the H200), and a run without searches times no tool at all. Every arm of the call
    starts from this one model. Returns what the JSON records of it; None with ``--sft-episodes 0``."""
    if args.sft_episodes <= 0:
        return None
    folder = work / "warm_start"
    summary_path = folder / "summary.json"
    deadline = time.monotonic() + args.wait_warm_start
    while args.wait_warm_start and not summary_path.is_file():  # another job line (GPU) trains it
        if time.monotonic() > deadline:
            raise SystemExit(f"no warm start in {folder} after {args.wait_warm_start} s")
        if _Signal.got is not None:
            raise Stopped
        time.sleep(5)
    reused = (folder / "model" / "config.json").is_file() and summary_path.is_file()
    cfg = sft_config(args, base, folder)
    t0 = time.perf_counter()
    if not reused:
        run_child(cfg, tiny=args.quick, gpus=None if args.quick else "0", algorithm="sft")
    summary = json.loads(summary_path.read_text())
    return {
        "model": str(folder / "model"),
        "base_model": base["model"],
        "reused": reused,
        "episodes": cfg["episodes"],
        "batch_size": cfg["batch_size"],
        "lr": cfg["lr"],
        "conversations": summary.get("conversations"),
        "steps": summary.get("steps"),
        "trained_tokens": summary.get("trained_tokens"),
        "train_seconds": summary.get("seconds"),  # the SFT run's own (data, training, evaluation)
        "seconds": time.perf_counter() - t0,  # the child's wall time with process start (0 when reused)
        "success": summary.get("success_after"),  # greedy, held-out seeds (the trainer's evaluation)
        "tool_calls": summary.get("tool_calls_after"),  # searches an episode in that evaluation
        "eval_episodes": cfg["eval_episodes"],
    }


SFT_EVAL_EPISODES = 32  # the warm start's own greedy evaluation: enough to see it search (~5-10 s on a GPU)


def sft_config(args: argparse.Namespace, base: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The warm start: `--sft-episodes` successful expert episodes of the timed env (the same kwargs, over the
    same retriever), one pass in batches of 16 (512 episodes, ~490 solved: ~31 steps), `toolgym sft`'s lr."""
    cfg: dict[str, Any] = dict(
        env_ids=base["env_ids"], env_kwargs=base["env_kwargs"], model=base["model"], episodes=args.sft_episodes,
        epochs=1, batch_size=16, lr=5e-5, max_new_tokens=base["max_new_tokens"],
        max_total_tokens=base["max_total_tokens"], eval_before=False, eval_episodes=SFT_EVAL_EPISODES,
        output_dir=str(folder), tensorboard=False, progress=False, seed=args.seed,
    )  # fmt: skip
    if args.quick:  # plumbing only: a tiny random model learns no tool call in a few CPU steps
        cfg.update(episodes=8, batch_size=4, lr=1e-3, eval_episodes=2, device="cpu", threads=1)
    return cfg


def timed(recs: list[dict[str, Any]], warmup: int, **extra: Any) -> dict[str, Any]:
    """A speed run's numbers from its metrics records (the first `warmup` steps left out)."""
    use = [r for r in recs if r["step"] > warmup and "rollout/episodes" in r]
    seconds = sum(r["time/step_s"] for r in use)
    episodes = sum(r["rollout/episodes"] for r in use)
    step_s = seconds / max(len(use), 1)
    spread = (sum((r["time/step_s"] - step_s) ** 2 for r in use) / max(len(use) - 1, 1)) ** 0.5
    return extra | {
        "steps_timed": len(use),
        "episodes": episodes,
        "seconds": seconds,
        "samples_per_s": episodes / max(seconds, 1e-9),
        "step_s": step_s,
        "step_s_sd": spread,  # the steps' standard deviation: the noise of one step's time
        "generate_s": _mean(use, "rollout/generate_s"),
        "env_s": _mean(use, "rollout/env_s"),
        "staleness_mean": _mean(use, "rollout/staleness_mean"),
        "staleness_max": max((r.get("rollout/staleness_max", 0.0) for r in use), default=0.0),
        "rollout_wait_s": _mean(use, "time/rollout_wait_s"),
        "admission_wait_s": _mean(use, "time/admission_wait_s"),  # the worker waited: the learner was slower
        "train_tokens_per_s": _mean(use, "time/train_tokens_per_s"),  # the update's speed (shares the GPU)
        "weight_publish_s": _mean(use, "time/weight_publish_s"),
        "is_masked_fraction": _mean(use, "losses/is_masked_fraction"),
        "turns": _mean(use, "charts/turns"),
        "tool_calls": _mean(use, "charts/tool_calls"),
        "success": _mean(use, "charts/success"),
    }


def setup_of(base: dict[str, Any], args: argparse.Namespace, warm: dict[str, Any] | None) -> dict[str, Any]:
    return (
        {k: v for k, v in base.items() if k != "env_kwargs"}
        | {
            "env_kwargs": {k: v for k, v in base["env_kwargs"].items() if k != "retriever_url"},
            "warmup": args.warmup,
            "tool_latency_s": args.tool_latency_s,  # added to every search by slow_proxy (0: BM25's own time)
            "warm_start": warm,  # None: the untrained model (--sft-episodes 0, and results before the warm start)
        }
        | ({"model": warm["base_model"]} if warm else {})
    )


def variant_tag(args: argparse.Namespace) -> str:
    """The suffix of a speed result's keys: "" for the headline setting (per-batch admission, the retriever's
    own latency, 16-row micro-batches); "_tree", "_lat0.1", "_mb64", … otherwise, so that the variants' calls
    merge side by side."""
    tag = "" if args.admission == "batch" else f"_{args.admission}"
    tag += f"_lat{args.tool_latency_s:g}" if args.tool_latency_s > 0 else ""
    rows = args.micro_batch_rows or SPEED_MICRO_BATCH_ROWS
    return tag + (f"_mb{rows}" if rows != SPEED_MICRO_BATCH_ROWS else "")


@contextlib.contextmanager
def search_service(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    """The local retriever (BM25 over `--passages` synthetic passages) and, with `--tool-latency-s`, the slow
    proxy in front of it: yields (the retriever's own URL, the URL the timed runs search, passages)."""
    passages = 2000 if args.quick else args.passages
    server, direct = start_retriever(passages)
    proxy, url = None, direct
    try:
        if args.tool_latency_s > 0:
            proxy, url = slow_proxy(direct, args.tool_latency_s)
        yield direct, url, passages
    finally:
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        server.terminate()
        server.wait(timeout=30)


def speed(args: argparse.Namespace, work: Path, parts: tuple[str, ...] = ("speed",)) -> dict[str, Any]:
    """`speed`: max_staleness k vs 0 on one GPU; `speed2`: the split layout on two GPUs vs the synchronous loop
    on one (the synchronous run is shared when both parts run)."""
    with search_service(args) as (direct, url, passages):
        base = speed_config(args, url, passages)
        # (the warm start searches the retriever itself: its expert episodes run one after another)
        warm = warm_start(args, speed_config(args, direct, passages), work)
        if warm is not None:  # every arm starts from the warm start (the tiny one too: its saved folder)
            base["model"] = warm["model"]
        tiny = args.quick and warm is None
        one_gpu = None if args.quick else "0"
        tag = variant_tag(args)
        out: dict[str, Any] = {}
        cfg = dict(base, max_staleness=0, output_dir=str(work / "speed_k0"))
        sync = timed(run_child(cfg, tiny=tiny, gpus=one_gpu), args.warmup, max_staleness=0, layout="sync")
        if "speed" in parts:
            cfg = dict(base, max_staleness=args.staleness, output_dir=str(work / f"speed_k{args.staleness}"))
            cfg["async_admission"] = args.admission
            recs = run_child(cfg, tiny=tiny, gpus=one_gpu)
            fast = timed(
                recs, args.warmup, max_staleness=args.staleness, layout=f"thread, per {args.admission}"
            )
            out |= {
                f"async_speedup_1gpu{tag}": fast["samples_per_s"] / max(sync["samples_per_s"], 1e-9),
                f"speed_runs{tag}": {"k0": sync, f"k{args.staleness}": fast},
                f"speed_setup{tag}": setup_of(base, args, warm) | {"admission": args.admission},
            }
            if args.one_stream_arm:  # the same async run with the worker on the default stream (the A/B)
                cfg["output_dir"] = str(work / f"speed_k{args.staleness}_one_stream")
                recs = run_child(cfg, tiny=tiny, gpus=one_gpu, env_extra={"TOOLGYM_ASYNC_STREAM": "0"})
                same = timed(
                    recs, args.warmup, max_staleness=args.staleness,
                    layout=f"thread, per {args.admission}, one CUDA stream",
                )  # fmt: skip
                out[f"speed_runs{tag}"][f"k{args.staleness}_one_stream"] = same
                out[f"async_speedup_1gpu{tag}_one_stream"] = same["samples_per_s"] / max(
                    sync["samples_per_s"], 1e-9
                )
        if "servers" in parts:
            out |= servers_part(args, work, base, warm, sync, tag)
        if "speed2" in parts:
            cfg = dict(
                base, max_staleness=args.staleness, rollout_ranks=1, output_dir=str(work / "speed_split")
            )
            cfg["async_admission"] = args.admission
            recs = run_child(cfg, tiny=tiny, nproc=2, gpus=None if args.quick else "0,1")
            split = timed(
                recs, args.warmup, max_staleness=args.staleness, layout=f"split 1 + 1, per {args.admission}"
            )
            out |= {
                f"async_speedup_2gpu{tag}": split["samples_per_s"] / max(sync["samples_per_s"], 1e-9),
                f"speed2_runs{tag}": {"sync_1gpu": sync, "split_2gpu": split},
                f"speed2_setup{tag}": setup_of(base, args, warm) | {"admission": args.admission},
            }
        return out


def servers_part(
    args: argparse.Namespace, work: Path, base: dict[str, Any], warm: dict[str, Any] | None,
    sync: dict[str, Any], tag: str,
) -> dict[str, Any]:  # fmt: skip
    """`servers`: the learner on GPU 0 with its rollouts on a rollout server on GPU 1 (`toolgym serve --agent
    engine:MODEL --weight-updates`: our engine; `engine: vllm`, `rollout_servers`, `weight_sync: disk`, the
    weights pushed after every step), asynchronous (`max_staleness` k; with `--servers-sync` also k = 0), vs
    the synchronous loop on one GPU (`sync`, the arm the other parts share). The server batches continuously
    (a turn joins the running batch at the next engine step), as vLLM's does."""
    model = warm["model"] if warm is not None else base["model"]
    capacity = base["max_total_tokens"] + base["max_new_tokens"] + 8
    arms: dict[str, Any] = {}
    with rollout_server(
        model, None if args.quick else "1", capacity, base["prompts_per_step"] * base["budget"]
    ) as url:
        for k in ([0] if args.servers_sync else []) + [args.staleness]:
            cfg = dict(
                base, engine="vllm", rollout_servers=[url], weight_sync="disk",
                weight_sync_folder=str(work / "weight_sync"), max_staleness=k,
                output_dir=str(work / f"speed_servers_k{k}"),
            )  # fmt: skip
            if k:
                cfg["async_admission"] = args.admission
            recs = run_child(cfg, tiny=False, gpus=None if args.quick else "0")
            where = "learner GPU 0, our engine serving on GPU 1 (weights by disk)"
            arms[f"servers_k{k}"] = timed(
                recs, args.warmup, max_staleness=k, layout=f"{where}, per {args.admission}" if k else where
            )
    fast = arms[f"servers_k{args.staleness}"]
    return {
        f"async_speedup_2gpu_servers{tag}": fast["samples_per_s"] / max(sync["samples_per_s"], 1e-9),
        f"servers_runs{tag}": {"sync_1gpu": sync, **arms},
        f"servers_setup{tag}": setup_of(base, args, warm)
        | {"admission": args.admission, "server_model": model},
    }


@contextlib.contextmanager
def rollout_server(model: str, gpus: str | None, capacity: int, slots: int) -> Iterator[str]:
    """`toolgym serve --agent engine:MODEL --weight-updates` in its own process (on `gpus`), up and answering
    (its /v1 URL); stopped at the end."""
    args = ["serve", "--agent", f"engine:{model}", "--max-model-len", str(capacity), "--max-batch", str(slots),
            "--weight-updates"]  # fmt: skip
    proc, url = start_service(args, "the rollout server", child_env(gpus))
    try:
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def learning(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One run per mode at `--seed` (several seeds: one invocation each, e.g. one GPU each on a multi-GPU
    machine through gpu_jobs.sh), keyed MODE_sSEED (Calculator) or search_MODE_sSEED (`--learning-env search`)."""
    if args.learning_env == "search":
        with search_service(args) as (direct, url, passages):
            warm = warm_start(args, speed_config(args, direct, passages), work)
            cfg = speed_config(args, url, passages) | {
                "steps": LEARNING_STEPS,
                "lr": args.learning_lr,
                "eval_every": 5,
                "eval_episodes": 4 if args.quick else 64,
                "filter_zero_variance": True,  # as a training run would (the speed runs time every update)
                "seed": args.seed,
            }
            if warm is not None:
                cfg["model"] = warm["model"]
            if args.quick:
                cfg.update(steps=6, eval_every=3)
            return {
                "async_learning": _learning_runs(args, cfg, work, "search", tiny=args.quick and warm is None)
            }
    from toolgym.trainers.config import load_yaml

    cfg = load_yaml(LEARNING_YAML)
    cfg.pop("algorithm", None)
    # steps: the YAML's 400 ended the 15-minute async runs of 2026-11-28 at 12.8 and 14.3 minutes; the minutes
    # end a run here (GRPO reads steps only as the loop's end and its last-step evaluation and save: no lr
    # schedule, EPO off, no progress bar). The same on every invocation: the ledger compares the config.
    cfg.update(progress=False, tensorboard=False, save_every=0, seed=args.seed, steps=LEARNING_STEPS)
    if args.model:
        cfg["model"] = args.model
    if args.micro_batch_rows:
        cfg["micro_batch_rows"] = args.micro_batch_rows
    if args.quick:  # (10 steps: a test stops one part-way and continues it)
        cfg.update(steps=10, prompts_per_step=2, budget=4, max_new_tokens=16, max_total_tokens=512, eval_every=3,
                   eval_episodes=4, device="cpu", threads=1)  # fmt: skip
    return {"async_learning": _learning_runs(args, cfg, work, "calculator", tiny=args.quick)}


def _learning_runs(
    args: argparse.Namespace, cfg: dict[str, Any], work: Path, env: str, tiny: bool
) -> dict[str, Any]:
    modes = ["sync", "async"] if args.mode == "both" else [args.mode]
    out: dict[str, Any] = {}
    for mode in modes:
        k = 0 if mode == "sync" else args.learning_staleness
        key = run_key(env, mode, args.seed, cfg.get("micro_batch_rows"))
        run = dict(cfg, max_staleness=k, output_dir=str(work / f"learning_{key}"))
        budget = None if args.quick else args.minutes  # (--quick: the run's steps, however long they take)
        ledger = Ledger.open(work / f"learning_{key}.wall.json", run)
        recs = run_child(run, tiny=tiny, minutes=budget, ledger=ledger)
        curve = [(r["wall_min"], r["step"], r["eval/success"]) for r in recs if "eval/success" in r]
        steps = [r for r in recs if r["step"] > 2 and "time/step_s" in r]  # (engine start, compilation)
        out[key] = {
            "env": env,
            "mode": mode,
            "max_staleness": k,
            "minutes": [c[0] for c in curve],
            "steps": [c[1] for c in curve],
            "success": [c[2] for c in curve],
            "steps_done": max((r["step"] for r in recs), default=0),
            # the minutes its children ran, restarts included (a run continued by a later invocation
            # pays its process start, model load, engine start and the steps redone after its checkpoint)
            "wall_minutes": ledger.minutes,
            "minutes_budget": budget,
            "invocations": ledger.invocations,
            "complete": ledger.done(budget),  # false: stopped early (SIGTERM); the same command continues it
            "micro_batch_rows": run.get("micro_batch_rows"),
            "seed": args.seed,
            "tool_latency_s": args.tool_latency_s if env == "search" else 0.0,
            # where the wall time went (the learner's step, its held-out evaluations, waits of either side)
            "step_s": _mean(steps, "time/step_s"),
            "eval_s": _mean(recs, "time/eval_s"),
            "generate_s": _mean(steps, "rollout/generate_s"),
            "rollout_wait_s": _mean(steps, "time/rollout_wait_s"),
            "admission_wait_s": _mean(steps, "time/admission_wait_s"),
            "train_tokens_per_s": _mean(steps, "time/train_tokens_per_s"),
        }
        if _Signal.got is not None:  # (the next mode's run starts with the next invocation)
            break
    return out


def run_key(env: str, mode: str, seed: int, rows: int | None = None) -> str:
    """A learning run's key: MODE_sSEED for learning_rl_alone.yaml (Calculator: the issue's named run),
    ENV_MODE_sSEED for another env; ``_mbROWS`` after it for micro-batches other than 16 rows, so that such a
    run (and its run folder and ledger) sits beside the default run of its seed instead of replacing it."""
    key = f"{mode}_s{seed}" if env == "calculator" else f"{env}_{mode}_s{seed}"
    return key + (f"_mb{rows}" if rows is not None and rows != LEARNING_MICRO_BATCH_ROWS else "")


def key_of(run: dict[str, Any]) -> str:
    """`run_key` of a run's record."""
    return run_key(run["env"], run["mode"], run.get("seed", 0), run.get("micro_batch_rows"))


Setting = tuple[str, float | None, int]


def setting_of(run: dict[str, Any]) -> Setting:
    """What runs must share to be compared: env, wall minutes and micro-batch rows (a record from before
    these were recorded: 16 rows; no minutes: a group of its own)."""
    return (run["env"], run.get("minutes_budget"), run.get("micro_batch_rows") or LEARNING_MICRO_BATCH_ROWS)


def setting_order(setting: Setting) -> tuple[bool, str, bool, float, int]:
    """Calculator first, then by minutes (unknown last), then rows."""
    env, minutes, rows = setting
    return (env != "calculator", env, minutes is None, minutes or 0.0, rows)


def summary_key(setting: Setting) -> str:
    """``async_learning_summary`` + ``_ENV`` (not Calculator) + ``_Mmin`` + ``_mbROWS`` (not 16): e.g.
    ``async_learning_summary_15min``, ``async_learning_summary_search_7min``, ``..._12min_mb64``."""
    env, minutes, rows = setting
    return (
        "async_learning_summary"
        + ("" if env == "calculator" else f"_{env}")
        + (f"_{minutes:g}min" if minutes is not None else "_unknown_min")
        + ("" if rows == LEARNING_MICRO_BATCH_ROWS else f"_mb{rows}")
    )


def setting_title(setting: Setting) -> str:
    env, minutes, rows = setting
    return f"{env}, {'?' if minutes is None else f'{minutes:g}'} min a run, {rows}-row micro-batches"


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return sum(vals) / len(vals) if vals else 0.0


def learning_runs(runs: dict[str, Any]) -> dict[str, Any]:
    """The runs keyed by `run_key`, each with its `env` and `mode` (results before seeds were keyed "sync" and
    "async", before envs had no `env`: Calculator)."""
    out: dict[str, Any] = {}
    for key, run in runs.items():
        mode = run.get("mode") or key.split("_s")[0]
        env = run.get("env", "calculator")
        run = run | {"mode": mode, "env": env}
        out[key_of(run)] = run
    return out


def by_setting(runs: dict[str, Any]) -> dict[Setting, dict[str, Any]]:
    """The runs grouped by `setting_of`, in `setting_order`."""
    groups: dict[Setting, dict[str, Any]] = {}
    for key, run in learning_runs(runs).items():
        groups.setdefault(setting_of(run), {})[key] = run
    return {s: groups[s] for s in sorted(groups, key=setting_order)}


def summaries(runs: dict[str, Any]) -> dict[str, Any]:
    """`learning_summary` per setting (`setting_of`: a 7-minute run's best is no target for a 15-minute run),
    keyed by `summary_key`."""
    return {summary_key(s): learning_summary(mine) for s, mine in by_setting(runs).items()}


def smoothed(success: list[float]) -> list[float]:
    """Each held-out point as the mean of it and its two neighbours: a 64-episode evaluation's noise (about
    0.06 at 0.5) would otherwise make a run's best an outlier."""
    return [
        sum(success[max(i - 1, 0) : i + 2]) / len(success[max(i - 1, 0) : i + 2]) for i in range(len(success))
    ]


def learning_summary(runs: dict[str, Any]) -> dict[str, Any]:
    """The target: the synchronous runs' best smoothed held-out success (their mean over seeds) minus their
    spread over seeds (0.05 with one seed: about a seed's spread at 64 episodes); then for each run the minutes
    it first reached the target (smoothed), and for each mode the mean over its seeds (None when a seed never
    reached it) and its best. Runs stopped before their minutes were up (``complete`` false: a later invocation
    continues them) are left out."""
    runs = {k: r for k, r in learning_runs(runs).items() if r.get("complete") is not False}
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for run in runs.values():
        by_mode.setdefault(run["mode"], []).append(run)
    if "sync" not in by_mode or "async" not in by_mode:
        return {}
    best = {m: [max(smoothed(r["success"]), default=0.0) for r in rs] for m, rs in by_mode.items()}
    sync_best = best["sync"]
    mean = sum(sync_best) / len(sync_best)
    spread = (
        (sum((b - mean) ** 2 for b in sync_best) / (len(sync_best) - 1)) ** 0.5
        if len(sync_best) > 1
        else 0.05
    )
    target = mean - max(spread, 0.05)

    def first(run: dict[str, Any]) -> float | None:
        pts = zip(run["minutes"], smoothed(run["success"]), strict=True)
        return next((m for m, s in pts if s >= target), None)

    per_run = {k: first(r) for k, r in runs.items()}
    minutes: dict[str, float | None] = {}
    for m, rs in by_mode.items():
        got = [per_run[key_of(r)] for r in rs]
        minutes[m] = None if any(g is None for g in got) else sum(got) / len(got)  # type: ignore[misc]
    return {
        "target_success": target,
        "minutes_to_target": minutes,
        "minutes_to_target_per_run": per_run,
        "best_success": {m: sum(b) / len(b) for m, b in best.items()},
        "best_success_per_seed": best,
        "seeds": {m: sorted(r.get("seed", 0) for r in rs) for m, rs in by_mode.items()},
        "async_faster": minutes.get("async") is not None
        and (minutes.get("sync") is None or minutes["async"] < minutes["sync"]),  # type: ignore[operator]
    }


# ----- results ------------------------------------------------------------------------------------------------------
def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def write_md(data: dict[str, Any], path: Path) -> None:
    lines = [
        "# Asynchronous rollouts vs the synchronous loop (benchmarks/async.py)",
        "",
        f"Device: {data.get('device', '?')}. Commands: `{'`, `'.join(data.get('commands', []))}`.",
        "",
        "## Throughput on one GPU (`async_speedup_1gpu`)",
        "",
    ]
    tags = sorted(k[len("speed_runs") :] for k in data if k.startswith("speed_runs"))
    for tag in tags:
        lines += _speed_table(data, tag)
    lines += ["## Two GPUs (`async_speedup_2gpu`)", ""]
    tags2 = sorted(k[len("speed2_runs") :] for k in data if k.startswith("speed2_runs"))
    for tag in tags2:
        lines += _speed2_table(data, tag)
    if not tags2:
        lines += ["Not measured yet: `python benchmarks/async.py --part speed2` on two GPUs.", ""]
    lines += ["## Two GPUs, rollouts on a server (`async_speedup_2gpu_servers`)", ""]
    tags3 = sorted(k[len("servers_runs") :] for k in data if k.startswith("servers_runs"))
    for tag in tags3:
        lines += _speed2_table(data, tag, "servers")
    if not tags3:
        lines += ["Not measured yet: `python benchmarks/async.py --part servers` on two GPUs.", ""]
    lines += ["## Learning (`async_learning`)", ""]
    groups = by_setting(data.get("async_learning") or {})
    if groups:
        lines += [
            "One subsection per setting (env, wall minutes a run, update micro-batch rows): a target and its "
            "minutes compare only the runs of one setting.",
            "",
        ]
    for setting, runs in groups.items():
        lines += _learning_section(data, runs, setting)
    if groups:
        lines += ["![held-out success vs wall minutes](async_learning.png)"]
    path.write_text("\n".join(lines) + "\n")


LEARNING_SETTINGS = {
    "calculator": "trainers/configs/learning_rl_alone.yaml (Calculator, held-out templates)",
    "search": "Search-v0 (2-hop, the speed part's retriever) from the speed part's SFT warm start",
}


def _learning_section(data: dict[str, Any], runs: dict[str, Any], setting: Setting) -> list[str]:
    env, minutes, _ = setting
    order = sorted(runs, key=lambda k: (runs[k]["mode"] != "sync", runs[k].get("seed", 0)))
    latency = max((runs[k].get("tool_latency_s") or 0.0 for k in runs), default=0.0)
    budget = "each run stopped after its wall minutes" if minutes is not None else "wall minutes not recorded"
    lines = [
        f"### {setting_title(setting)}",
        "",
        f"{LEARNING_SETTINGS.get(env, env)}, {budget}; held-out success (64 greedy",
        "episodes) every 5 steps."
        + (f" Each search also waits {latency:g} s (`--tool-latency-s`)." if latency else ""),
        "",
        "| run | max_staleness | seed | steps | step s | eval s | generate s | learner wait s | worker wait s | "
        "train tok/s | best (smoothed) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in order:
        r = runs[key]
        lines.append(
            f"| {r['mode']} | {r['max_staleness']} | {r.get('seed', 0)} | {r['steps_done']} | "
            f"{_opt(r, 'step_s')} | {_opt(r, 'eval_s')} | {_opt(r, 'generate_s')} | {_opt(r, 'rollout_wait_s')} | "
            f"{_opt(r, 'admission_wait_s')} | {_opt(r, 'train_tokens_per_s')} | "
            f"{max(smoothed(r['success']), default=0.0):.2f} |"
        )
    lines.append("")
    for key in order:
        r = runs[key]
        pts = ", ".join(f"{m:.1f} min: {s:.2f}" for m, s in zip(r["minutes"], r["success"], strict=True))
        lines.append(
            f"- {key} (max_staleness {r['max_staleness']}, {r['steps_done']} steps{_spans(r)}): {pts}"
        )
    lines += _restart_note(runs)
    summ = data.get(summary_key(setting)) or {}
    if summ:
        mins = summ["minutes_to_target"]

        def fmt(m: float | None) -> str:
            return "never" if m is None else f"{m:.1f}"

        lines += [
            "",
            f"Target: {summ['target_success']:.2f} held-out success, the synchronous runs' best (3-point smoothed, "
            "mean over seeds) minus their spread over seeds (at least 0.05).",
            f"Minutes to reach it (mean over seeds; never if a seed did not): sync {fmt(mins.get('sync'))}, async "
            f"{fmt(mins.get('async'))}. Best: sync {summ['best_success']['sync']:.2f}, async "
            f"{summ['best_success']['async']:.2f}. Seeds: {summ.get('seeds')}.",
        ]
    return [*lines, ""]


def _spans(r: dict[str, Any]) -> str:
    """A run's invocations and completeness, for its line (nothing for one whole invocation)."""
    n = r.get("invocations") or 1
    text = f", {n} invocations, {r.get('wall_minutes') or 0:.1f} wall min" if n > 1 else ""
    budget = r.get("minutes_budget")
    if r.get("complete") is False:
        of = f" of {budget:g}" if budget else ""
        text += f", stopped early at {r.get('wall_minutes') or 0:.1f}{of} min: incomplete"
    elif budget and (r.get("wall_minutes") or budget) < budget - 0.5:  # (a child stopped by time overshoots)
        # its trainer finished its steps first (the YAML's 400 steps, before LEARNING_STEPS)
        text += f", its steps ended it at {r['wall_minutes']:.1f} of {budget:g} min"
    return text


def _restart_note(runs: dict[str, Any]) -> list[str]:
    """What a run that spanned several invocations (device calls) was charged, and which runs are unfinished."""
    spanned = [k for k, r in runs.items() if (r.get("invocations") or 1) > 1]
    short = [k for k, r in runs.items() if r.get("complete") is False]
    out: list[str] = []
    if spanned:
        out += [
            "",
            f"Runs over several invocations ({', '.join(spanned)}): a device call ends after ~9 minutes, so the "
            "next call's same command continued each from the checkpoint its SIGTERM wrote. Their wall minutes "
            "count every restart: process start, model load, engine start and compilation again, and any steps "
            "after the checkpoint done again (none when the SIGTERM's save came through); the time between the "
            "calls is not counted.",
        ]
    if short:
        out += [
            "",
            f"Unfinished ({', '.join(short)}): stopped by a signal before their minutes were up; the same "
            "command continues them.",
        ]
    return out


def _table_head(setup: dict[str, Any], tag: str, what: list[str]) -> list[str]:
    """A speed table's heading (a variant's name and setting), what it times, and the policy it timed."""
    title = (
        [
            f"### Variant `{tag[1:]}` ({setup.get('admission', 'batch')} admission; "
            f"{setup.get('tool_latency_s') or 0:g} s added to each search; "
            f"{setup.get('micro_batch_rows') or SPEED_MICRO_BATCH_ROWS}-row update micro-batches)",
            "",
        ]
        if tag
        else []
    )
    return [*title, *what, "", *policy_lines(setup)]


def _speed_table(data: dict[str, Any], tag: str) -> list[str]:
    lines = [
        *_table_head(
            data.get(f"speed_setup{tag}") or {},
            tag,
            [
                "Search-v0 (2-hop questions, <= 4 turns, searches over HTTP to a local BM25 retriever), samples/s =",
                "episodes trained per second of learner steps after the warm-up steps.",
            ],
        ),
        "| max_staleness | layout | samples/s | step s (sd) | generate s | env s | learner wait s | worker wait s | "
        "update tok/s | searches / episode | turns | success | staleness mean / max | IS masked |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data[f"speed_runs{tag}"].values():
        lines.append(
            f"| {r['max_staleness']} | {r.get('layout', '-')} | {r['samples_per_s']:.2f} | {_step(r)} | "
            f"{r['generate_s']:.2f} | {r['env_s']:.2f} | {r['rollout_wait_s']:.2f} | {_opt(r, 'admission_wait_s')} | "
            f"{_opt(r, 'train_tokens_per_s')} | {_opt(r, 'tool_calls')} | {_opt(r, 'turns')} | "
            f"{_opt(r, 'success')} | {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} | "
            f"{r['is_masked_fraction']:.4f} |"
        )
    lines += [
        "",
        f"**async_speedup_1gpu{tag} = {data[f'async_speedup_1gpu{tag}']:.2f}x** (goal >= 1.5x).",
        "",
    ]
    if f"async_speedup_1gpu{tag}_one_stream" in data:
        lines += [
            f"The same asynchronous run with its worker on the default CUDA stream (`TOOLGYM_ASYNC_STREAM=0`, as "
            f"before the worker got its own): {data[f'async_speedup_1gpu{tag}_one_stream']:.2f}x.",
            "",
        ]
    return lines


SPEED2_WHAT = {
    "speed2": [
        "The same Search-v0 run: the synchronous loop on one GPU vs the split layout (`rollout_ranks: 1`, torchrun",
        "with 2 ranks: GPU 1 generates, GPU 0 learns, weights broadcast after every step), same invocation.",
    ],
    "servers": [
        "The same Search-v0 run: the synchronous loop on one GPU vs the learner on GPU 0 with its rollouts on a",
        "rollout server on GPU 1 (`toolgym serve --agent engine:MODEL --weight-updates`: our engine; `engine: vllm`,",
        "`rollout_servers`, `weight_sync: disk`, weights pushed after every step), same invocation.",
    ],
}


def _speed2_table(data: dict[str, Any], tag: str, part: str = "speed2") -> list[str]:
    key = "async_speedup_2gpu" if part == "speed2" else "async_speedup_2gpu_servers"
    lines = [
        *_table_head(data.get(f"{part}_setup{tag}") or {}, tag, SPEED2_WHAT[part]),
        "| run | samples/s | step s (sd) | generate s | env s | learner wait s | weight push s | searches / episode | "
        "success | staleness mean / max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in data[f"{part}_runs{tag}"].items():
        lines.append(
            f"| {name} | {r['samples_per_s']:.2f} | {_step(r)} | {r['generate_s']:.2f} | {r['env_s']:.2f} | "
            f"{r['rollout_wait_s']:.2f} | {r.get('weight_publish_s', 0.0):.3f} | {_opt(r, 'tool_calls')} | "
            f"{_opt(r, 'success')} | {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} |"
        )
    lines += [
        "",
        f"**{key}{tag} = {data[f'{key}{tag}']:.2f}x** (goal >= 2.5x).",
        "",
    ]
    return lines


def _opt(r: dict[str, Any], key: str) -> str:
    """A number results written before it was recorded lack: "-" there."""
    return f"{r[key]:.2f}" if isinstance(r.get(key), (int, float)) else "-"


def _step(r: dict[str, Any]) -> str:
    sd = r.get("step_s_sd")
    return f"{r['step_s']:.2f}" + (f" ({sd:.2f})" if isinstance(sd, (int, float)) else "")


def policy_lines(setup: dict[str, Any]) -> list[str]:
    """Which policy the speed runs timed (the warm start's numbers, or a note that the model was untrained) and
    the latency added to each search, if any."""
    lat = setup.get("tool_latency_s") or 0.0
    slow = (
        [
            f"Each search also waits {lat:g} s in a local proxy (`--tool-latency-s`: a stand-in for a slower tool).",
            "",
        ]
        if lat > 0
        else []
    )
    return slow + _policy(setup)


def _policy(setup: dict[str, Any]) -> list[str]:
    w = setup.get("warm_start")
    if not w:
        return [
            "Policy: the untrained model (no warm start): it rarely calls the search tool, so these runs time",
            "almost no tool work (see searches / episode).",
            "",
        ]
    took = (
        "reused from an earlier call"
        if w.get("reused")
        else f"{w.get('seconds') or 0:.0f} s with process start"
    )
    return [
        f"Policy: a warm start every run starts from: SFT of {setup.get('model', '?')} on {w.get('episodes')} "
        f"Search-v0 expert episodes ({w.get('conversations')} kept, {w.get('steps')} steps of {w.get('batch_size')}, lr "
        f"{w.get('lr')}; {took}; the run's own {w.get('train_seconds') or 0:.0f} s). Greedy on "
        f"{w.get('eval_episodes')} held-out episodes after it: success {_opt(w, 'success')}, "
        f"{_opt(w, 'tool_calls')} searches an episode.",
        "",
    ]


def plot(data: dict[str, Any], path: Path) -> None:
    """Held-out success against wall minutes, one panel per setting (as the report's subsections)."""
    groups = by_setting(data.get("async_learning") or {})
    if not groups:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 1, figsize=(6, 3.2 * len(groups)), squeeze=False, sharey=True)
    colors = {"sync": "tab:blue", "async": "tab:orange"}
    for ax, (setting, runs) in zip(axes[:, 0], groups.items(), strict=True):
        labelled: set[str] = set()
        for r in runs.values():
            mode = r["mode"]
            label = None if mode in labelled else f"{mode} (max_staleness {r['max_staleness']})"
            labelled.add(mode)
            ax.plot(r["minutes"], r["success"], marker="o", markersize=3, color=colors.get(mode), label=label)
        ax.set_title(setting_title(setting), fontsize=10)
        ax.set_xlabel("wall minutes")
        ax.set_ylabel("held-out success")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--part", choices=["speed", "speed2", "servers", "learning", "all"], default="all")
    p.add_argument(
        "--servers-sync", action="store_true",
        help="servers: also the synchronous loop on the server (max_staleness 0), to tell the layout from async",
    )  # fmt: skip
    p.add_argument("--mode", choices=["sync", "async", "both"], default="both", help="learning: which run(s)")
    p.add_argument("--quick", action="store_true", help="CPU smoke test with a tiny random model")
    p.add_argument("--report", action="store_true", help="only rewrite the .md (and plot) from the .json")
    p.add_argument(
        "--merge", type=Path, nargs="+", help="merge these result .json files (device calls) into --out"
    )
    p.add_argument(
        "--model", default=None, help="a model name or folder (default: smollm2-135m; learning: the YAML's)"
    )
    p.add_argument("--staleness", type=int, default=2, help="speed: max_staleness of the asynchronous run")
    p.add_argument(
        "--admission",
        choices=["batch", "tree"],
        default="batch",
        help="speed: async_admission of the async runs",
    )
    p.add_argument("--learning-staleness", type=int, default=2)
    p.add_argument(
        "--learning-env", choices=["calculator", "search"], default="calculator",
        help="learning: learning_rl_alone.yaml (Calculator) or Search-v0 from the speed part's warm start "
        "(with --tool-latency-s: each search that much slower)",
    )  # fmt: skip
    p.add_argument("--learning-lr", type=float, default=1e-5, help="learning, search: the RL learning rate")
    p.add_argument(
        "--wait-warm-start", type=float, default=0.0,
        help="seconds to wait for WORK/warm_start that another job line trains (0: train it here if missing)",
    )  # fmt: skip
    p.add_argument(
        "--one-stream-arm", action="store_true",
        help="speed: also the asynchronous run with its worker on the default CUDA stream (TOOLGYM_ASYNC_STREAM=0)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=20, help="speed: steps of each arm (timed: steps - warmup)")
    p.add_argument("--warmup", type=int, default=2, help="speed: first steps left out of the timing")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--passages", type=int, default=50_000)
    p.add_argument(
        "--tool-latency-s",
        type=float,
        default=0.0,
        help="speed: seconds added to every search by a local proxy (a slower tool's stand-in; 0: BM25 alone)",
    )
    p.add_argument(
        "--sft-episodes",
        type=int,
        default=512,
        help="speed: expert episodes of the warm start every arm starts from (0: the untrained model)",
    )
    p.add_argument(
        "--micro-batch-rows", type=int, default=None,
        help=f"rows a forward/backward of the update (speed, speed2, servers: default {SPEED_MICRO_BATCH_ROWS}; "
        "learning: the YAML's)",
    )  # fmt: skip
    p.add_argument(
        "--minutes", type=float, default=4.0,
        help="learning: wall minutes per run, in all (the same command again continues an unfinished run)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "async")
    p.add_argument("--work", type=Path, default=None, help="run folders (default: a temporary folder)")
    args = p.parse_args()
    if args.child:
        return child(json.loads(args.child))
    json_path, md_path = args.out.with_suffix(".json"), args.out.with_suffix(".md")
    if args.quick and args.out == RESULTS / "async":  # a smoke test never overwrites the GPU results
        json_path, md_path = (
            Path(tempfile.gettempdir()) / "async_quick.json",
            Path(tempfile.gettempdir()) / "async_quick.md",
        )
    data: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {}
    for extra in args.merge or []:  # results of separate device calls: runs and commands accumulate
        got = json.loads(extra.read_text())
        commands = data.get("commands", []) + [
            c for c in got.get("commands", []) if c not in data.get("commands", [])
        ]
        runs = learning_runs(data.get("async_learning") or {}) | learning_runs(
            got.get("async_learning") or {}
        )
        data |= got
        data["commands"], data["async_learning"] = commands, runs
    stopped = False
    if not args.report and not args.merge:
        # SIGTERM (a device call's deadline): the child saves, then what is done so far is written, exit 143
        signal.signal(signal.SIGTERM, _on_signal)
        work = args.work or Path(tempfile.mkdtemp(prefix="async_bench_"))
        data.setdefault("commands", [])
        cmd = "python benchmarks/async.py " + " ".join(sys.argv[1:])
        if cmd not in data["commands"]:
            data["commands"].append(cmd)
        data["device"] = device_name()
        parts = {"speed": ("speed",), "speed2": ("speed2",), "servers": ("servers",),
                 "all": ("speed", "speed2", "servers")}.get(args.part, ())  # fmt: skip
        if {"speed2", "servers"} & set(parts) and not args.quick and gpu_count() < 2:
            if args.part in ("speed2", "servers"):
                raise SystemExit(f"--part {args.part} needs 2 GPUs (or --quick on CPU)")
            parts = ("speed",)  # all on one GPU: the two-GPU parts are left as they were
        try:
            if parts:
                data |= speed(args, work, parts)
            if args.part in ("learning", "all"):
                got = learning(args, work)["async_learning"]
                data["async_learning"] = learning_runs(data.get("async_learning") or {}) | got
        except Exception as exc:  # (after a SIGTERM: the retriever's or a child's end, or `Stopped`)
            if _Signal.got is None:
                raise
            print(f"stopped ({type(exc).__name__}: {exc}): writing what is done so far", file=sys.stderr)
        stopped = _Signal.got is not None
    if data.get("async_learning"):  # (the summary's rule may be newer than the file's runs)
        data["async_learning"] = learning_runs(data["async_learning"])
        data = {k: v for k, v in data.items() if not k.startswith("async_learning_summary")}
        data |= summaries(data["async_learning"])
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    plot(data, md_path.with_name(md_path.stem + "_learning.png"))
    write_md(data, md_path)
    print(md_path.read_text())
    if stopped:  # (not 0: gpu_jobs.sh marks a job done on 0, and this one has runs to continue)
        print(
            f"stopped by signal {_Signal.got}: the same command continues the unfinished runs",
            file=sys.stderr,
        )
        return 128 + (_Signal.got or signal.SIGTERM)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
