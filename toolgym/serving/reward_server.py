"""``toolgym serve-reward``: a rubric over HTTP (FastAPI) in OpenRLHF's remote reward-model shape
(``--remote_rm_url``); toolgym's one reward server.

``POST /get_reward`` takes ``{"query": [...], "prompts": [...], "labels": [...]}`` (plus any other list of
the same length, passed to the rubric as a column of that name) and answers ``{"rewards", "scores",
"extra_logs": {"valid", part…}}``. OpenRLHF's ``query`` is prompt + response: the prompt prefix is cut off so
only the response is scored (a reward must never see the prompt echo); ``labels`` becomes the gold column
(``gold_key``); a None (not applicable) is sent as ``none_value`` with ``valid`` 0. ``score_request`` is that
mapping without HTTP. The body is a pydantic model: a missing ``query``, a non-string query or lists of
unequal length are answered 422 with the field and the reason. ``GET /health`` lists the parts; ``/docs`` is
the OpenAPI page. Scoring runs in FastAPI's thread pool, so slow rewards (a sandbox) do not block the loop.

A reward that is NaN or infinite is a fault of the rubric, not a score: it is sent as ``none_value`` with
``valid`` 0, like None (and strict JSON has no NaN). A rubric that raises is a 500 with the reason; a body
past ``limits.max_body_bytes`` is 413 and one that does not arrive in time 408 (``{"detail": ...}``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolgym.errors import ConfigError
from toolgym.optional import require
from toolgym.rewards.rubric import Rubric
from toolgym.serving.base import AppServer, Limits


def score_request(
    rubric: Rubric, payload: dict[str, Any], gold_key: str = "answer", none_value: float = 0.0
) -> dict[str, Any]:
    """The response to one OpenRLHF-style request (also usable without HTTP).

    >>> from toolgym.rewards.qa import exact_match
    >>> score_request(Rubric([exact_match]), {"query": ["Q: capital? <answer>Paris</answer>"], "prompts": ["Q: capital? "],
    ...                                       "labels": ["Paris"]})
    {'rewards': [1.0], 'scores': [1.0], 'extra_logs': {'valid': [1.0], 'exact_match': [1.0]}}
    >>> score_request(Rubric([exact_match]), {"query": ["<answer>x</answer>"], "labels": [[]]})["extra_logs"]["valid"]
    [0.0]
    """
    queries = payload.get("query", payload.get("queries"))
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ConfigError('the request needs "query": a list of strings (prompt + response).')
    n = len(queries)
    prompts = payload.get("prompts") or [""] * n
    if len(prompts) != n:
        raise ConfigError(f'"prompts" has {len(prompts)} items but "query" has {n}.')
    completions = [q[len(p) :] if p and q.startswith(p) else q for q, p in zip(queries, prompts, strict=True)]
    columns: dict[str, Any] = {}
    for key, value in payload.items():
        if key in ("query", "queries", "prompts") or not isinstance(value, list) or len(value) != n:
            continue
        columns[gold_key if key == "labels" else key] = value
    columns["prompts"] = prompts
    result = rubric.score(completions, **columns)
    totals = [_finite(t) for t in result.total]
    rewards = [none_value if t is None else t for t in totals]
    extra: dict[str, list[float]] = {"valid": [0.0 if t is None else 1.0 for t in totals]}
    for name, values in result.parts.items():
        extra[name] = [none_value if v is None else v for v in map(_finite, values)]
    return {"rewards": rewards, "scores": list(rewards), "extra_logs": extra}


def _finite(value: Any) -> float | None:
    """``value`` as a float, or None for None, NaN and infinities (a reward function's fault: not a score)."""
    if value is None:
        return None
    out = float(value)
    return out if math.isfinite(out) else None


class RewardRequest(BaseModel):
    """OpenRLHF's request: ``query`` is prompt + response (the prompt prefix is cut off before scoring)."""

    model_config = ConfigDict(extra="allow")
    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _queries_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "query" not in data and "queries" in data:
            data = {**data, "query": data["queries"]}
            del data["queries"]
        return data

    @model_validator(mode="after")
    def _same_length(self) -> RewardRequest:
        n = len(self.query)
        for name in ("prompts", "labels"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f'"{name}" has {len(value)} items but "query" has {n}')
        return self


class RewardResponse(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[float]]


def build_reward_app(rubric: Rubric, gold_key: str = "answer", none_value: float = 0.0) -> Any:
    """The FastAPI application serving ``rubric``."""
    require("fastapi", why="serve-reward runs on it")  # first: a missing package names its extra
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="toolgym serve-reward", description="A toolgym rubric as OpenRLHF's remote reward.")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Any:  # a bug of ours: a JSON 500, never a trace
        return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}"})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "parts": rubric.names}

    @app.post("/get_reward", response_model=RewardResponse)
    @app.post("/", response_model=RewardResponse, include_in_schema=False)
    def get_reward(req: RewardRequest) -> dict[str, Any]:
        payload = {
            "query": req.query,
            "prompts": req.prompts,
            "labels": req.labels,
            **(req.model_extra or {}),
        }
        payload = {k: v for k, v in payload.items() if v is not None}
        try:
            return score_request(rubric, payload, gold_key, none_value)
        except ConfigError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        except Exception as exc:  # a bad sample must not take the server down
            raise HTTPException(status_code=500, detail=f"{type(exc).__name__}: {exc}") from exc

    return app


class RewardServer(AppServer):
    """``RewardServer(rubric_or_fn, host, port)``; ``.start()`` / ``.serve_forever()`` / ``.close()``."""

    def __init__(
        self,
        fn: Rubric | Callable[..., Any],
        host: str = "127.0.0.1",
        port: int = 5000,
        *,
        gold_key: str = "answer",
        none_value: float = 0.0,
        limits: Limits | None = None,
    ) -> None:
        self.rubric = fn if isinstance(fn, Rubric) else Rubric([fn])
        app = build_reward_app(self.rubric, gold_key, none_value)
        super().__init__(
            app, host, port, limits=limits, error_body=lambda status, message, code: {"detail": message}
        )
