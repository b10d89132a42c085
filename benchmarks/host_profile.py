"""Host time of one single-turn GRPO step (``benchmarks/grpo_step.py``'s step) on CPU, split by phase.

The step of ``grpo_step.py`` (Calculator-v0, one turn, 8 prompts x 8 samples, <= 64 new tokens, engine
``fast``, packed update as on CUDA) with a micro model of SmolLM2's layout and real tokenizer (hidden 32,
2 layers), single-threaded. The model's arithmetic is timed apart (the decode forward, sampling, prefill,
the update's forward/backward/AdamW; on CPU the 49k-token vocabulary's LM head and sampling dominate it), so
what remains is host work: the engine's bookkeeping per decode step, the rollout driver, credit,
collation. Each phase is timed in wall time and in the main thread's CPU time (``time.thread_time``: not
inflated by other processes on a busy machine; env steps on the driver's pool threads are not in it).
``--count-reads`` instead counts the operations that would wait for a GPU (``.cpu()``, ``.tolist()``,
``nonzero`` ...), by the toolgym function that made them. The update proxy times the packed update's op
sequence at SmolLM2's depth (30 layers) with ~nil arithmetic. On a GPU the arithmetic runs
asynchronously (the decode step as one CUDA graph), so the host share measured here is a CPU proxy of what
bounds a small-batch step there; the GPU numbers themselves come from ``benchmarks/trl_speed.py``.

    python benchmarks/host_profile.py [--steps 5] [--profile 25] [--out benchmarks/results/host_profile]

``--profile N`` also prints cProfile's N functions of most own time over the steady steps.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# per-phase seconds of the step being run (bucket = the optimize() calls finished so far)
_BUCKETS: list[defaultdict[str, float]] = [defaultdict(float)]
_CPU: list[defaultdict[str, float]] = [defaultdict(float)]  # the same, this thread's CPU time
_COUNTS: list[defaultdict[str, int]] = [defaultdict(int)]


# what waits for the device when a tensor lives on a GPU (a boolean-mask index and nonzero too: their size is
# data; ``.cpu()``/``.tolist()`` of a tensor already on the host count as well, so this overcounts a little)
READS = {
    "item",
    "__float__",
    "__int__",
    "__bool__",
    "__index__",
    "tolist",
    "nonzero",
    "cpu",
}


ROOT = str(Path(__file__).resolve().parent.parent)
SWAP_PREFIX = "host_profile_at_"  # the folder of ``--at``'s files


def _ours(filename: str) -> bool:
    """Whether a frame runs toolgym code (of this checkout or swapped in by ``--at``), not this harness."""
    return (filename.startswith(ROOT) or SWAP_PREFIX in filename) and filename != __file__


class HostReads(TorchFunctionMode):
    """Counts the operations that read device data on the host, by the toolgym function that made them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: defaultdict[str, int] = defaultdict(int)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        masked = name == "__getitem__" and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool
            for a in (args[1] if isinstance(args[1], tuple) else (args[1],))
        )
        sized = name == "repeat_interleave" and isinstance(
            args[1] if len(args) > 1 else (kwargs or {}).get("repeats"), torch.Tensor
        )  # repeats given as a tensor: the output size is data
        if name in READS or masked or sized:
            f = sys._getframe(1)
            while f is not None and not _ours(f.f_code.co_filename):
                f = f.f_back
            if f is not None:
                where = f"{Path(f.f_code.co_filename).parent.name}/{Path(f.f_code.co_filename).stem}.{f.f_code.co_name}"
                self.reads[f"{name} {where}"] += 1
        return func(*args, **(kwargs or {}))


_ACTIVE: set[str] = set()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        if name in _ACTIVE:  # a nested call (backward inside a checkpointed backward): timed by the outer one
            return fn(*a, **k)
        # the arithmetic of engine steps apart from that of the rollout's plan (its shared-prefix prefill)
        key = f"step.{name}" if name.startswith("compute.") and "engine.step" in _ACTIVE else name
        _ACTIVE.add(name)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            _ACTIVE.discard(name)
            _BUCKETS[-1][key] += time.perf_counter() - t0
            _CPU[-1][key] += time.thread_time() - c0
            _COUNTS[-1][key] += 1

    return wrapper


