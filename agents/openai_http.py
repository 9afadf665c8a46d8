"""A policy served by any OpenAI-compatible completions server that takes token ids as the prompt and can
return the sampled token ids with their logprobs (vLLM, SGLang): token-in/token-out over httpx.

The prompt goes as ids (`"prompt": [ids]`) and the ids come back from the logprobs (`return_tokens_as_token_ids`),
so nothing is re-tokenised. The end-of-turn token is part of the returned ids, as with the transformers
policy. Requests of a batch are sent concurrently; vLLM batches them and reuses shared prefixes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from sleuth.agents.policy import Generation, Request, SamplingParams


class ServerError(RuntimeError):
    pass


class OpenAICompletionsPolicy:
    def __init__(self, base_url: str, model: str, tokenizer: Any, concurrency: int = 64, timeout_s: float = 600.0,
                 name: str | None = None, send_seed: bool = True, max_context: int | None = None):
        self.base_url = base_url.rstrip("/")
        self.max_context = max_context  # the server's max_model_len, where the caller knows it
        self.parallel_calls = concurrency  # each request its own call: the server's scheduler batches them
        self.model, self.tokenizer = model, tokenizer
        self.name = name or f"{model}@{self.base_url}"
        self.version = 0
        self.send_seed = send_seed
        self.client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency))
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="sleuth-http")
        eos = tokenizer.eos_token_id
        self.stop_ids = {eos} if isinstance(eos, int) else set(eos or [])

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        bodies = [self._body(r, sampling, i) for i, r in enumerate(requests)]
        return list(self.pool.map(self._one, bodies))

    def _body(self, r: Request, s: SamplingParams, i: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": r.prompt_ids, "max_tokens": s.max_tokens,
            "temperature": max(s.temperature, 0.0), "top_p": s.top_p, "logprobs": 0,
            "return_tokens_as_token_ids": True, "skip_special_tokens": True,
        }
        if s.seed is not None and self.send_seed:  # distinct per episode and turn: equal seeds would make a group's samples equal
            sample = i if r.sample is None else r.sample
            body["seed"] = (s.seed * 1_000_003 + sample * 7919 + r.turn) % (2**31)
        return body

    def _one(self, body: dict[str, Any]) -> Generation:
        try:
            resp = self.client.post(f"{self.base_url}/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise ServerError(f"completions request to {self.base_url} failed: {type(e).__name__}: {e}") from e
        if resp.status_code != 200:
            raise ServerError(f"{self.base_url} answered {resp.status_code}: {resp.text[:300]}")
        choice = resp.json()["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens")
        if tokens is None or any(not str(t).startswith("token_id:") for t in tokens):
            raise ServerError("the server returned no token ids; it must support return_tokens_as_token_ids (vLLM does)")
        ids = [int(str(t).split(":", 1)[1]) for t in tokens]
        finish = "stop" if choice.get("finish_reason") == "stop" else "length"
        return Generation(ids=ids, logprobs=[float(x) for x in lp["token_logprobs"]],
                          text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason=finish)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()
