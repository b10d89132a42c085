"""The scripted expert: runs a question's plan against what its own searches return.

It searches each plan step's subject by name, finds the passage titled exactly so among the results, and
reads the relation off that passage's text with the patterns the passages are written in (a second query with
a hint word is tried when the first misses). It never looks at the world's arrays or the gold answer, so its
success rate measures the corpus and the retriever as well as the plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolgym.envs.base import Task
from toolgym.envs.search.kb import MONTHS
from toolgym.messages import Message

NAME = r"[A-Z][\w'-]*(?: (?:of the |of |the )?[A-Z][\w'-]*)*"
DATE = r"\d{1,2} (?:" + "|".join(MONTHS) + r") \d{4}"
PATTERNS = {
    "birthplace": rf"[Bb]orn (?:on )?(?:{DATE} )?in ({NAME})",
    "birth_date": rf"[Bb]orn (?:in {NAME} )?(?:on )?({DATE})",
    "alma_mater": rf"(?:studied at|educated at|graduated from) ({NAME})",
    "creator": rf"\bby ({NAME})",
    "year": rf"(?:completed in |is an? |created by {NAME} in )(\d{{4}})",
    "founder": rf"(?:[Ff]ounded|established)(?: in \d{{4}})? by ({NAME})",
    "founded": rf"(?:[Ff]ounded|established)(?: by {NAME})? in (\d{{4}})",
    "seat": rf"(?:based in|headquartered in|seat in) ({NAME})",
    "country": rf"(?:city in|town in|Located in) ({NAME})",
    "capital": rf"capital (?:of {NAME} )?is ({NAME})",
    "born_in": r"born in .+? include ([^.]+)\.",
    "alumni": r"alumni include ([^.]+)\.",
}
HINTS = {
    "birthplace": "born",
    "birth_date": "born",
    "alma_mater": "studied",
    "creator": "by",
    "year": "completed",
    "founder": "founded",
    "founded": "founded",
    "seat": "based",
    "country": "city",
    "capital": "capital",
    "born_in": "people born",
    "alumni": "alumni",
}
LISTS = ("born_in", "alumni")
_RESULT = re.compile(r"^Doc \d+\(Title: (.*?)\) (.*)$", re.M)


def parse_results(observation: str) -> list[tuple[str, str]]:
    """(title, text) pairs from a search observation (Search-R1's ``Doc i(Title: …) text`` lines).

    >>> parse_results("<information>Doc 1(Title: A (x)) a b\\nDoc 2(Title: B) c</information>")
    [('A (x)', 'a b'), ('B', 'c')]
    """
    body = observation.replace("<information>", "").replace("</information>", "")
    return [(m.group(1), m.group(2).strip()) for m in _RESULT.finditer(body)]


def extract(observation: str, subject: str, relation: str) -> str | list[str] | None:
    """The value of ``relation`` for ``subject``, read from the passage titled ``subject``; None if absent."""
    for title, text in parse_results(observation):
        if title != subject:
            continue
        m = re.search(PATTERNS[relation], text)
        if m is None:
            return None
        if relation in LISTS:
            return [x.strip() for x in re.split(r", | and ", m.group(1)) if x.strip()]
        return m.group(1)
    return None


def _sort_key(value: str) -> tuple[int, ...]:
    m = re.fullmatch(r"(\d{1,2}) (\w+) (\d{4})", value)
    if m:
        return (int(m.group(3)), MONTHS.index(m.group(2)) + 1, int(m.group(1)))
    return (int(value),) if value.isdigit() else (10**9,)


def next_move(plan: list[dict[str, Any]], observations: list[str]) -> tuple[str, str]:
    """("search", query) for the next search the plan needs, or ("answer", text) once it has everything.

    ``observations`` are the outputs of the expert's searches so far, in order; the plan is replayed over them
    from the start, so the expert needs no state of its own (and forks for free).
    """
    seen = iter(observations)
    results: list[Any] = []
    for step in plan:
        op = step["op"]
        if op == "follow":
            subject = step["subject"]
            subject = results[subject] if isinstance(subject, int) else subject
            relation = step["relation"]
            value: Any = None
            if isinstance(subject, str) and subject:
                for query in (subject, f"{subject} {HINTS[relation]}"):
                    observation = next(seen, None)
                    if observation is None:
                        return "search", query
                    value = extract(observation, subject, relation)
                    if value is not None:
                        break
            results.append(value if value is not None else ([] if relation in LISTS else ""))
        elif op == "intersect":
            a, b = (results[i] for i in step["args"])
            common = [x for x in a if x in set(b)]
            results.append(common[0] if len(common) == 1 else "")
        elif op == "earlier":
            names = [results[n] if isinstance(n, int) else n for n in step["names"]]
            va, vb = (_sort_key(results[i]) for i in step["args"])
            results.append(names[0] if va < vb else names[1])
        else:
            raise ValueError(f"unknown plan step {op!r}")
    return "answer", str(results[-1]) if results else ""


def expert_action(task: Task, transcript: Sequence[Message], action_format: str) -> str:
    """The next action as model text: the plan's next search or its answer. A question loaded from a file has
    no plan: it searches the question once, then answers with the first gold alias (a pipeline check, not a
    solver).

    >>> task = Task("q", "Where was Ada born?", ["London"], {"plan": None, "question": "Where was Ada born?"})
    >>> found = [Message(role="tool", content="…", name="search")]
    >>> expert_action(task, [], "tags"), expert_action(task, found, "tags")
    ('<search>Where was Ada born?</search>', '<answer>London</answer>')
    """
    outputs = [m.text for m in transcript if m.role == "tool" and m.name == "search"]
    plan = task.data["plan"]
    if plan is None:
        move = ("search", task.data["question"]) if not outputs else ("answer", task.answer[0])
    else:
        move = next_move(plan, outputs)
    if move[0] == "answer":
        return f"<answer>{move[1]}</answer>"
    if action_format == "tags":
        return f"<search>{move[1]}</search>"
    return f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': move[1]}})}</tool_call>"
