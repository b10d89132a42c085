"""Where an env's passages and questions come from: the synthetic world, a corpus file, or a server.

Worlds, indexes and doc stores are shared by every env of a process (an index of a million passages is
loaded once, memory-mapped); indexes of more than ``IN_MEMORY_MAX`` passages are cached on disk.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from toolgym.envs.search.corpus import JsonlStore, WorldStore, corpus_cache_dir
from toolgym.envs.search.kb import KB_VERSION, World
from toolgym.envs.search.retriever import (
    INDEX_VERSION,
    BM25Index,
    LocalRetriever,
    RemoteRetriever,
    Retriever,
    cache_root,
    cached_index,
)
from toolgym.errors import ConfigError

IN_MEMORY_MAX = 0  # every index is cached on disk; a process loads it in milliseconds
_LOCK = threading.Lock()
_RETRIEVERS: dict[tuple[Any, ...], LocalRetriever] = {}


@dataclass
class Source:
    world: World | None
    retriever: Retriever


@lru_cache(maxsize=4)
def world(seed: int, num_passages: int) -> World:
    return World(seed, num_passages)


def world_meta(corpus: str | Path) -> dict[str, Any] | None:
    """The synthetic world a corpus file was written from (``world.json`` beside it), if any."""
    meta = Path(corpus).parent / "world.json"
    if not meta.exists():
        return None
    data = json.loads(meta.read_text())
    if data.get("kb_version") != KB_VERSION:
        raise ConfigError(f"{meta} was written by another version of the world generator; rewrite the corpus")
    return data


def world_key(seed: int, num_passages: int) -> str:
    return f"world-v{KB_VERSION}-s{seed}-n{num_passages}-i{INDEX_VERSION}"


def world_retriever(w: World, show_progress: bool = False) -> LocalRetriever:
    key = ("world", w.seed, w.num_passages)
    with _LOCK:
        if key not in _RETRIEVERS:
            texts = (f"{t} {x}" for t, x in w.passages())
            if len(w) <= IN_MEMORY_MAX:
                index = BM25Index.build(texts, len(w), show_progress=show_progress)
            else:
                index = cached_index(world_key(w.seed, len(w)), texts, len(w), show_progress)
            _RETRIEVERS[key] = LocalRetriever(index, WorldStore(w))
        return _RETRIEVERS[key]


def corpus_retriever(path: str | Path, show_progress: bool = False) -> LocalRetriever:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"corpus file {p} does not exist (expected JSONL with id/title/text)")
    cache_dir = corpus_cache_dir(p)
    key = ("corpus", str(cache_dir))
    with _LOCK:
        if key not in _RETRIEVERS:
            store = JsonlStore(p, cache_dir)
            index = cached_index(
                f"{cache_dir.name}/bm25", store.texts(), len(store), show_progress, cache_root()
            )
            _RETRIEVERS[key] = LocalRetriever(index, store)
        return _RETRIEVERS[key]


def open_source(
    *,
    num_passages: int,
    world_seed: int,
    corpus: str | None,
    retriever_url: str | None,
    timeout_s: float,
    retries: int,
    show_progress: bool,
) -> Source:
    w: World | None
    if corpus:
        meta = world_meta(corpus)
        w = world(int(meta["seed"]), int(meta["num_passages"])) if meta else None
    else:
        w = world(world_seed, num_passages)
    retriever: Retriever
    if retriever_url:
        retriever = RemoteRetriever(retriever_url, timeout_s=timeout_s, retries=retries)
    elif corpus:
        retriever = corpus_retriever(corpus, show_progress)
    else:
        assert w is not None
        retriever = world_retriever(w, show_progress)
    return Source(w, retriever)
