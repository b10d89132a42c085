"""The one rule for the reasoning in a model's reply: what the action parser reads and what rewards score is the
text outside it.

Reasoning is a ``<think>…</think>`` block or a HiPER ``<subgoal>…</subgoal>`` plan (trainers/hiper.py): both
are ignored, so every env and every reward passes a plan through untouched. The cases:

- a closed block is removed, wherever it stands (``a<think>x</think>b`` reads ``ab``);
- an unclosed block hides everything after it: a completion cut off while thinking has no action and no
  answer (``a<think>x`` reads ``a``);
- a lone ``</think>`` with no ``<think>`` before it (chat templates such as Qwen3's and DeepSeek-R1's open
  ``<think>`` in the prompt, so the reply starts inside the reasoning): only the text after the last
  ``</think>`` counts. No template opens ``<subgoal>`` for the model, so a lone ``</subgoal>`` is plain text.
"""

from __future__ import annotations

import re

_OPEN = re.compile(r"<(think|subgoal)>")
_CLOSE_THINK = "</think>"


def strip_reasoning(text: str) -> str:
    """The text outside the reasoning (see the module docstring for the cases).

    >>> strip_reasoning("<think>maybe 3</think>The answer is 4")
    'The answer is 4'
    >>> strip_reasoning("<subgoal>find x</subgoal><answer>4</answer><think>\\\\boxed{3} and I ran out")
    '<answer>4</answer>'
    """
    first_close = text.find(_CLOSE_THINK)
    if first_close >= 0 and text.find("<think>", 0, first_close) < 0:
        text = text[text.rfind(_CLOSE_THINK) + len(_CLOSE_THINK) :]
    out, pos = [], 0
    while True:  # closed blocks removed, an unclosed one hides the rest: one left-to-right pass
        found = _OPEN.search(text, pos)
        if found is None:
            out.append(text[pos:])
            break
        out.append(text[pos : found.start()])
        close = f"</{found.group(1)}>"
        end = text.find(close, found.end())
        if end < 0:
            break
        pos = end + len(close)
    return "".join(out)
