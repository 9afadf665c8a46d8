"""httpx clients (sync and async) for the retrieval server: pooled keep-alive connections, timeouts,
and retries with backoff on connection errors, timeouts, 429, 502, 503 and 504 (`net.send_with_retries`,
counted under "retrieval"; searches and look-ups are read-only, so repeating one is safe). A 4xx is the
caller's mistake: it is raised at once with the server's message; any other failure is a RetrievalError."""

from __future__ import annotations

from typing import Any

import httpx

from sleuth.core.errors import InfraFailure
from sleuth.core.net import RETRY_STATUS, RetriesExhausted, asend_with_retries, send_with_retries
from sleuth.envs.retrieval.base import Hit
from sleuth.envs.retrieval.corpus import Doc


class RetrievalError(InfraFailure):
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


def _answer(url: str, path: str, retries: int, resp: httpx.Response | None, error: Exception | None) -> dict[str, Any]:
    """The JSON of an answer, or the one-line RetrievalError of a failure that outlasted the retries."""
    if error is None and resp is not None and resp.status_code < 500 and resp.status_code not in RETRY_STATUS:
        return _check(resp)
    if isinstance(error, RetriesExhausted):
        tries, cause = error.tries, f"{type(error.last).__name__}: {error.last}"
    elif error is not None:  # not a failure that repeating fixes (e.g. a URL without http://)
        tries, cause = 1, f"{type(error).__name__}: {error}"
    else:
        tries = retries + 1 if resp.status_code in RETRY_STATUS else 1
        cause = f"{url}{path} answered {resp.status_code}"
    raise RetrievalError(f"retrieval server {url} failed after {tries} {'try' if tries == 1 else 'tries'}: "
                         f"{cause}") from error


def _hits(payload: dict[str, Any]) -> list[list[Hit]]:
    return [[Hit(h["id"], float(h["score"])) for h in row] for row in payload["results"]]


class RetrievalClient:
    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.2):
        self.url, self.retries, self.backoff = url.rstrip("/"), retries, backoff
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  limits=httpx.Limits(max_connections=64, max_keepalive_connections=32))
        self._docs: dict[str, Doc | None] = {}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp, error = None, None
        try:
            resp = send_with_retries(lambda: self._http.post(path, json=body), kind="retrieval", what=f"POST {path}",
                                     retries=self.retries, backoff_s=self.backoff)
        except httpx.TransportError as e:
            error = e
        return _answer(self.url, path, self.retries, resp, error)

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
        resp, error = None, None
        try:
            resp = await asend_with_retries(lambda: self._http.post(path, json=body), kind="retrieval",
                                            what=f"POST {path}", retries=self.retries, backoff_s=self.backoff)
        except httpx.TransportError as e:
            error = e
        return _answer(self.url, path, self.retries, resp, error)

    async def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        return _hits(await self._post("/search", {"queries": queries, "k": k})) if queries else []

    async def get(self, doc_id: str) -> Doc | None:
        d = (await self._post("/docs", {"ids": [doc_id]}))["docs"][0]
        return Doc(**d) if d else None

    async def aclose(self) -> None:
        await self._http.aclose()