def _patch(obj: Any, attr: str, name: str) -> None:
    setattr(obj, attr, _timed(name, getattr(obj, attr)))


def _patch_everywhere(fn: Callable[..., Any], name: str) -> None:
    """Times ``fn`` under every name a toolgym.trainers module imported it as: a call looks its module's
    name up (``from batch import collate``), so patching the defining module alone misses the callers
    (the step's collate in grpo.py, KL-in-reward's in grpo_credit.py)."""
    timed = _timed(name, fn)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("toolgym.trainers"):
            for attr, value in list(vars(module).items()):
                if value is fn:
                    setattr(module, attr, timed)


def instrument() -> None:
    """Timers around the phases (module attributes looked up at call time)."""
    import toolgym.agents.engine.engine as eng
    import toolgym.agents.engine.engine_policy as pol
    import toolgym.trainers.batch as batch
    import toolgym.trainers.grpo as grpo
    import toolgym.trainers.grpo_credit  # noqa: F401 (its collate, KL-in-reward's, is timed too)
    import toolgym.trainers.rollout as ro

    _patch(eng.Engine, "step", "engine.step")
    _patch(eng, "decode_torch", "compute.decode_forward")
    _patch(eng, "sample", "compute.sample")
    _patch(eng, "prefill", "compute.prefill")
    _patch(eng.Engine, "prefill_only", "plan.prefill_only")
    _patch(pol.EnginePolicy, "_plan", "plan")
    _patch(ro.TreeRollout, "run", "rollout")
    _patch(grpo, "credit", "credit")
    _patch_everywhere(batch.collate, "collate")
    _patch(torch.optim.AdamW, "step", "update.adamw")
    _patch(torch.Tensor, "backward", "update.backward")
    _patch(torch.nn.utils, "clip_grad_norm_", "update.clip")
    inner_update_forward = grpo.update_forward

    def update_forward(*a: Any, **k: Any) -> Any:
        return _timed("update.forward", inner_update_forward(*a, **k))

    grpo.update_forward = update_forward  # type: ignore[assignment]
    inner_optimize = grpo.optimize

    def optimize(*a: Any, **k: Any) -> Any:
        out = _timed("update", inner_optimize)(*a, **k)
        _BUCKETS.append(defaultdict(float))
        _CPU.append(defaultdict(float))
        _COUNTS.append(defaultdict(int))
        return out

    grpo.optimize = optimize  # type: ignore[assignment]


