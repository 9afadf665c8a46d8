"""A retrieval server (FastAPI on uvicorn) so that one index serves many rollout workers.

POST /search {"queries": [...], "k": 10, "with_text": false} → {"results": [[{"id", "score", "title",
"text"?}]]}; POST /docs {"ids": [...]} → {"docs": [{"id", "title", "text"} | null]}; GET /health.
Bad requests get a 4xx with a message (422 for malformed bodies, 413 for oversized ones). Searches run
on the event loop itself: a BM25 query takes well under a millisecond, and the thread-pool hop FastAPI
uses for sync endpoints cost more than that under load (bench/retrieval.py). Serve slow (dense, CPU)
indexes with more uvicorn workers.

(No `from __future__ import annotations` here: FastAPI must see the request models, defined per app
with that app's limits, as real classes.)"""


import argparse
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput
from sleuth.envs.retrieval.base import Retriever
from sleuth.servers.base import Server

MAX_BODY_BYTES = 2 * 1024 * 1024


def create_app(retriever: Retriever, max_batch: int = 512, max_k: int = 1000, max_query_chars: int = 10_000,
               info: dict[str, Any] | None = None):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    from sleuth.core.net import limit_body

    class SearchRequest(BaseModel):
        queries: list[str] = Field(min_length=1, max_length=max_batch)
        k: int = Field(10, ge=1, le=max_k)
        with_text: bool = False

    class DocsRequest(BaseModel):
        ids: list[str] = Field(min_length=1, max_length=max_batch * 10)

    app = FastAPI(title="sleuth retrieval")

    limit_body(app, MAX_BODY_BYTES)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **(info or {})}

    @app.post("/search")
    async def search(req: SearchRequest):
        too_long = [i for i, q in enumerate(req.queries) if len(q) > max_query_chars]
        if too_long:
            return JSONResponse({"detail": f"queries {too_long[:5]} are over {max_query_chars} characters"},
                                status_code=422)
        results = retriever.search(req.queries, req.k)
        out = []
        for hits in results:
            row = []
            for h in hits:
                doc = retriever.get(h.id)
                item = {"id": h.id, "score": h.score, "title": doc.title if doc else ""}
                if req.with_text and doc:
                    item["text"] = doc.text
                row.append(item)
            out.append(row)
        return {"results": out}

    @app.post("/docs")
    async def docs(req: DocsRequest):
        found = [retriever.get(i) for i in req.ids]
        return {"docs": [d.to_dict() if d else None for d in found]}

    return app


def build(args: argparse.Namespace) -> Server:
    """`sleuth serve retrieval`'s server from its flags (`servers.catalog`)."""
    from sleuth.envs.retrieval.base import read_meta
    from sleuth.envs.retrieval.index import load_index

    try:
        meta = read_meta(Path(args.index))
        index = load_index(args.index)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise BadInput(f"cannot load index {args.index}: {e}") from None
    app = create_app(index, info={"kind": meta["kind"], "n_docs": meta.get("n_docs")})
    return Server(app, f"serving {meta['kind']} index {args.index} on {{url}}")
