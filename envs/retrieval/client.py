"""httpx clients (sync and async) for the retrieval server: pooled keep-alive connections, timeouts,
and retries with backoff on connection errors, timeouts, 429 and 5xx. A 4xx is the caller's mistake:
it is raised at once with the server's message."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from sleuth.envs.retrieval.base import Hit
from sleuth.envs.retrieval.corpus import Doc

_RETRY_STATUS = {429, 500, 502, 503, 504}


class RetrievalError(RuntimeError):
    pass


def _check(resp: httpx.Response) -> dict[str, Any]:
    if 400 <= resp.status_code < 500:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text[:300]
        raise ValueError(f"retrieval server rejected the request ({resp.status_code}): {detail}")
    resp.raise_for_status()
    return resp.json()


def _hits(payload: dict[str, Any]) -> list[list[Hit]]:
    return [[Hit(h["id"], float(h["score"])) for h in row] for row in payload["results"]]


class RetrievalClient:
    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.2):
        self.url, self.retries, self.backoff = url.rstrip("/"), retries, backoff
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))
        self._docs: dict[str, Doc | None] = {}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.post(path, json=body)
                if resp.status_code not in _RETRY_STATUS:
                    return _check(resp)
                error: Exception = RetrievalError(f"{self.url}{path} answered {resp.status_code}")
            except httpx.TransportError as e:  # refused, reset, timed out
                error = e
            if attempt < self.retries:
                time.sleep(self.backoff * 2**attempt)
        raise RetrievalError(f"retrieval server {self.url} failed after {self.retries + 1} tries: {error}") from error

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        return _hits(self._post("/search", {"queries": queries, "k": k})) if queries else []

    def get(self, doc_id: str) -> Doc | None:
        if doc_id not in self._docs:
            d = self._post("/docs", {"ids": [doc_id]})["docs"][0]
            self._docs[doc_id] = Doc(**d) if d else None
        return self._docs[doc_id]

    def health(self) -> dict[str, Any]:
        return _check(self._http.get("/health"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRetrievalClient:
    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.2):
        self.url, self.retries, self.backoff = url.rstrip("/"), retries, backoff
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout,
                                       limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http.post(path, json=body)
                if resp.status_code not in _RETRY_STATUS:
                    return _check(resp)
                error: Exception = RetrievalError(f"{self.url}{path} answered {resp.status_code}")
            except httpx.TransportError as e:
                error = e
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2**attempt)
        raise RetrievalError(f"retrieval server {self.url} failed after {self.retries + 1} tries: {error}") from error

    async def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        return _hits(await self._post("/search", {"queries": queries, "k": k})) if queries else []

    async def get(self, doc_id: str) -> Doc | None:
        d = (await self._post("/docs", {"ids": [doc_id]}))["docs"][0]
        return Doc(**d) if d else None

    async def aclose(self) -> None:
        await self._http.aclose()
