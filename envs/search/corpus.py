"""Corpora and question sets: the synthetic world's passages, users' JSONL corpora, and QA files.

- Corpus JSONL: one object per line with ``id``, ``title``, ``text`` (or Search-R1's ``contents``, a quoted
  title, a newline, the text). Passages are read back by byte offset (``os.pread``), so a corpus of millions
  of lines is never held in memory.
- QA files: HotpotQA (a JSON list or JSONL of ``question``/``answer``), NQ / FlashRAG / Search-R1 JSONL
  (``question`` with ``golden_answers`` or ``answer`` / ``answers``), and Search-R1 parquet (``question`` or a
  ``prompt`` message list, gold under ``reward_model.ground_truth.target``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.envs.search.kb import World
from toolgym.envs.search.retriever import Doc, _doc_from_json, cache_root
from toolgym.errors import ConfigError
from toolgym.jsonl import read_jsonl
from toolgym.optional import require


class WorldStore:
    """The synthetic world's passages, rendered on demand (nothing stored)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def __len__(self) -> int:
        return len(self.world)

    def get(self, i: int) -> Doc:
        title, text = self.world.passage(i)
        return Doc(str(i), title, text)


def iter_jsonl_docs(path: Path) -> Iterator[Doc]:
    with path.open("rb") as f:
        for n, line in enumerate(f):
            if line.strip():
                yield _parse_line(line, path, n)


def _parse_line(line: bytes, path: Path, n: int) -> Doc:
    try:
        return _doc_from_json(json.loads(line), str(n))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {n + 1} is not JSON ({exc})") from exc


class JsonlStore:
    """Passages of a corpus JSONL file, read by offset; the offsets are cached beside the index."""

    def __init__(self, path: str | Path, cache_dir: Path | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"corpus file {self.path} does not exist (expected JSONL with id/title/text)")
        offsets_file = (cache_dir or corpus_cache_dir(self.path)) / "offsets.npy"
        if offsets_file.exists():
            self.offsets = np.load(offsets_file, mmap_mode="r")
        else:
            self.offsets = _line_offsets(self.path)
            offsets_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = offsets_file.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(tmp, self.offsets)
            os.replace(tmp, offsets_file)
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.offsets)

    def get(self, i: int) -> Doc:
        start, end = (int(x) for x in self.offsets[i])
        return _parse_line(os.pread(self._fd, end - start, start), self.path, i)

    def texts(self) -> Iterator[str]:
        for doc in iter_jsonl_docs(self.path):
            yield f"{doc.title} {doc.text}"

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def _line_offsets(path: Path) -> np.ndarray:
    """``[start, end)`` byte ranges of the non-blank lines, shape ``[n, 2]``."""
    ranges: list[tuple[int, int]] = []
    pos = 0
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                ranges.append((pos, pos + len(line)))
            pos += len(line)
    if not ranges:
        raise ConfigError(f"corpus file {path} has no passages")
    return np.asarray(ranges, dtype=np.int64)


def corpus_cache_dir(path: Path) -> Path:
    """A cache folder keyed by the corpus file's absolute path, size and modification time."""
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"corpus-{path.stem}-{key}"


def write_world_jsonl(world: World, path: Path, show_progress: bool = True) -> None:
    """Stream the world's passages to a corpus JSONL (id/title/text, plus Search-R1's ``contents``)."""
    tqdm = require("tqdm.auto", extra="search").tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tmp.open("w") as f:
        for i, (title, text) in enumerate(
            tqdm(
                world.passages(), total=len(world), desc="Write corpus", unit="doc", disable=not show_progress
            )
        ):
            f.write(
                json.dumps({"id": str(i), "title": title, "text": text, "contents": f'"{title}"\n{text}'})
            )
            f.write("\n")
    os.replace(tmp, path)


# ----- QA files -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QAItem:
    qid: str
    question: str
    answers: list[str]


def _answers(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        for key in ("target", "answers", "answer", "aliases", "normalized_aliases", "value"):
            if key in value:
                return _answers(value[key])
        return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _answers(v)]
    return [str(value)]


def _question(record: dict[str, Any]) -> str:
    question = record.get("question") or record.get("query")
    if question:
        return str(question).strip()
    prompt: Any = record.get("prompt")
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], dict):
        # Search-R1 parquet: the instructions and "Question: ..." are one user message
        content = str(prompt[-1].get("content", ""))
        return content.rsplit("Question:", 1)[-1].strip()
    return ""


def _item(record: dict[str, Any], n: int) -> QAItem | None:
    question = _question(record)
    if not question:
        return None
    gold: list[str] = []
    for key in ("golden_answers", "answers", "answer", "reward_model", "ground_truth"):
        value = record.get(key)
        if key == "reward_model" and isinstance(value, dict):
            value = value.get("ground_truth")
        gold = [g for g in _answers(value) if g.strip()]
        if gold:
            break
    if not gold:
        return None
    extra: dict[str, Any] = record.get("extra_info") or {}
    if not isinstance(extra, dict):
        extra = {}
    qid = str(record.get("id", record.get("_id", extra.get("index", n))))
    return QAItem(qid, question, gold)


def load_questions(path: str | Path) -> list[QAItem]:
    """Questions and gold aliases from a HotpotQA / NQ / Search-R1 file (``.json``, ``.jsonl``, ``.parquet``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"questions file {p} does not exist")
    records: list[dict[str, Any]]
    if p.suffix == ".parquet":
        pq = require("pyarrow.parquet", why="reading a .parquet questions file")
        records = pq.read_table(p).to_pylist()
    else:
        text = p.read_text()
        if text.lstrip().startswith("["):
            try:
                records = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{p} is not a valid JSON list: {exc}") from exc
        else:
            records = [row for _, row in read_jsonl(p, "questions file")]
    items = [it for n, r in enumerate(records) if isinstance(r, dict) and (it := _item(r, n)) is not None]
    if not items:
        raise ConfigError(
            f"{p} has no usable questions: each record needs 'question' and gold answers "
            "('answer', 'answers', 'golden_answers' or Search-R1's reward_model.ground_truth.target)"
        )
    return items
