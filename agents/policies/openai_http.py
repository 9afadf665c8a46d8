"""A policy served by any OpenAI-compatible completions server that takes token ids as the prompt and can
return the sampled token ids with their logprobs (vLLM, SGLang): token-in/token-out over httpx.

The prompt goes as ids (`"prompt": [ids]`) and the ids come back from the logprobs (`return_tokens_as_token_ids`),
so nothing is re-tokenised. The end-of-turn token is part of the returned ids, as with the transformers
policy. Requests of a batch are sent concurrently; vLLM batches them and reuses shared prefixes.

A completion is stateless, so a request that failed to connect or got 429/502/503/504 is sent again with
backoff (`retries` times, counted under "rollout" in `net.retry_counts()`). `max_context`, unless given,
is the served model's `max_model_len` from the server's `GET /v1/models` (vLLM reports it), asked once."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from sleuth.agents.policies.base import Generation, Request, SamplingParams
from sleuth.core.errors import InfraFailure
from sleuth.core.net import RETRY_STATUS, RetriesExhausted, send_with_retries

log = logging.getLogger(__name__)


class ServerError(InfraFailure):
    pass


class ServerUnreachable(ServerError):
    """The server could not be reached, or kept answering "not now", through every retry: another server
    of the same model may still answer (`RoutedPolicy` sends the requests there). `permanent`: it will not
    come back (a Ray worker out of restarts), so the router stops sending it work."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


class OpenAICompletionsPolicy:
    def __init__(self, base_url: str, model: str, tokenizer: Any, concurrency: int = 64, timeout_s: float = 600.0,
                 name: str | None = None, send_seed: bool = True, max_context: int | None = None,
                 retries: int = 3, backoff_s: float = 0.5):
        self.base_url = base_url.rstrip("/")
        self._context_lock = threading.Lock()
        self._max_context, self._context_known = max_context, max_context is not None
        self.retries, self.backoff_s = retries, backoff_s
        self.parallel_calls = concurrency  # each request its own call: the server's scheduler batches them
        self.model, self.tokenizer = model, tokenizer
        self.name = name or f"{model}@{self.base_url}"
        self.version = 0
        self.send_seed = send_seed
        self.client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency))
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="sleuth-http")
        eos = tokenizer.eos_token_id
        self.stop_ids = {eos} if isinstance(eos, int) else set(eos or [])

    @property
    def max_context(self) -> int | None:
        """The longest context the server takes: as given, else its `max_model_len` (None where it reports
        none; a server that cannot be asked now is asked again on the next read)."""
        with self._context_lock:
            if not self._context_known:
                self._max_context, self._context_known = self._served_context()
            return self._max_context

    @max_context.setter
    def max_context(self, value: int | None) -> None:
        with self._context_lock:
            self._max_context, self._context_known = value, True

    def _served_context(self) -> tuple[int | None, bool]:
        """(`max_model_len` of this policy's model in `GET /v1/models`, whether the server answered)."""
        url = f"{self.base_url}/v1/models"
        try:
            resp = send_with_retries(lambda: self.client.get(url), kind="rollout", what=f"GET {url}",
                                     retries=self.retries, backoff_s=self.backoff_s)
            resp.raise_for_status()
            models = resp.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            log.warning("cannot read the context length from %s (%s: %s): no limit known for now", url,
                        type(e).__name__, e)
            return None, False
        if not isinstance(models, list):
            return None, True
        mine = [m for m in models if isinstance(m, dict) and m.get("id") == self.model]
        if not mine and len(models) == 1 and isinstance(models[0], dict):
            mine = models  # one model served, under another name
        length = mine[0].get("max_model_len") if mine else None
        return (int(length) if isinstance(length, int) and length > 0 else None), True

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        bodies = [self._body(r, sampling, i) for i, r in enumerate(requests)]
        return list(self.pool.map(self._one, bodies))

    def _body(self, r: Request, s: SamplingParams, i: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": r.prompt_ids, "max_tokens": s.max_tokens,
            "temperature": max(s.temperature, 0.0), "top_p": s.top_p, "logprobs": 0,
            "return_tokens_as_token_ids": True, "skip_special_tokens": True,
        }
        # distinct per episode and turn: equal seeds would make a group's samples equal
        if s.seed is not None and self.send_seed:
            sample = i if r.sample is None else r.sample
            body["seed"] = (s.seed * 1_000_003 + sample * 7919 + r.turn) % (2**31)
        return body

    def _one(self, body: dict[str, Any]) -> Generation:
        url = f"{self.base_url}/v1/completions"
        try:
            resp = send_with_retries(lambda: self.client.post(url, json=body), kind="rollout", what=f"POST {url}",
                                     retries=self.retries, backoff_s=self.backoff_s)
        except RetriesExhausted as e:
            raise ServerUnreachable(f"completions request to {self.base_url} failed: {type(e.last).__name__}: "
                                    f"{e.last} (gave up after {e.tries} tries)") from e
        except httpx.HTTPError as e:
            raise ServerError(f"completions request to {self.base_url} failed: {type(e).__name__}: {e}") from e
        if resp.status_code in RETRY_STATUS:
            raise ServerUnreachable(f"{self.base_url} answered {resp.status_code} to {self.retries + 1} tries: "
                                    f"{resp.text[:300]}")
        if resp.status_code != 200:
            raise ServerError(f"{self.base_url} answered {resp.status_code}: {resp.text[:300]}")
        choice = resp.json()["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens")
        if tokens is None or any(not str(t).startswith("token_id:") for t in tokens):
            raise ServerError("the server returned no token ids; "
                              "it must support return_tokens_as_token_ids (vLLM does)")
        ids = [int(str(t).split(":", 1)[1]) for t in tokens]
        finish = "stop" if choice.get("finish_reason") == "stop" else "length"
        return Generation(ids=ids, logprobs=[float(x) for x in lp["token_logprobs"]],
                          text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason=finish)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()
