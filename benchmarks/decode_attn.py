"""Decode attention alone (CUDA): v1 vs v2 of the engine's Triton kernel, achieved bandwidth.

One decode step's attention for every layer of the model (one call a layer, as the engine's CUDA graph
does), B rows with ragged lengths around ``--length``, the SmolLM2-135M and Qwen2.5-0.5B head shapes.
Achieved GB/s = bytes of K and V up to each row's length / time. Each version's output is checked against
plain torch (float32) on the same cache: the max abs error is printed and asserted. ``--sweep`` also
times a grid of v2 configs and names the fastest per shape (as a ``TOOLGYM_DECODE_ATTN_CFG`` value).
Writes ``--out``.md and ``--out``.json.

    python benchmarks/decode_attn.py                 # v1 vs v2 (default config), B in {64, 256}
    python benchmarks/decode_attn.py --sweep         # + v2 configs, the best per shape
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # heads, KV heads, head dim, layers
    "smollm2-135m": (9, 3, 64, 30),
    "qwen2.5-0.5b": (14, 2, 64, 24),
}
DATASHEET_BW = {"H200": 4.8e12, "H100": 3.35e12}


def reference(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor):  # type: ignore[no-untyped-def]
    """Plain torch in float32: each KV head's G query heads against the slot's cache up to pos."""
    B, H, D = q.shape
    hkv, cap = kc.shape[1], kc.shape[2]
    G = H // hkv
    mask = (torch.arange(cap, device=q.device)[None, :] <= pos[:, None])[:, None, None, :]
    qg = q.float().view(B, hkv, G, D)
    o = torch.nn.functional.scaled_dot_product_attention(
        qg, kc[slots].float(), vc[slots].float(), attn_mask=mask
    )
    return o.reshape(B, H, D)


def time_graph(fn: Any, replays: int) -> float:
    """Seconds per call of ``fn`` (one model's layers) captured in a CUDA graph, best of ``replays``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return best


def run_shape(
    name: str, B: int, args: argparse.Namespace, configs: list[Any], dev: torch.device, sms: int
) -> list[dict[str, Any]]:
    from toolgym.agents.engine import kernels as K

    H, hkv, D, layers = SHAPES[name]
    g = torch.Generator().manual_seed(B)
    half = args.spread // 2
    lengths = torch.randint(args.length - half, args.length + half + 1, (B,), generator=g)
    cap = int(lengths.max()) + 8
    S = B + 1  # the engine's scratch slot too
    gd = torch.Generator(device=dev).manual_seed(B)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32  # (Triton's CPU interpreter: no bf16)
    # every layer its own cache (GBs at B=256): the step's K/V do not fit in L2, as in the engine
    kc = torch.randn((layers, S, hkv, cap, D), generator=gd, device=dev, dtype=dt)
    vc = torch.randn((layers, S, hkv, cap, D), generator=gd, device=dev, dtype=dt)
    q = torch.randn((layers, B, H, D), generator=gd, device=dev, dtype=dt)
    slots = torch.randperm(B, generator=g).to(dev)  # rows not in slot order, as in the engine
    pos = (lengths - 1).to(dev)
    nbytes = layers * int(lengths.sum()) * hkv * D * 2 * kc.element_size()  # K and V, every layer
    ref = reference(q[0], kc[0], vc[0], slots, pos)
    nsplit_v1 = _engine_nsplit(B, hkv, cap, sms)
    rows = []
    for version, cfg in configs:
        label = (
            "v1"
            if version == "v1"
            else f"v2 {_cfg_text(cfg or K.default_config(B, hkv, H // hkv, cap, sms))}"
        )

        def step(version: str = version, cfg: Any = cfg) -> None:
            for layer in range(layers):
                K.decode_attention(q[layer], kc[layer], vc[layer], slots, pos, nsplit_v1, cap, version, cfg)

        try:
            out = K.decode_attention(q[0], kc[0], vc[0], slots, pos, nsplit_v1, cap, version, cfg)
            err = float((out.float() - ref).abs().max())
            sec = time_graph(step, args.replays)
        except Exception as e:  # a config the GPU cannot run (shared memory): reported, not fatal
            print(f"{name} B={B} {label}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        assert err < 0.05, f"{name} B={B} {label}: max abs error {err} vs float32 torch"
        gbs = nbytes / sec / 1e9
        row = {
            "model": name, "B": B, "kernel": label, "us_per_layer": 1e6 * sec / layers, "gb_s": gbs,
            "bw_fraction": gbs * 1e9 / args.bw, "max_abs_err": err, "mean_length": float(lengths.float().mean()),
            "capacity": cap, "v1_nsplit": nsplit_v1,
        }  # fmt: skip
        print(
            f"{name} B={B} {label}: {row['us_per_layer']:.1f} us/layer {gbs:,.0f} GB/s "
            f"({row['bw_fraction']:.2f} of bw) err {err:.1e}",
            flush=True,
        )
        rows.append(row)
    return rows


def _engine_nsplit(b: int, kv_heads: int, capacity: int, sms: int) -> int:
    """``Engine._nsplit``: v1's time split as the engine picks it."""
    want = -(-2 * sms // (b * kv_heads))
    most = max(1, capacity // 128)
    n = 1
    while n < min(want, most):
        n *= 2
    return n


def _cfg_text(cfg: Any) -> str:
    return f"bt={cfg.bt},chunk={cfg.chunk},warps={cfg.warps},stages={cfg.stages}"


def sweep_configs() -> list[Any]:
    from toolgym.agents.engine.kernels import AttnConfig

    out = []
    for bt, chunk, warps, stages in itertools.product((64, 128), (0, 128, 256, 512), (2, 4, 8), (2, 3, 4)):
        if (chunk and chunk < bt) or (bt == 128 and (stages == 4 or chunk == 128)):
            continue
        out.append(AttnConfig(bt=bt, chunk=chunk, warps=warps, stages=stages))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--batch", default="64,256")
    ap.add_argument("--length", type=int, default=1024, help="mean row length (generation.py: 960 + ~64)")
    ap.add_argument("--spread", type=int, default=128, help="lengths uniform in length ± spread/2")
    ap.add_argument("--bw", type=float, default=None, help="bytes/s (default: H100 3.35e12, H200 4.8e12)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="also time a grid of v2 configs")
    ap.add_argument("--out", default="benchmarks/results/decode_attn")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_attn.py times the Triton decode attention on a CUDA GPU; none is available here")
    gpu = torch.cuda.get_device_name()
    if args.bw is None:
        args.bw = next((v for k, v in DATASHEET_BW.items() if k in gpu), 3.35e12)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    configs: list[Any] = [("v1", None), ("v2", None)] + [
        ("v2", c) for c in (sweep_configs() if args.sweep else [])
    ]
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        for B in (int(b) for b in args.batch.split(",")):
            rows.extend(run_shape(name, B, args, configs, dev, sms))
    best: dict[str, Any] = {}
    for (name, B), group in itertools.groupby(rows, key=lambda r: (r["model"], r["B"])):
        group = list(group)
        top = max(group, key=lambda r: r["gb_s"])
        v1 = next((r for r in group if r["kernel"] == "v1"), None)
        v2 = next((r for r in group if r["kernel"].startswith("v2")), None)
        best[f"{name}_b{B}"] = {
            "best": top["kernel"], "best_gb_s": top["gb_s"], "best_bw_fraction": top["bw_fraction"],
            "v1_gb_s": v1 and v1["gb_s"], "v2_default_gb_s": v2 and v2["gb_s"],
            "v2_speedup_vs_v1": v1 and v2 and v2["gb_s"] / v1["gb_s"],
        }  # fmt: skip
    result = {
        "gpu": gpu, "bw": args.bw, "torch": torch.__version__, "rows": rows, "best": best,
        "command": "python " + " ".join(sys.argv),
    }  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [
        "# decode_attn",
        "",
        f"Command: `{result['command']}`",
        f"Machine: {gpu}; torch {torch.__version__}; {platform.machine()}; bandwidth {args.bw / 1e12:.2f} TB/s",
        f"Rows: lengths uniform in {args.length} ± {args.spread // 2}, bf16, one call a layer in a CUDA graph.",
        "",
        "| model | B | kernel | us/layer | GB/s | of bw | max abs err |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['B']} | {r['kernel']} | {r['us_per_layer']:.1f} | {r['gb_s']:,.0f} | "
            f"{r['bw_fraction']:.2f} | {r['max_abs_err']:.1e} |"
        )
    lines += ["", "Best per shape (set `TOOLGYM_DECODE_ATTN_CFG` to a v2 config's text to use it):", ""]
    for key, b in best.items():
        lines.append(f"- {key}: {b['best']} ({b['best_gb_s']:,.0f} GB/s, {b['best_bw_fraction']:.2f} of bw)")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(best) - 1 :]))


if __name__ == "__main__":
    main()
