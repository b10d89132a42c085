"""BM25 retrieval with ``bm25s``: build (streamed, with a progress bar), cache on disk, and fast top-k.

The index is bm25s's own (eager BM25 scores in a sparse CSC matrix, saved with ``BM25.save``), with Lucene's
scoring and Pyserini's defaults ``k1=0.9, b=0.4`` (the BM25 that Search-R1 runs). Queries use bm25s's tokens
(lower case, ``\\w\\w+`` words, English stop words). Top-k reads only the postings of the query's terms and sums
them over the documents that hold one, so a query costs what its postings cost rather than a pass over every
document (bm25s's ``retrieve`` scores the whole collection); the scores are the same.

Retrievers return :class:`Hit` lists; :func:`format_hits` renders them the way Search-R1 shows them to the
model (``Doc 1(Title: …) text``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from toolgym.errors import ConfigError, InfrastructureError
from toolgym.optional import require

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
INDEX_VERSION = 1
K1, B = 0.9, 0.4


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's corpus field: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Hit:
    doc: Doc
    score: float


def format_hits(hits: Sequence[Hit]) -> str:
    """Search-R1's rendering of retrieved passages.

    >>> format_hits([Hit(Doc("0", "Paris", "Paris is the capital of France."), 3.2)])
    'Doc 1(Title: Paris) Paris is the capital of France.'
    """
    if not hits:
        return "No results."
    return "\n".join(f"Doc {i + 1}(Title: {h.doc.title}) {h.doc.text}" for i, h in enumerate(hits))


def cache_root() -> Path:
    """``$TOOLGYM_CACHE/search`` (default ``~/.cache/toolgym/search``)."""
    return Path(os.environ.get("TOOLGYM_CACHE") or Path.home() / ".cache" / "toolgym") / "search"


class Retriever(Protocol):
    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]: ...


class DocStore(Protocol):
    def __len__(self) -> int: ...

    def get(self, i: int) -> Doc: ...


# ----- the index -----------------------------------------------------------------------------------------------
class BM25Index:
    """A bm25s index plus the fast query path. Build with :meth:`build`, or :meth:`load` a saved one."""

    def __init__(self, model: Any) -> None:
        require("bm25s.stopwords")
        require("bm25s.tokenization")
        bm25s = require("bm25s")

        self.model = model
        self.vocab: dict[str, int] = model.vocab_dict
        scores = model.scores
        # plain ndarray views of the (memory-mapped) arrays: slicing a np.memmap costs microseconds each
        self.data = np.asarray(scores["data"])
        self.indices = np.asarray(scores["indices"])
        self.indptr = np.asarray(scores["indptr"])
        self.num_docs = int(scores["num_docs"])
        self._split = bm25s.tokenization.re.compile(TOKEN_PATTERN).findall
        self._stop = frozenset(bm25s.stopwords.STOPWORDS_EN)
        self._term_max: np.ndarray | None = None

    @classmethod
    def build(cls, texts: Iterable[str], total: int | None = None, show_progress: bool = True) -> BM25Index:
        """Tokenize (streamed) and index ``texts``; ``total`` sizes the progress bar."""
        bm25s = require("bm25s")
        Tokenizer = require("bm25s.tokenization").Tokenizer
        tqdm = require("tqdm.auto", extra="search").tqdm
        tokenizer = Tokenizer(lower=True, splitter=TOKEN_PATTERN, stopwords="en", stemmer=None)
        stream = tokenizer.streaming_tokenize(texts, update_vocab=True)
        ids = list(tqdm(stream, total=total, desc="Tokenize", unit="doc", disable=not show_progress))
        if not ids:
            raise ConfigError("the corpus is empty: nothing to index")
        model = bm25s.BM25(method="lucene", k1=K1, b=B)
        model.index((ids, tokenizer.get_vocab_dict()), show_progress=show_progress)
        return cls(model)

    def save(self, path: Path) -> None:
        self.model.save(str(path), show_progress=False)
        (path / "toolgym.json").write_text(
            json.dumps({"index_version": INDEX_VERSION, "num_docs": self.num_docs})
        )

    @classmethod
    def load(cls, path: Path, mmap: bool = True) -> BM25Index:
        bm25s = require("bm25s")

        meta = path / "toolgym.json"
        if not meta.exists() or json.loads(meta.read_text()).get("index_version") != INDEX_VERSION:
            raise ConfigError(f"{path} is not a toolgym BM25 index of version {INDEX_VERSION}; rebuild it")
        return cls(bm25s.BM25.load(str(path), mmap=mmap, show_progress=False))

    def tokens(self, query: str) -> list[int]:
        """The query's token ids (bm25s's tokenization; unknown words and stop words dropped)."""
        words = self._split(query.lower())
        return [self.vocab[w] for w in words if w not in self._stop and w in self.vocab]

    @property
    def term_max(self) -> np.ndarray:
        """The largest score of each term in any document (MaxScore's upper bounds)."""
        if self._term_max is None:
            indptr = np.asarray(self.indptr)
            out = np.zeros(len(indptr) - 1, dtype=np.float32)
            nonempty = np.flatnonzero(indptr[:-1] < indptr[1:])
            if len(nonempty):
                out[nonempty] = np.maximum.reduceat(np.asarray(self.data), indptr[nonempty])
            self._term_max = out
        return self._term_max

    def _sum_postings(self, terms: np.ndarray, mult: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Documents holding any of ``terms`` and their summed scores (sorted by document)."""
        slices = [(int(self.indptr[t]), int(self.indptr[t + 1])) for t in terms]
        if len(slices) == 1:
            s, e = slices[0]
            return np.asarray(self.indices[s:e], dtype=np.int64), np.asarray(
                self.data[s:e], np.float64
            ) * mult[0]
        docs = np.concatenate([self.indices[s:e] for s, e in slices]).astype(np.int64)
        weights = np.concatenate(
            [np.asarray(self.data[s:e], np.float64) * m for (s, e), m in zip(slices, mult, strict=True)]
        )
        if len(docs) > self.num_docs // 8:  # dense is cheaper than sorting this many postings
            sums = np.bincount(docs, weights=weights, minlength=self.num_docs)
            nz = np.flatnonzero(sums)
            return nz, sums[nz]
        docs, inverse = np.unique(docs, return_inverse=True)
        return docs, np.bincount(inverse, weights=weights)

    def _lookup(self, terms: np.ndarray, mult: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """Summed scores of ``terms`` in the given documents (binary search in each term's sorted postings)."""
        out = np.zeros(len(docs), dtype=np.float64)
        for t, m in zip(terms, mult, strict=True):
            s, e = int(self.indptr[t]), int(self.indptr[t + 1])
            postings = self.indices[s:e]
            pos = np.minimum(np.searchsorted(postings, docs), e - s - 1)
            hit = postings[pos] == docs
            out[hit] += np.asarray(self.data[s:e])[pos[hit]] * m
        return out

    def search(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (doc indices, scores), best first; ties go to the lower index.

        Exact MaxScore: the rarest terms' postings give the candidates; the common terms are only looked up
        for those candidates, once the best ``k`` candidates already score more than any document holding
        common terms alone could (the sum of those terms' largest scores)."""
        ids = self.tokens(query)
        if not ids or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        terms, mult = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
        lens = self.indptr[terms + 1] - self.indptr[terms]
        keep = lens > 0
        terms, mult, lens = terms[keep], mult[keep].astype(np.float64), lens[keep]
        if len(terms) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        order = np.argsort(lens, kind="stable")
        terms, mult, lens = terms[order], mult[order], lens[order]
        bounds = self.term_max[terms] * mult
        for m in range(1, len(terms)):
            if int(lens[:m].sum()) > self.num_docs // 8:
                break
            rest, rest_mult = terms[m:], mult[m:]
            cand, partial = self._sum_postings(terms[:m], mult[:m])
            if len(cand) < k:
                continue
            top = np.argpartition(-partial, k - 1)[:k]
            floor = np.min(partial[top] + self._lookup(rest, rest_mult, cand[top]))
            rest_bound = float(bounds[m:].sum())
            if rest_bound < floor:
                # only candidates that could still reach the floor need their common terms looked up
                live = np.flatnonzero(partial + rest_bound >= floor)
                cand, partial = cand[live], partial[live]
                return self._top(cand, partial + self._lookup(rest, rest_mult, cand), k)
        return self._top(*self._sum_postings(terms, mult), k)

    @staticmethod
    def _top(docs: np.ndarray, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        vals = vals.astype(np.float32)  # bm25s's precision, so ties compare as bm25s sees them
        if len(docs) > k:
            cut = np.partition(vals, len(vals) - k)[len(vals) - k]
            keep = np.flatnonzero(vals >= cut)
            docs, vals = docs[keep], vals[keep]
        order = np.lexsort((docs, -vals))[:k]
        return docs[order], vals[order]


# ----- local and remote retrievers ---------------------------------------------------------------------------
class LocalRetriever:
    """An in-process index over a doc store."""

    def __init__(self, index: BM25Index, store: DocStore) -> None:
        if index.num_docs != len(store):
            raise ConfigError(
                f"the index holds {index.num_docs} documents but the corpus {len(store)}; rebuild"
            )
        self.index = index
        self.store = store
        _ = index.term_max  # computed now, not inside the first search

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            docs, scores = self.index.search(q, topk)
            out.append([Hit(self.store.get(int(d)), float(s)) for d, s in zip(docs, scores, strict=True)])
        return out


def _doc_from_json(d: Any, fallback_id: str) -> Doc:
    if not isinstance(d, dict):
        return Doc(fallback_id, "", str(d))
    if "title" in d or "text" in d:
        return Doc(str(d.get("id", fallback_id)), str(d.get("title", "")), str(d.get("text", "")))
    contents = str(d.get("contents", ""))
    title, _, text = contents.partition("\n")
    return Doc(str(d.get("id", fallback_id)), title.strip().strip('"'), text)


class RemoteRetriever:
    """A client of a Search-R1-style retrieval server (``POST {url}/retrieve``), with timeouts and retries.

    A server that cannot be reached, times out, or answers in the wrong shape after ``retries`` tries raises
    :class:`~toolgym.errors.InfrastructureError`: the env reports it as ``env_error``, never as a wrong answer.
    """

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.25) -> None:
        import httpx

        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"retriever_url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        if not self.url.endswith("/retrieve"):
            self.url += "/retrieve"
        self.retries = max(1, retries)
        self.backoff_s = backoff_s
        self._client = httpx.Client(timeout=timeout_s)
        self._lock = threading.Lock()

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import time

        import httpx

        from toolgym.parsing import clean_json

        # (httpx's UTF-8 encoder raises on a lone surrogate: a query must never turn into a crash of the step)
        payload = {"queries": clean_json(list(queries)), "topk": topk, "return_scores": True}
        error = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with self._lock:
                    response = self._client.post(self.url, json=payload)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                error = f"HTTP {response.status_code}"
                continue
            if response.status_code != 200:
                raise InfrastructureError(
                    f"retrieval server {self.url} refused the request: {response.text[:300]}"
                )
            return self._parse(response, len(queries))
        raise InfrastructureError(f"retrieval server {self.url} failed after {self.retries} tries ({error})")

    def _parse(self, response: Any, n: int) -> list[list[Hit]]:
        try:
            result = response.json()["result"]
            if len(result) != n:
                raise ValueError(f"{len(result)} result lists for {n} queries")
            out = []
            for qi, hits in enumerate(result):
                row = []
                for j, h in enumerate(hits):
                    if isinstance(h, dict) and "document" in h:
                        row.append(
                            Hit(_doc_from_json(h["document"], f"{qi}-{j}"), float(h.get("score", 0.0)))
                        )
                    else:  # return_scores ignored by the server: bare documents
                        row.append(Hit(_doc_from_json(h, f"{qi}-{j}"), 0.0))
                out.append(row)
            return out
        except (ValueError, KeyError, TypeError) as exc:
            raise InfrastructureError(
                f"retrieval server {self.url} answered in an unknown shape: {exc}"
            ) from exc

    def close(self) -> None:
        self._client.close()


# ----- building into the cache ----------------------------------------------------------------------------------
_BUILD_LOCK = threading.Lock()


def cached_index(
    key: str, texts: Iterable[str], total: int | None, show_progress: bool = True, root: Path | None = None
) -> BM25Index:
    """Load the index cached under ``key``, or build and save it (into a temporary folder, then renamed into
    place, so an interrupted build never leaves a half index)."""
    path = (root or cache_root()) / key
    with _BUILD_LOCK:
        if (path / "toolgym.json").exists():
            return BM25Index.load(path)
        index = BM25Index.build(texts, total, show_progress)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        try:
            index.save(tmp)
            os.replace(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (path / "toolgym.json").exists():
                raise
        return BM25Index.load(path)
