"""Calls to the judge over the OpenAI API (the `openai` SDK), with what a judge that many episodes lean on needs:
concurrency, a cache of earlier replies (a re-score makes no call), tries again on a failed call (and on an
unreadable reply from a judge that samples: at temperature 0 it would say the same again), and counts of calls,
tokens and latency. A call that fails every try raises `JudgeUnavailable`: an infrastructure failure, which
callers record as an episode that failed, never as a score."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from sleuth.verifiers.base import CannotScore
from sleuth.verifiers.judge.config import JudgeConfig, JudgeConfigError
from sleuth.verifiers.judge.prompts import Junk

T = TypeVar("T")
R = TypeVar("R")


class JudgeUnavailable(CannotScore):
    """The judge gave no usable answer in `retries + 1` tries (down, timed out, refused, or replies without a
    score). Not a verdict on the response."""


@dataclass
class JudgeStats:
    """Counts since the last `take()`: the `judge/*` metrics of a training step or an evaluation."""

    calls: int = 0  # requests sent (each try counts)
    cache_hits: int = 0
    retries: int = 0  # tries after a failed one
    junk: int = 0  # replies with no usable score
    errors: int = 0  # requests that failed (connection, timeout, HTTP error)
    unavailable: int = 0  # judgements given up after every try: their episodes failed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0  # summed over calls

    @classmethod
    def total(cls, parts: list[JudgeStats]) -> JudgeStats:
        """The counts of several processes (a run's ranks) added up."""
        return cls(**{f.name: sum(getattr(p, f.name) for p in parts) for f in fields(cls)})

    def metrics(self) -> dict[str, float]:
        out = {f"judge/{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out["judge/latency_s"] = self.latency_s / self.calls if self.calls else 0.0  # per call
        return out


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool


class JudgeClient:
    def __init__(self, cfg: JudgeConfig):
        try:
            from openai import OpenAI
        except ImportError:
            raise JudgeConfigError(f"judge {cfg.source}: a judge calls its endpoint with the openai SDK, which is not "
                                   f"installed: pip install 'sleuth[judge]'") from None

        self.cfg = cfg
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        # the SDK's own retries are off: tries, their backoff and their counts are this class's
        self.api = OpenAI(base_url=cfg.base_url, api_key=key or "none", timeout=cfg.timeout_s, max_retries=0)
        self.stats = JudgeStats()
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self._cache_path = Path(cfg.cache) if cfg.cache else None
        if self._cache_path is not None and self._cache_path.exists():
            self._load_cache(self._cache_path)

    def take_stats(self) -> JudgeStats:
        with self._lock:
            out, self.stats = self.stats, JudgeStats()
        return out

    def ask(self, messages: list[dict[str, str]], read: Callable[[str], T]) -> tuple[T, Reply]:
        """`read(reply)` of the judge's reply to `messages`: from the cache, or asked up to `retries + 1` times."""
        key = self._key(messages)
        hit = self._cache.get(key)
        if hit is not None:
            try:
                value = read(hit["reply"])
            except Junk:  # the settings that read replies changed since: ask again
                pass
            else:
                with self._lock:
                    self.stats.cache_hits += 1
                return value, Reply(hit["reply"], 0, 0, cached=True)
        from openai import APIConnectionError, APIStatusError, APITimeoutError

        why, tries = "", 0
        for attempt in range(self.cfg.retries + 1):
            tries += 1
            if attempt:
                with self._lock:
                    self.stats.retries += 1
                time.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            t0 = time.perf_counter()
            try:
                out = self.api.chat.completions.create(
                    model=self.cfg.model, messages=messages,  # type: ignore[arg-type]
                    temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens)
            except APIStatusError as e:
                self._count(time.perf_counter() - t0, error=True)
                why = f"HTTP {e.status_code}: {str(e.message)[:200]}"
                if e.status_code < 500 and e.status_code not in (408, 409, 429):
                    break  # a request the judge refuses (bad key, unknown model): asking again gives the same
                continue
            except (APIConnectionError, APITimeoutError) as e:
                self._count(time.perf_counter() - t0, error=True)
                why = f"{type(e).__name__}: {e}"
                continue
            usage = out.usage
            text = (out.choices[0].message.content or "") if out.choices else ""
            self._count(time.perf_counter() - t0, prompt=usage.prompt_tokens if usage else 0,
                        completion=usage.completion_tokens if usage else 0)
            try:
                value = read(text)
            except Junk as e:
                with self._lock:
                    self.stats.junk += 1
                why = str(e)
                if self.cfg.temperature == 0:
                    break  # a greedy judge gives the same reply again: only a sampled one is worth asking twice
                continue
            self._remember(key, text, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0)
            return value, Reply(text, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
                                cached=False)
        with self._lock:
            self.stats.unavailable += 1
        raise JudgeUnavailable(f"judge {self.cfg.model} at {self.cfg.base_url} gave no usable answer in {tries} "
                               f"{'try' if tries == 1 else 'tries'}: {why}")

    def map(self, fn: Callable[[R], T], items: Iterable[R]) -> list[T | Exception]:
        """`fn` over `items`, `concurrency` at a time; an item whose `fn` raised gives its exception."""
        def safe(item: R) -> T | Exception:
            try:
                return fn(item)
            except Exception as e:  # returned, so one item's failure fails that item only
                return e

        with ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="judge") as pool:
            return list(pool.map(safe, items))

    # -- internals ------------------------------------------------------------------------------------
    def _key(self, messages: list[dict[str, str]]) -> str:
        c = self.cfg
        blob = json.dumps([c.base_url, c.model, c.temperature, c.max_tokens, messages], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _count(self, seconds: float, error: bool = False, prompt: int = 0, completion: int = 0) -> None:
        with self._lock:
            self.stats.calls += 1
            self.stats.errors += error
            self.stats.latency_s += seconds
            self.stats.prompt_tokens += prompt
            self.stats.completion_tokens += completion

    def _remember(self, key: str, reply: str, prompt: int, completion: int) -> None:
        row = {"key": key, "reply": reply, "prompt_tokens": prompt, "completion_tokens": completion}
        with self._lock:
            self._cache[key] = row
            if self._cache_path is not None:
                self._cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self._cache_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")

    def _load_cache(self, path: Path) -> None:
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                self._cache[row["key"]] = row
            except (json.JSONDecodeError, KeyError, TypeError):  # a torn last line (a run cut mid-write)
                continue
