"""Decode throughput of our engine beside HF ``generate`` (dynamic cache; static cache + compile) and the
computed bandwidth roofline, in one run on one GPU, with random weights in the exact model shapes.

Rows: SmolLM2-135M and Qwen2.5-0.5B shapes, B ∈ {1, 16, 64, 256}, prompt 960 + 128 sampled tokens
(temperature 1, no early stop: mean context 1,024). Tokens/s counts the 128·B sampled tokens over the
whole call (prefill included), as the anchors are timed; ours also reports the decode steps alone.
Also: a 1k-token prefix forked into 8 children vs prefilling the 8 again (``fork_speedup``), greedy ids
of the engine vs HF on the same prompts, the Triton step vs the plain-torch step, and a kernel profile.

The prefill A/B: ``ours`` runs the engine's default prefill (``TOOLGYM_PREFILL``, else ``varlen``); at the
batch sizes of ``--prefill-ab`` a row also runs ``ours_padded`` (the earlier padded prefill) in the same
process, and on a GPU ``prefill_check`` compares the logits of the three prefill paths (Triton varlen,
torch varlen, padded) with prefix-cache hits.

    python benchmarks/generation.py [--models smollm2-135m,qwen2.5-0.5b] [--batch 1,16,64,256]
        [--static 1,256] [--prefill-ab 256] [--out benchmarks/results/generation]
    python benchmarks/generation.py --smoke   # tiny shape on CPU: checks the script runs

Writes ``OUT.md`` and ``OUT.json`` (keys: gpu, roofline_fraction_b256, roofline_fraction_b256_e2e (and
``_padded``: the same with the padded prefill), prefill_s_b256, speedup_vs_hf_static_b256, ms_per_token_b1,
fork_speedup, per-row numbers and peak memory).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

# public HF configs (config.json) of the benchmarks' shapes (the scale ones: benchmarks/scale_fsdp.py); weights
# are random
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        kind="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
        rms_norm_eps=1e-5, max_position_embeddings=8192,
    ),
    "qwen2.5-0.5b": dict(
        kind="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768,
    ),
    "qwen2.5-1.5b": dict(
        kind="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768,
    ),
    "qwen2.5-7b": dict(
        kind="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768,
    ),
    "llama-3-8b": dict(
        kind="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=8192,
    ),
    "tiny": dict(  # CPU smoke runs of the benchmark scripts (--smoke): numbers mean nothing
        kind="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0,
        rms_norm_eps=1e-5, max_position_embeddings=4096,
    ),
}  # fmt: skip
DATASHEET = {"H100": (3.35e12, 989e12), "H200": (4.8e12, 989e12)}  # bytes/s, dense bf16 FLOP/s


def build_shape(shape: dict[str, Any], device: str | torch.device) -> Any:
    """A model of ``shape`` (a SHAPES entry) with random weights (seed 0) built on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(shape)
    kind = spec.pop("kind")
    cfg = LlamaConfig(**spec) if kind == "llama" else Qwen2Config(**spec)
    torch.manual_seed(0)
    with torch.device(device):
        return (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(cfg)


def build(name: str, device: str, dtype: torch.dtype) -> Any:
    return build_shape(SHAPES[name], device).to(dtype).eval()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float:
    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0


def prompts(B: int, P: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (B, P), generator=g)


# ----- ours ------------------------------------------------------------------------------------------------
def run_ours(
    model: Any, ids: torch.Tensor, new: int, repeats: int, prefill: str | None = None
) -> dict[str, Any]:
    """Our engine on ``ids`` (``prefill``: the engine's prefill, default ``TOOLGYM_PREFILL`` / varlen)."""
    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.sampling import SampleMode

    B, P = ids.shape
    peak_reset()
    eng = Engine(model, slots=B, capacity=P + new + 8, prefill=prefill)
    mode = SampleMode(temperature=1.0)
    rows = ids.tolist()
    best: dict[str, Any] = {}
    for rep in range(repeats + 1):  # the first run captures the graphs
        seqs = [eng.new(r) for r in rows]
        for s in seqs:
            eng.submit(s, mode, new)
        sync()
        t0 = time.perf_counter()
        eng.step()  # prefill of every row + the first decode step
        sync()
        t1 = time.perf_counter()
        while eng.busy():
            eng.step()
        sync()
        t2 = time.perf_counter()
        assert all(len(s.out) == new for s in seqs)
        for s in seqs:
            eng.release(s)
        if rep == 0:
            continue
        steps = new - 2  # decode steps after the first step
        cur = {
            "tok_s": B * new / (t2 - t0),
            "decode_tok_s": B * steps / (t2 - t1),
            "ms_per_step": 1e3 * (t2 - t1) / steps,
            "prefill_s": t1 - t0,
        }
        if not best or cur["tok_s"] > best["tok_s"]:
            best = cur
    best["peak_gb"] = peak_gb()
    best["kv_gb"] = eng.cache.nbytes() / 1e9
    best["prefill"] = eng.prefill_mode
    del eng
    return best


def run_hf(model: Any, ids: torch.Tensor, new: int, static: bool, repeats: int) -> dict[str, float]:
    B, P = ids.shape
    dev = next(model.parameters()).device
    x = ids.to(dev)
    kwargs: dict[str, Any] = dict(
        max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(x),
    )  # fmt: skip
    if static:
        kwargs["cache_implementation"] = "static"
    peak_reset()
    t_first = time.perf_counter()
    with torch.no_grad():
        model.generate(x, **kwargs)  # warm-up (compiles the static path)
    sync()
    warm = time.perf_counter() - t_first
    best = 0.0
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(x, **kwargs)
        sync()
        assert out.shape[1] == P + new
        best = max(best, B * new / (time.perf_counter() - t0))
    return {"tok_s": best, "peak_gb": peak_gb(), "first_call_s": warm}


# ----- extras ----------------------------------------------------------------------------------------------
def fork_bench(model: Any, P: int, children: int) -> dict[str, float]:
    """1k-token parent into `children` forks (KV copies) vs prefilling the children again."""
    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.sampling import SampleMode

    eng = Engine(model, slots=2 * children + 2, capacity=P + 64)
    ids = prompts(1, P, eng.weights.shape.vocab, 7)[0].tolist()
    parent = eng.new([*ids, 5])
    eng.prefill_only([parent], [P])
    times = {"fork_s": [], "reprefill_s": []}  # type: dict[str, list[float]]
    for _ in range(4):
        sync()
        t0 = time.perf_counter()
        kids = [eng.fork(parent) for _ in range(children)]
        sync()
        times["fork_s"].append(time.perf_counter() - t0)
        for k in kids:
            eng.release(k)
        fresh = [eng.new([*ids, 5]) for _ in range(children)]
        sync()
        t0 = time.perf_counter()
        eng.prefill_only(fresh, [P] * children)
        sync()
        times["reprefill_s"].append(time.perf_counter() - t0)
        for f in fresh:
            eng.release(f)
    # correctness: a fork decodes exactly as a re-prefilled copy
    greedy = SampleMode(temperature=0)
    a, b = eng.fork(parent), eng.new([*ids, 5])
    for s in (a, b):
        eng.submit(s, greedy, 16)
    eng.run()
    fork_s, re_s = min(times["fork_s"][1:]), min(times["reprefill_s"][1:])
    return {"fork_ms": 1e3 * fork_s, "reprefill_ms": 1e3 * re_s, "fork_speedup": re_s / fork_s,
            "fork_equals_reprefill": a.out == b.out}  # fmt: skip


def greedy_check(model: Any, vocab: int) -> dict[str, Any]:
    """Greedy ids of the engine vs HF generate (bf16: equal until a near-tie flips), 4 prompts x 32 tokens."""
    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.sampling import SampleMode

    ids = prompts(4, 64, vocab, 3)
    eng = Engine(model, slots=4, capacity=160)
    seqs = [eng.new(r) for r in ids.tolist()]
    for s in seqs:
        eng.submit(s, SampleMode(temperature=0), 32)
    eng.run()
    dev = next(model.parameters()).device
    with torch.no_grad():
        ref = model.generate(
            ids.to(dev), max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    same = []
    for s, r in zip(seqs, ref[:, 64:].tolist(), strict=True):
        n = 0
        while n < 32 and s.out[n] == r[n]:
            n += 1
        same.append(n)
    return {"greedy_prefix_equal": same}


def kernel_check(model: Any) -> dict[str, float]:
    """Logits of one Triton decode step vs the plain-torch step on the same cache (relative L2 error)."""
    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.model import decode_torch, decode_triton

    eng = Engine(model, slots=8, capacity=1200, cuda_graphs=False)
    seqs = [eng.new(r) for r in prompts(8, 1000, eng.weights.shape.vocab, 9).tolist()]
    eng.prefill_only(seqs, [999 - 100 * i for i in range(8)])
    tok = torch.tensor([s.ids[s.kv] for s in seqs], device=eng.device)
    sl = torch.tensor([s.slot for s in seqs], device=eng.device)
    ps = torch.tensor([s.kv for s in seqs], device=eng.device)
    with torch.no_grad():
        a = decode_torch(eng.weights, eng.cache, tok, sl, ps)
        out = {}
        for ns in (1, 4):
            b = decode_triton(eng.weights, eng.cache, tok, sl, ps, ns)
            out[f"triton_rel_err_split{ns}"] = float((a - b).norm() / a.norm())
    return out


def prefill_check(model: Any) -> dict[str, Any]:
    """Last-token logits of the Triton varlen prefill and of the padded one against the plain-torch varlen
    pass (relative L2 error), 8 sequences of mixed lengths, half of them continuing a cached prefix."""
    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.model import prefill

    vocab = model.config.vocab_size
    lens = [1, 7, 64, 65, 300, 511, 700, 960]
    ids = prompts(1, sum(lens), vocab, 13)[0].tolist()
    seqs, a = [], 0
    for n in lens:
        seqs.append(ids[a : a + n])
        a += n
    cut = [n // 2 if i % 2 else 0 for i, n in enumerate(lens)]
    out: dict[str, Any] = {}
    for name, mode, kern in (
        ("torch", "varlen", False),
        ("triton", "varlen", True),
        ("padded", "padded", False),
    ):
        eng = Engine(model, slots=len(lens), capacity=1024, cuda_graphs=False)
        first = [(i, 0, x[:c]) for i, (x, c) in enumerate(zip(seqs, cut, strict=True)) if c > 0]
        prefill(eng.weights, eng.cache, first, False, mode=mode, kernels=kern)
        rest = [(i, c, x[c:]) for i, (x, c) in enumerate(zip(seqs, cut, strict=True))]
        out[name] = prefill(eng.weights, eng.cache, rest, mode=mode, kernels=kern)
        del eng
    ref = out.pop("torch")
    return {f"prefill_{k}_rel_err": float((v - ref).norm() / ref.norm()) for k, v in out.items()}


def profile_step(model: Any, B: int, P: int) -> list[tuple[str, float]]:
    """Top kernels of eager Triton decode steps at batch B (CUDA time share)."""
    from torch.profiler import ProfilerActivity, profile

    from toolgym.agents.engine import Engine
    from toolgym.agents.engine.model import decode_triton

    eng = Engine(model, slots=B, capacity=P + 16, cuda_graphs=False)
    seqs = [eng.new(r) for r in prompts(B, P, eng.weights.shape.vocab, 11).tolist()]
    eng.prefill_only(seqs, [P - 1] * B)
    tok = torch.tensor([s.ids[-1] for s in seqs], device=eng.device)
    sl = torch.tensor([s.slot for s in seqs], device=eng.device)
    ps = torch.full((B,), P - 1, device=eng.device)
    with torch.no_grad():
        decode_triton(eng.weights, eng.cache, tok, sl, ps, eng._nsplit(B))
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                decode_triton(eng.weights, eng.cache, tok, sl, ps, eng._nsplit(B))
            sync()
    rows = []
    events = prof.key_averages()
    total = sum(e.device_time_total for e in events if e.device_time_total > 0) or 1.0
    for e in sorted(events, key=lambda e: -e.device_time_total)[:8]:
        rows.append((e.key[:60], e.device_time_total / total))
    return rows


def guarded(fn: Any, *args: Any) -> Any:
    """Run one measurement; a failure is recorded (and printed) instead of ending the run."""
    import traceback

    try:
        return fn(*args)
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def write(result: dict[str, Any], args: Any, lines: list[str] | None) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    if lines is not None:
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def roofline(name: str, B: int, ctx: float, bw: float, peak: float) -> float:
    """Tokens/s bound: step time = max(bytes / BW, FLOPs / peak) (performance.md §1)."""
    s = SHAPES[name]
    hidden, L = s["hidden_size"], s["num_hidden_layers"]
    head = hidden // s["num_attention_heads"]
    inter, V = s["intermediate_size"], s["vocab_size"]
    kvh = s["num_key_value_heads"]
    n_params = V * hidden + L * (hidden * (hidden + 2 * kvh * head) + hidden * hidden + 3 * hidden * inter)
    kv_per_token = 2 * L * kvh * head * 2
    step_bytes = 2 * n_params + B * ctx * kv_per_token
    step_flops = 2 * n_params * B + 4 * L * hidden * ctx * B
    return B / max(step_bytes / bw, step_flops / peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--batch", default="1,16,64,256")
    ap.add_argument("--static", default="1,256", help="batch sizes that also run HF static cache + compile")
    ap.add_argument("--static-models", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--dynamic", default="1,16,64,256", help="batch sizes that run HF generate dynamic")
    ap.add_argument("--prompt", type=int, default=960)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--prefill-ab",
        default="",
        help="batch sizes that also run our engine with the padded prefill (e.g. 256)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU: checks the script runs")
    ap.add_argument("--out", default="benchmarks/results/generation")
    args = ap.parse_args()
    if args.smoke:  # numbers mean nothing: every code path once, in seconds
        args.models, args.static_models, args.batch, args.dynamic = "tiny", "tiny", "1,4", "1,4"
        args.static = "" if not torch.cuda.is_available() else "4"
        args.prompt, args.new, args.repeats, args.prefill_ab = 48, 8, 1, "4"
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    bw, peak = next((v for k, v in DATASHEET.items() if k in gpu), (3.35e12, 989e12))
    batches = [int(b) for b in args.batch.split(",")]
    statics = [int(b) for b in args.static.split(",") if b]
    dynamics = [int(b) for b in args.dynamic.split(",") if b]
    abs_ = [int(b) for b in args.prefill_ab.split(",") if b]
    P, N = args.prompt, args.new
    ctx = P + N / 2
    result: dict[str, Any] = {
        "gpu": gpu,
        "torch": torch.__version__,
        "rows": [],
        "command": "python " + " ".join(__import__("sys").argv),
    }
    import transformers

    result["transformers"] = transformers.__version__
    lines = []
    for name in args.models.split(","):
        model = build(name, device, dtype)
        vocab = SHAPES[name]["vocab_size"]
        extras: dict[str, Any] = {}
        result[name] = extras
        if cuda:
            extras |= guarded(kernel_check, model) or {}
            extras |= guarded(prefill_check, model) or {}
        extras |= guarded(greedy_check, model, vocab) or {}
        extras |= guarded(fork_bench, model, 1024, 8) or {}
        print(name, extras, flush=True)
        for B in batches:
            ids = prompts(B, P, vocab, B)
            row: dict[str, Any] = {"model": name, "B": B, "roofline_tok_s": roofline(name, B, ctx, bw, peak)}
            row["ours"] = guarded(run_ours, model, ids, N, args.repeats)
            if B in abs_:
                row["ours_padded"] = guarded(run_ours, model, ids, N, args.repeats, "padded")
            if B in dynamics:
                row["hf_dynamic"] = guarded(run_hf, model, ids, N, False, 1)
            if B in statics and name in args.static_models.split(","):
                row["hf_static_compile"] = guarded(run_hf, model, ids, N, True, args.repeats)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            write(result, args, lines=None)
        if cuda:
            extras["profile_b256"] = guarded(profile_step, model, max(batches), P + N // 2)
        result[name] = extras
        del model
        peak_reset()

    # headline keys (the 135M shape)
    def row(name: str, B: int) -> dict[str, Any] | None:
        return next((r for r in result["rows"] if r["model"] == name and r["B"] == B), None)

    try:
        main_name = args.models.split(",")[0]
        r256, r1 = row(main_name, 256), row(main_name, 1)
        if r256 is not None:
            result["roofline_fraction_b256"] = r256["ours"]["decode_tok_s"] / r256["roofline_tok_s"]
            result["roofline_fraction_b256_e2e"] = r256["ours"]["tok_s"] / r256["roofline_tok_s"]
            result["prefill_s_b256"] = r256["ours"]["prefill_s"]
            if "tok_s" in r256.get("ours_padded", {}):
                padded = r256["ours_padded"]
                result["roofline_fraction_b256_e2e_padded"] = padded["tok_s"] / r256["roofline_tok_s"]
                result["prefill_s_b256_padded"] = padded["prefill_s"]
            if "hf_static_compile" in r256:
                result["speedup_vs_hf_static_b256"] = (
                    r256["ours"]["tok_s"] / r256["hf_static_compile"]["tok_s"]
                )
            if "hf_dynamic" in r256:
                result["speedup_vs_hf_dynamic_b256"] = r256["ours"]["tok_s"] / r256["hf_dynamic"]["tok_s"]
            result["peak_gb_b256"] = {k: v["peak_gb"] for k, v in r256.items() if isinstance(v, dict)}
        if r1 is not None:
            result["ms_per_token_b1"] = r1["ours"]["ms_per_step"]
        result["fork_speedup"] = result[main_name]["fork_speedup"]
    except (KeyError, TypeError) as exc:  # a failed row leaves its headline keys out
        result["headline_error"] = repr(exc)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    lines += [
        "# generation", "",
        f"Command: `{result['command']}`",
        f"Machine: {gpu}; torch {torch.__version__}, transformers {transformers.__version__}; {platform.machine()}",
        f"Prompt {P} + {N} sampled tokens (temperature 1, no early stop), random weights in the model's shape, bf16.",
        f"Roofline: step = max(bytes / {bw / 1e12:.2f} TB/s, FLOPs / {peak / 1e12:.0f} TFLOP/s), mean context {ctx:.0f}.",
        "",
        "| model | B | ours tok/s (e2e) | ours decode tok/s | ms/step | prefill s (+1st step) | HF dynamic | HF static+compile | roofline | ours decode / roofline | peak GB ours / dyn / static |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in result["rows"]:
        o = r["ours"]
        if "error" in o:
            lines.append(f"| {r['model']} | {r['B']} | error: {o['error']} |")
            continue
        dyn, st = r.get("hf_dynamic"), r.get("hf_static_compile")
        dyn = dyn if dyn and "error" not in dyn else None
        st = st if st and "error" not in st else None
        lines.append(
            f"| {r['model']} | {r['B']} | {o['tok_s']:,.0f} | {o['decode_tok_s']:,.0f} | {o['ms_per_step']:.2f} | "
            f"{o['prefill_s']:.3f} | "
            f"{dyn['tok_s'] if dyn else float('nan'):,.0f} | {st['tok_s'] if st else float('nan'):,.0f} | "
            f"{r['roofline_tok_s']:,.0f} | {o['decode_tok_s'] / r['roofline_tok_s']:.2f} | "
            f"{o['peak_gb']:.2f} / {dyn['peak_gb'] if dyn else float('nan'):.2f} / {st['peak_gb'] if st else float('nan'):.2f} |"
        )
        pad = r.get("ours_padded")
        if pad and "error" not in pad:
            lines.append(
                f"| {r['model']} (padded prefill) | {r['B']} | {pad['tok_s']:,.0f} | {pad['decode_tok_s']:,.0f} | "
                f"{pad['ms_per_step']:.2f} | {pad['prefill_s']:.3f} | | | {r['roofline_tok_s']:,.0f} | "
                f"{pad['decode_tok_s'] / r['roofline_tok_s']:.2f} | {pad['peak_gb']:.2f} |"
            )
    lines += ["", "Headline (first model):", ""]
    for k in ("roofline_fraction_b256", "roofline_fraction_b256_e2e", "roofline_fraction_b256_e2e_padded",
              "prefill_s_b256", "prefill_s_b256_padded", "speedup_vs_hf_static_b256",
              "speedup_vs_hf_dynamic_b256", "ms_per_token_b1", "fork_speedup"):  # fmt: skip
        if k in result:
            lines.append(f"- `{k}`: {result[k]:.3f}")
    for name in args.models.split(","):
        lines += [
            "",
            f"{name}: " + json.dumps({k: v for k, v in result[name].items() if k != "profile_b256"}),
        ]
        for kname, share in result[name].get("profile_b256", []):
            lines.append(f"- profile B={max(batches)}: {share:.1%} {kname}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
