"""100 KB completions built to make answer extraction slow (quadratic scans, regex backtracking, huge
numbers, endless tags). Shared by tests/rewards/test_rewards_hardening.py (each reward stays fast and never
raises) and benchmarks/reward_throughput.py (``worst_case_ms``)."""

from __future__ import annotations

SIZE = 100_000


def _fill(unit: str, head: str = "", tail: str = "") -> str:
    body = SIZE - len(head) - len(tail)
    return head + (unit * (body // len(unit) + 1))[:body] + tail


ADVERSARIAL: dict[str, str] = {
    "\\boxed{ x10k+": _fill("\\boxed{"),
    "<answer> x12k": _fill("<answer>"),
    "<think> x14k": _fill("<think>"),
    "</think><think> pairs": _fill("</think><think>"),
    "<tool_call> x9k": _fill("<tool_call>"),
    "fence openers": _fill("```python\n"),
    "\\boxed 7 tokens": _fill("\\boxed 7 "),
    "nested braces": _fill("{", head="\\boxed{"),
    "closed deep box": "\\boxed{" + "{" * (SIZE // 2 - 8) + "}" * (SIZE // 2 - 8) + "}",
    "answer + spaces": _fill(" ", head="answer"),
    "answer + stars": _fill("*", head="Final answer"),
    "Answer: on one line": _fill("Answer: "),
    "answer is x10k": _fill("the answer is "),
    "digits": _fill("1"),
    "digits in a box": _fill("1", head="\\boxed{", tail="}"),
    "digit runs and dots": _fill("1.", head="<answer>", tail="</answer>"),
    "overline bait": _fill("1", head="\\boxed{0.", tail="\\overline}"),
    "e-notation bait": _fill("9", head="\\boxed{1e", tail="}"),
    "thin-space digits": _fill("123\\,", head="\\boxed{", tail="}"),
    "equation chain": _fill("1=", head="\\boxed{", tail="1}"),
    "set bait": _fill("1,", head="\\boxed{\\{", tail="1\\}}"),
    "text hedges": _fill("\\text{ or 4}", head="\\boxed{3", tail="}"),
    "percent words": _fill("1 percent "),
    "mixed tags": _fill("<answer>\\boxed{<think></answer>"),
    "invalid surrogates and nul": _fill("\udcff\x00\\boxed{"),
}
