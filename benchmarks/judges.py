"""The judge reward against a real served model: agreement with our labels, cache speedup, injection flips.

Starts ``toolgym serve --agent hf:smollm2-135m`` (CPU unless a GPU is visible) as the judge, or uses
``--url`` (vLLM, our engine, a hosted API), then:

- ``judge_agreement``: the shipped labelled set (48 rows, rewards/data/judge_labelled.jsonl) graded by the
  default correctness rubric; a row passes at a score >= 0.5; a failed verdict counts as a disagreement.
  SmolLM2-135M is far too small to grade well: the number shows the harness works end to end.
- ``judge_cache_hit_speedup``: the same 48 rows graded again by the same judge (every verdict from the
  content-hash cache) against the first, uncached pass: wall time of the first / the second.
- ``judge_injection_flips``: wrong answers of the injection set (12 rows) that pass, with the rubric's
  programmatic check (``mentions_reference``) capping the judge; ``judge_injection_flips_unchecked``: the
  same without the check (what the prompt alone resists).

    python benchmarks/judges.py [--url http://127.0.0.1:8000] [--model NAME] [--out benchmarks/results/judges.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from toolgym.rewards.judge import Judge, judge
from toolgym.rewards.judge_calibration import (
    INJECTION,
    LABELLED,
    agreement,
    grade_rows,
    load_labelled,
    mentions_reference,
)

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(agent: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    # one torch thread: on a shared CPU host, spinning OpenMP threads made each request 20x slower (97 s vs 5 s)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolgym", "serve", "--agent", agent, "--port", str(port)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"toolgym serve exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("toolgym serve did not come up in 600 s")


def timed_grade(j: Judge, rows: list[dict[str, Any]]) -> tuple[list[Any], float]:
    t0 = time.perf_counter()
    verdicts = grade_rows(j, rows)
    return verdicts, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None, help="a running OpenAI-compatible server (default: start one)")
    ap.add_argument("--agent", default="hf:smollm2-135m", help="what `toolgym serve` serves")
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=16, help="judge reply tokens (the reply is one line)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", default="benchmarks/results/judges.md")
    args = ap.parse_args()

    out = ROOT / args.out
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.agent, out.with_suffix(".server.log"))
    try:
        opts: dict[str, Any] = dict(model=args.model, max_tokens=args.max_tokens, concurrency=args.concurrency,
                                    retries=1, timeout_s=600)  # fmt: skip
        labelled = load_labelled(LABELLED)
        j = judge(url, **opts)
        cold, cold_s = timed_grade(j, labelled)
        print(f"labelled set graded in {cold_s:.1f} s", flush=True)
        # only verdicts are cached, not failures: the second pass is over the rows the first one scored
        scored = [r for r, v in zip(labelled, cold, strict=True) if v.score is not None]
        warm, warm_s = timed_grade(j, scored)
        assert all(v.cached for v in warm)
        agree = agreement(labelled, cold)
        injection = load_labelled(INJECTION)
        unchecked = agreement(injection, grade_rows(judge(url, **opts), injection))
        checked = agreement(injection, grade_rows(judge(url, check=mentions_reference, **opts), injection))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)

    data = {
        "judge_agreement": round(agree.agreement, 4),
        "judge_coverage": round(agree.coverage, 4),
        "judge_kappa": round(agree.kappa, 4),
        "judge_confusion": {
            k: agree.as_dict()[k] for k in ("true_pos", "true_neg", "false_pos", "false_neg")
        },
        # per row: the uncached pass graded every row concurrently, the cached one the rows it scored
        "judge_cache_hit_speedup": round(
            (cold_s / len(labelled)) / max(warm_s / max(len(scored), 1), 1e-9), 1
        ),
        "judge_uncached_s": round(cold_s, 2),
        "judge_cached_s": round(warm_s, 4),
        "judge_cached_rows": len(scored),
        "judge_injection_flips": checked.false_pos,
        "judge_injection_flips_unchecked": unchecked.false_pos,
        "judge_injection_rows": len(injection),
        "judge_injection_coverage_unchecked": round(unchecked.coverage, 4),
        "judge_replies_sample": [v.reply for v in cold[:6]],
        "judge": f"toolgym serve --agent {args.agent}" if args.url is None else args.url,
        "max_tokens": args.max_tokens,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    c = data["judge_confusion"]
    md = f"""# Judge reward (`benchmarks/judges.py`)

Judge: {data["judge"]} ({data["machine"]}; {data["date"]}). Rubric: the default correctness criterion
(0-10, pass at >= 5), replies of at most {args.max_tokens} tokens, greedy, one retry (sampled at 0.7) of an
unreadable reply. `python benchmarks/judges.py` reruns it.

| key | value | what |
|---|---|---|
| `judge_agreement` | {data["judge_agreement"]} | 48 labelled rows; a failed verdict counts as a disagreement |
| `judge_coverage` | {data["judge_coverage"]} | rows the judge gave a readable verdict for |
| `judge_kappa` | {data["judge_kappa"]} | Cohen's kappa over the scored rows (0: chance) |
| confusion | TP {c["true_pos"]}, TN {c["true_neg"]}, FP {c["false_pos"]}, FN {c["false_neg"]} | pass = score >= 0.5 |
| `judge_cache_hit_speedup` | {data["judge_cache_hit_speedup"]}x | per row: {data["judge_uncached_s"]} s for 48 uncached rows vs {data["judge_cached_s"]} s for the {len(scored)} rows it scored, again, from the cache |
| `judge_injection_flips` | {data["judge_injection_flips"]} of {len(injection)} | injection rows passing with the programmatic check |
| `judge_injection_flips_unchecked` | {data["judge_injection_flips_unchecked"]} of {len(injection)} | the same, judge alone (prompt defences only) |

SmolLM2-135M is expected to grade near chance: the numbers show the harness (server, batching, parsing,
retries, cache, cap) end to end, not a usable judge. Read coverage first: a reply without the asked
`correctness: N` line is no verdict (None, retried once, then not scored), never a 0; SmolLM2-135M almost
never writes it, so agreement is bounded by coverage, and the cache speedup rests on the rows it scored. A GPU run with the same model on vLLM or our engine
uses `--url`.

First replies: {json.dumps(data["judge_replies_sample"])}
"""
    out.write_text(md)
    print(md)


if __name__ == "__main__":
    main()