def run(args: Any) -> dict[str, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import toolgym.agents.engine.engine as eng
    from toolgym.trainers.grpo import GRPOConfig, train

    torch.manual_seed(0)
    conf = AutoConfig.from_pretrained(args.model)
    if not args.real:
        conf.update(dict(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4))  # fmt: skip
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    inner_step = eng.Engine.step

    def count(self: Any) -> Any:  # decode steps per training step (the engine's stats are cumulative)
        before = self.stats.decode_steps
        out = inner_step(self)
        _COUNTS[-1]["decode_steps"] += self.stats.decode_steps - before  # a block counts its steps
        return out

    eng.Engine.step = count  # type: ignore[method-assign]
    if args.block:
        inner_init = eng.Engine.__init__

        def init(self: Any, *a: Any, **k: Any) -> None:
            inner_init(self, *a, **k)
            self.block = args.block

        eng.Engine.__init__ = init  # type: ignore[method-assign]
    instrument()
    prof = cProfile.Profile()
    reads = HostReads()
    # profile the steady steps only: from the end of the first update to the end of the last one
    inner = __import__("toolgym.trainers.grpo", fromlist=["optimize"]).optimize

    def optimize(*a: Any, **k: Any) -> Any:
        step = a[1]
        out = inner(*a, **k)
        if step == 1:
            if args.count_reads:
                reads.__enter__()
            else:
                prof.enable()
        elif step == args.steps:
            if args.count_reads:
                reads.__exit__(None, None, None)
            else:
                prof.disable()
        return out

    import toolgym.trainers.grpo as grpo

    grpo.optimize = optimize  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            env_ids=["toolgym/Calculator-v0"], env_kwargs={"prompt_format": "text", "max_turns": 1},
            steps=args.steps, prompts_per_step=args.prompts, budget=args.samples, max_new_tokens=args.new,
            max_total_tokens=1024, lr=1e-6, device=args.device, tensorboard=False, progress=False, eval_episodes=1,
            eval_every=0, micro_batch_rows=64, engine="fast", packing="on", output_dir=out,
            filter_zero_variance=False, threads=1 if args.device == "cpu" else 0,
        )  # fmt: skip
        t0 = time.perf_counter()
        train(cfg, model, tok)
        wall = time.perf_counter() - t0
        recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    # buckets: [step 1 (warm-up), 2 .. steps, eval after the last]; the last step's update is in bucket steps-1
    # and its time/step_s record is complete, so the steady steps are 2 .. steps
    steady = range(1, args.steps)
    n = len(steady)

    def mean(buckets: list[Any]) -> dict[str, float]:
        return {
            k: sum(buckets[i][k] for i in steady) / n for k in sorted({k for i in steady for k in buckets[i]})
        }

    cnt = mean(_COUNTS)
    step_s = sum(r["time/step_s"] for r in recs[1 : args.steps]) / n
    res = {"step_s": step_s, "wall": _summary(mean(_BUCKETS), cnt), "cpu": _summary(mean(_CPU), cnt)}
    res["wall"]["other_s"] = step_s - sum(
        res["wall"][k] for k in ("rollout_s", "credit_collate_s", "update_s")
    )
    res |= {"calls": cnt, "wall_s": wall}
    if args.count_reads:
        res["host_reads_per_step"] = {k: v / n for k, v in sorted(reads.reads.items(), key=lambda x: -x[1])}
    res["profile"] = _top(prof, args.profile)
    if args.pstats:
        prof.dump_stats(args.pstats)
    return res


def _summary(ph: dict[str, float], cnt: dict[str, float]) -> dict[str, Any]:
    """Per-step phase times: the engine's steps split into the model's arithmetic and the rest (host)."""
    dsteps = max(cnt.get("decode_steps", 1), 1)
    compute = sum(v for k, v in ph.items() if k.startswith("step.compute."))
    upd = ["update.forward", "update.backward", "update.adamw", "update.clip"]
    return {
        "rollout_s": ph.get("rollout", 0.0),
        "engine_steps_s": ph.get("engine.step", 0.0),
        "decode_steps": dsteps,
        "ms_per_decode_step": 1e3 * ph.get("engine.step", 0.0) / dsteps,
        "compute_ms_per_decode_step": 1e3 * compute / dsteps,
        "host_ms_per_decode_step": 1e3 * (ph.get("engine.step", 0.0) - compute) / dsteps,
        "plan_s": ph.get("plan", 0.0),
        "runner_host_s": ph.get("rollout", 0.0) - ph.get("engine.step", 0.0) - ph.get("plan", 0.0),
        "credit_collate_s": ph.get("credit", 0.0) + ph.get("collate", 0.0),
        "update_s": ph.get("update", 0.0),
        "update_compute_s": sum(ph.get(k, 0.0) for k in upd),
        "update_host_s": ph.get("update", 0.0) - sum(ph.get(k, 0.0) for k in upd),
        "phases_s": ph,
    }


