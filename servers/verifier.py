"""A verifier server (FastAPI on uvicorn): `sleuth serve verifier --name qa|code|swe --port P`.

POST /score {"records": [{...task record..., "response": "..."}], "extract": true} →
    {"results": [{"score": float, "details": {...}}]}   (extract, the default: score the answer / program /
    patch in the response, as `sleuth score` and the TRL, verl and OpenRLHF adapters do)
POST /get_reward — OpenRLHF's remote reward protocol ({"query", "prompts", "labels"} → {"rewards", ...})
GET  /health
Records are scored concurrently in a thread pool (code and swe records each run in the sandbox), at most
`workers` at a time. Malformed input gets a 4xx naming what is wrong; bodies over the limit get 413; a
record this machine cannot score (an official SWE-bench instance without Docker) gets 503.

(No `from __future__ import annotations`: FastAPI must see the request models as real classes.)"""

import argparse
import asyncio
from typing import Any

from sleuth.core.errors import BadInput, one_line
from sleuth.servers.base import Server

MAX_BODY_BYTES = 8 * 1024 * 1024


def create_app(name: str, workers: int = 4, max_records: int = 512):
    import anyio
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    from sleuth.core.net import limit_body
    from sleuth.verifiers.adapters.openrlhf import openrlhf_rewards
    from sleuth.verifiers.base import CannotScore
    from sleuth.verifiers.registry import get_verifier, verdict

    get_verifier(name)  # fail at start-up, not on the first request
    limiter = anyio.CapacityLimiter(workers)
    inline = name == "qa"  # microseconds of string work: a thread hop would cost more than the scoring

    class ScoreRequest(BaseModel):
        records: list[dict[str, Any]] = Field(min_length=1, max_length=max_records)
        extract: bool = True  # the scorable part of the reply, as `sleuth score` and the adapters score it

    class RewardRequest(BaseModel):
        query: list[str] = Field(min_length=1, max_length=max_records)
        prompts: list[str]
        labels: list[Any]

    app = FastAPI(title=f"sleuth verifier: {name}")

    limit_body(app, MAX_BODY_BYTES)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "verifier": name, "workers": workers}

    @app.post("/score")
    async def score(req: ScoreRequest):
        bad = [i for i, r in enumerate(req.records) if not isinstance(r.get("response"), str)]
        if bad:
            return JSONResponse({"detail": f"records {bad[:10]} have no string 'response'"}, status_code=422)

        async def one(record: dict[str, Any]) -> dict[str, Any]:
            if inline:
                v = verdict(name, record, record["response"], req.extract)
            else:
                v = await anyio.to_thread.run_sync(verdict, name, record, record["response"], req.extract,
                                                   limiter=limiter)
            return {"score": v.score, "details": v.details}

        outcomes = await asyncio.gather(*(one(r) for r in req.records), return_exceptions=True)
        for i, out in enumerate(outcomes):
            if isinstance(out, CannotScore):
                return JSONResponse({"detail": f"record {i}: {out}"}, status_code=503)
            if isinstance(out, (KeyError, ValueError, TypeError)):
                return JSONResponse({"detail": f"record {i} cannot be scored by {name!r}: {type(out).__name__}: {out}"},
                                    status_code=422)
            if isinstance(out, BaseException):
                raise out
        return {"results": outcomes}

    @app.post("/get_reward")
    async def get_reward(req: RewardRequest):
        try:
            return await anyio.to_thread.run_sync(openrlhf_rewards, name, req.query, req.prompts, req.labels,
                                                  limiter=limiter)
        except (KeyError, ValueError, TypeError) as e:
            return JSONResponse({"detail": str(e)}, status_code=422)

    return app


def build(args: argparse.Namespace) -> Server:
    """`sleuth serve verifier`'s server from its flags (`servers.catalog`)."""
    from sleuth.verifiers.registry import get_verifier

    try:
        get_verifier(args.name)
    except (LookupError, ImportError) as e:  # an unknown name (with the closest one), or a plugin that does not load
        raise BadInput(one_line(str(e))) from None
    return Server(create_app(args.name, args.workers), f"serving the {args.name} verifier on {{url}}")
