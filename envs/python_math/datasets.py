"""Users' math datasets: JSONL/JSON files or Hugging Face dataset ids with a question and a gold answer.

Column names are found automatically (``question``/``problem``/``prompt``/``query``/``input`` and
``answer``/``final_answer``/``solution``/``gold``/``target``/``output``) or given. Gold formats: GSM8K's
worked solution ending in ``#### 42``, MATH's solution with a ``\\boxed{…}`` (the last box), or a plain answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError
from toolgym.optional import require
from toolgym.rewards.extract import extract_boxed

QUESTION_KEYS = ("question", "problem", "prompt", "query", "input")
ANSWER_KEYS = ("answer", "final_answer", "solution", "gold", "target", "output")


@dataclass(frozen=True)
class MathItem:
    item_id: str
    question: str
    answer: str


def gold_answer(raw: Any) -> str:
    """The final answer inside a gold field: after GSM8K's ``####``, the last ``\\boxed{}``, or the text.

    >>> gold_answer("She has 3 + 4 = 7 apples.\\n#### 1,007")
    '1007'
    >>> gold_answer("So the area is $\\\\boxed{\\\\frac{3}{4}}$.")
    '\\\\frac{3}{4}'
    >>> gold_answer(12)
    '12'
    """
    if isinstance(raw, (list, tuple)):
        raw = raw[0] if raw else ""
    text = "" if raw is None else str(raw)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().replace(",", "")
    boxed = extract_boxed(text)
    if boxed:
        return boxed[-1]
    return text.strip()


def _pick(row: dict[str, Any], given: str | None, keys: tuple[str, ...], what: str, where: str) -> Any:
    if given is not None:
        if given not in row:
            raise ConfigError(f"{where}: no column {given!r} (columns: {sorted(row)})")
        return row[given]
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return row[key]
    raise ConfigError(
        f"{where}: no {what} column; expected one of {keys} (columns: {sorted(row)}); "
        f"pass {what}_key= to name it"
    )


def _rows_from_file(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        if isinstance(data, dict):  # {"data": [...]} or a single split
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        return [r for r in data if isinstance(r, dict)]
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} line {number}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise ConfigError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _rows_from_hub(name: str, split: str, config: str | None) -> list[dict[str, Any]]:
    datasets = require("datasets", why=f"{name!r} is not a file, so it is loaded as a Hugging Face dataset")
    try:
        data = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # the library raises many types for a missing/offline dataset
        raise ConfigError(
            f"could not load dataset {name!r} (split {split!r}): {type(exc).__name__}: {exc}. "
            "Pass a JSONL file path, or a dataset id that is in the local Hugging Face cache."
        ) from exc
    return [dict(r) for r in data]


def load_rows(source: str | Path, *, split: str = "test", config: str | None = None) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl``/``.json`` file, or of a Hugging Face dataset (anything that is not a file,
    such as an id in the local cache or a folder of data files, goes to ``datasets.load_dataset``)."""
    path = Path(source)
    if path.is_file():
        return _rows_from_file(path)
    if path.suffix in (".jsonl", ".json"):
        raise ConfigError(f"dataset file {source} does not exist")
    return _rows_from_hub(str(source), split, config)


def load_math_dataset(
    source: str | Path,
    *,
    split: str = "test",
    config: str | None = None,
    question_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
) -> list[MathItem]:
    """Questions and gold answers from a ``.jsonl``/``.json`` file, or a Hugging Face dataset id (a local
    folder of data files works too: anything that is not a file goes to ``datasets.load_dataset``)."""
    rows = load_rows(source, split=split, config=config)
    items = []
    for i, row in enumerate(rows[:limit] if limit else rows):
        where = f"{source} row {i}"
        question = str(_pick(row, question_key, QUESTION_KEYS, "question", where)).strip()
        answer = gold_answer(_pick(row, answer_key, ANSWER_KEYS, "answer", where))
        if not question or not answer:
            raise ConfigError(f"{where}: empty question or answer")
        item_id = str(row.get("id", row.get("task_id", row.get("unique_id", i))))
        items.append(MathItem(item_id=item_id, question=question, answer=answer))
    if not items:
        raise ConfigError(f"{source}: no rows")
    return items