def engine_host(args: Any, reps: int = 7) -> dict[str, float]:
    """The engine's own host work for the rollout of one step (8 prompts x 8 samples x 64 new tokens), the
    model's arithmetic stubbed out (the decode forward returns fixed logits, sampling draws ids at random):
    ``EnginePolicy.generate`` timed whole, median of ``reps``, this thread's CPU time and wall time."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import toolgym.agents.engine.engine as eng
    from toolgym.agents import SamplingParams
    from toolgym.agents.engine.engine_policy import EnginePolicy

    conf = AutoConfig.from_pretrained(args.model)
    conf.update(dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8))  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    V = conf.vocab_size
    logits = torch.zeros((256, V))
    g = torch.Generator().manual_seed(0)

    def decode(w: Any, cache: Any, t: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        return logits[: t.shape[0]]

    def sample(x: torch.Tensor, mode: Any, gen: Any = None) -> tuple[torch.Tensor, torch.Tensor, None]:
        return torch.randint(3, V, (x.shape[0],), generator=g), torch.zeros(x.shape[0]), None

    eng.decode_torch, eng.sample = decode, sample  # type: ignore[assignment]
    policy = EnginePolicy(model, tok, slots=128, capacity=1096)
    if args.block:
        policy.engine.block = args.block
    prompts = [[int(x) for x in torch.randint(3, V, (150,), generator=g)] for _ in range(args.prompts)]
    prompts = [p for p in prompts for _ in range(args.samples)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new)
    cpu, wall, steps = [], [], []
    for _ in range(reps + 1):
        policy.clear_kv()
        before = policy.engine.stats.decode_steps
        t0, c0 = time.perf_counter(), time.thread_time()
        policy.generate(prompts, sp)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
        steps.append(policy.engine.stats.decode_steps - before)
    med = sorted(cpu[1:])[reps // 2]
    return {"generate_cpu_s": med, "generate_wall_s": sorted(wall[1:])[reps // 2],
            "decode_steps": float(steps[-1]), "host_cpu_ms_per_decode_step": 1e3 * med / steps[-1]}  # fmt: skip


def update_proxy(args: Any, reps: int = 5) -> dict[str, float]:
    """Host cost of the packed update at SmolLM2's depth: the op sequence of 30 eager HF layers (a hidden-32
    model, 1k vocabulary) over the step's 64 rows, 8 tokens each so the arithmetic is ~nil (the op count does
    not depend on the tokens): forward, backward, AdamW, median seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolgym.trainers.batch import TrainBatch
    from toolgym.trainers.packing import packed_forward

    torch.manual_seed(0)
    conf = LlamaConfig(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=args.proxy_layers,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    model = LlamaForCausalLM(conf).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    B, P, C = args.prompts * args.samples, 4, 4
    T = P + C
    ids = torch.randint(0, 1024, (B, T))
    attn = torch.ones((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    mask[:, P:] = 1
    zeros = torch.zeros((B, T))
    batch = TrainBatch(ids, attn, mask, zeros, zeros, torch.zeros((B, T), dtype=torch.long), torch.zeros(B),
                       torch.zeros(B))  # fmt: skip
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(reps + 1):  # this thread's CPU time: other processes on the machine do not count
        t0 = time.thread_time()
        logp, _ent, _ = packed_forward(model, batch, 1.0, entropy=True)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        t1 = time.thread_time()
        loss.backward()
        t2 = time.thread_time()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.thread_time()
        times["forward"].append(t1 - t0)
        times["backward"].append(t2 - t1)
        times["adamw"].append(t3 - t2)
    out = {k: sorted(v[1:])[len(v[1:]) // 2] for k, v in times.items()}
    out["tokens"] = float(B * T)
    out["layers"] = float(args.proxy_layers)
    return out


SWAPPED = [  # (module, paths): what ``--at COMMIT`` takes from that commit, in load order
    ("toolgym.trainers.packing", ("trainers/packing.py",)),
    ("toolgym.agents.engine.model", ("agents/engine/model.py",)),
    ("toolgym.agents.engine.engine", ("agents/engine/engine.py",)),
    # EnginePolicy's module was agents/engine/policy.py in older commits
    ("toolgym.agents.engine.engine_policy", ("agents/engine/engine_policy.py", "agents/engine/policy.py")),
]


def swap_in(commit: str) -> None:
    """Import the engine's model/engine/policy and the packed update as of ``commit`` (the rest of the package
    as checked out), so a "before" runs in this same harness."""
    import importlib.util
    import subprocess

    import toolgym.agents.engine as pkg
    import toolgym.agents.engine.kv_slots as kv_slots

    # older commits import the slotted cache as agents/engine/cache.py
    sys.modules.setdefault("toolgym.agents.engine.cache", kv_slots)
    folder = Path(tempfile.mkdtemp(prefix=SWAP_PREFIX))
    for name, rels in SWAPPED:
        for rel in rels:  # the first path the commit has
            src = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, text=True)
            if src.returncode == 0:
                break
        src.check_returncode()
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src.stdout)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    eng, pol = sys.modules["toolgym.agents.engine.engine"], sys.modules["toolgym.agents.engine.engine_policy"]
    pkg.engine, pkg.Engine, pkg.engine_policy, pkg.EnginePolicy = eng, eng.Engine, pol, pol.EnginePolicy  # type: ignore[attr-defined]


def _top(prof: cProfile.Profile, n: int) -> list[str]:
    if n <= 0:
        return []
    import io

    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(n)
    return [ln for ln in buf.getvalue().splitlines() if ln.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=".bench/smollm2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions (own time)")
    ap.add_argument(
        "--block", type=int, default=0, help="the engine's decode steps per host read (0: its default)"
    )
    ap.add_argument(
        "--proxy-layers", type=int, default=30, help="layers of the update's host-cost proxy (0: skip)"
    )
    ap.add_argument("--device", default="cpu", help="cuda: the same phase timings on a GPU (wall time)")
    ap.add_argument(
        "--real", action="store_true", help="the model's own shape (random weights), not the micro one"
    )
    ap.add_argument("--at", default="", help="a commit: its engine and packed update (a before/after)")
    ap.add_argument(
        "--engine-only", action="store_true", help="the engine's host work alone (arithmetic stubbed)"
    )
    ap.add_argument("--count-reads", action="store_true", help="count host reads by caller (no timings)")
    ap.add_argument("--pstats", default="", help="dump the steady steps' cProfile stats to this file")
    ap.add_argument("--label", default="", help="a name for this run in the json (e.g. before/after)")
    ap.add_argument("--out", default="", help="write OUT.json (appends this run under its label)")
    args = ap.parse_args()
    if args.at:
        swap_in(args.at)
    if args.device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
    if args.engine_only:
        res = engine_host(args)
        res["command"] = "python " + " ".join(sys.argv)
        res["loadavg_after"] = list(os.getloadavg())
        print(json.dumps(res, indent=1))
        if args.out:
            path = Path(args.out).with_suffix(".json")
            data = json.loads(path.read_text()) if path.is_file() else {}
            data[args.label or "engine_only"] = res
            path.write_text(json.dumps(data, indent=2))
        return
    res = run(args)
    if args.proxy_layers and args.device == "cpu":
        res["update_proxy_s"] = update_proxy(args)
    res["command"] = "python " + " ".join(sys.argv)
    res["loadavg_after"] = list(os.getloadavg())
    for line in res["profile"]:
        print(line)
    print(f"{'':>28}  {'wall':>9} {'cpu':>9}")
    for k, v in res["wall"].items():
        if isinstance(v, float | int):
            print(f"{k:>28}: {v:9.4f} {res['cpu'].get(k, float('nan')):9.4f}")
    print(f"{'step_s':>28}: {res['step_s']:9.4f}")
    shown = ("calls", "update_proxy_s", "host_reads_per_step")
    print(json.dumps({k: res[k] for k in shown if k in res}, indent=1))
    if args.out:
        path = Path(args.out).with_suffix(".json")
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[args.label or "run"] = {k: v for k, v in res.items() if k != "profile"}
        path.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
