"""A retrieval server that speaks Search-R1's protocol (FastAPI): ``POST /retrieve``.

Request: ``{"queries": ["...", ...], "topk": 3, "return_scores": true}`` (``topk`` optional: the server's
default). Response: ``{"result": [[{"document": {...}, "score": 12.3}, ...], ...]}``, one list per query, or
lists of bare documents when ``return_scores`` is false. A document has ``id``, ``title``, ``text`` and
``contents`` (Search-R1's wiki corpus field: the quoted title, a newline, the text), so Search-R1's own client
code reads it unchanged. ``GET /health`` reports the number of documents.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from toolgym.envs.search.retriever import Hit, Retriever
from toolgym.optional import require

MAX_QUERIES = 1024
MAX_QUERY_CHARS = 10_000
MAX_TOPK = 100


class QueryRequest(BaseModel):
    """Search-R1's request body."""

    queries: list[str] = Field(max_length=MAX_QUERIES)
    topk: int | None = Field(default=None, ge=1, le=MAX_TOPK)
    return_scores: bool = False


def _document(hit: Hit) -> dict[str, Any]:
    d = hit.doc
    return {"id": d.id, "title": d.title, "text": d.text, "contents": d.contents}


def create_app(retriever: Retriever, default_topk: int = 3, num_docs: int | None = None) -> Any:
    """The FastAPI app serving ``retriever``."""
    FastAPI = require("fastapi", extra="search", why="the retrieval server runs on it").FastAPI
    app = FastAPI(title="toolgym retriever", description="Search-R1-compatible BM25 retrieval (bm25s)")

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict[str, Any]:
        # a plain def: FastAPI runs it in its thread pool, so searches never block the event loop
        topk = request.topk or default_topk
        queries = [q[:MAX_QUERY_CHARS] for q in request.queries]
        results = retriever.retrieve(queries, topk) if queries else []
        if request.return_scores:
            return {
                "result": [[{"document": _document(h), "score": h.score} for h in hits] for hits in results]
            }
        return {"result": [[_document(h) for h in hits] for hits in results]}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "num_docs": num_docs}

    return app
