"""`RequestQueue`: per-request futures over the batched, synchronous `Policy.generate` — the async policy
interface the continuous agent loop issues requests through, so a request goes as soon as its episode is
ready and env steps run while the engine generates.

How requests become calls follows `Policy.parallel_calls`. A model in this process (1): requests queue
while a call runs and the next call takes all of them, so the engine batches whatever is ready when it
frees. A server (many): requests are spread over the free call slots, one request per call when slots
are plentiful, so the server's own continuous batching sees every live episode as soon as it is ready."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sleuth.agents.policies.base import Generation, Policy, Request, SamplingParams


class WeightsGate:
    """Generate calls hold it together, a weight update alone (writer first: a waiting update holds new calls
    back), so weights never change during a call and every turn's version is the one that produced it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._updating = False
        self._waiting = 0  # updates waiting for the calls in flight to end

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not (self._updating or self._waiting))
            self._calls += 1
        try:
            yield
        finally:
            with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def update(self, timeout_s: float) -> Iterator[None]:
        """Hold new calls back, wait up to `timeout_s` for those in flight; TimeoutError if they do not end."""
        with self._cond:
            self._waiting += 1
            try:
                if not self._cond.wait_for(lambda: not (self._calls or self._updating), timeout_s):
                    raise TimeoutError(f"{self._calls} generate call(s) still running after {timeout_s:g} s")
            finally:
                self._waiting -= 1
                self._cond.notify_all()
            self._updating = True
        try:
            yield
        finally:
            with self._cond:
                self._updating = False
                self._cond.notify_all()


@dataclass
class Sampled:
    generation: Generation
    version: int  # the policy version of the call that produced it (weights never change during a call)


class RequestQueue:
    def __init__(self, policy: Policy, sampling: SamplingParams, gate: WeightsGate | None = None):
        self.policy, self.sampling, self.gate = policy, sampling, gate
        self.slots = max(1, int(policy.parallel_calls))
        self._pool = ThreadPoolExecutor(self.slots, thread_name_prefix="sleuth-engine")
        self._lock = threading.Lock()
        self._queued: list[tuple[Request, Future[Sampled]]] = []
        self._calls = 0  # calls in flight

    def submit(self, requests: list[Request]) -> list[Future[Sampled]]:
        """Queue `requests` together (one call can take them all); each future holds its `Sampled`, or the
        call's exception."""
        futures: list[Future[Sampled]] = [Future() for _ in requests]
        with self._lock:
            self._queued += zip(requests, futures, strict=True)
            self._dispatch()
        return futures

    def _dispatch(self) -> None:  # under the lock
        while self._queued and self._calls < self.slots:
            n = math.ceil(len(self._queued) / (self.slots - self._calls))
            batch, self._queued = self._queued[:n], self._queued[n:]
            self._calls += 1
            self._pool.submit(self._run, batch)

    def _run(self, batch: list[tuple[Request, Future[Sampled]]]) -> None:
        try:
            with self.gate.call() if self.gate else contextlib.nullcontext():
                version = self.policy.version
                gens = self.policy.generate([r for r, _ in batch], self.sampling)
            if len(gens) != len(batch):
                raise RuntimeError(f"{self.policy.name} returned {len(gens)} generations for {len(batch)} requests")
        except BaseException as e:  # the call failed: every request in it fails the same way
            outcomes: list[Sampled | BaseException] = [e] * len(batch)
        else:
            outcomes = [Sampled(g, version) for g in gens]
        with self._lock:  # a call's results appear together (see `done`)
            for (_, f), o in zip(batch, outcomes, strict=True):
                if isinstance(o, BaseException):
                    f.set_exception(o)
                else:
                    f.set_result(o)
            self._calls -= 1
            self._dispatch()

    def done(self, futures: Iterable[Future]) -> list[Future]:
        """Those of `futures` that are done, read while no call is publishing its results: a caller that
        sees one result of a call sees all of them, so what it submits next is batched the same way every
        run (an in-process env steps instantly; lock-step and continuous then form the same batches)."""
        with self._lock:
            return [f for f in futures if f.done()]

    def close(self) -> None:
        """Cancel what is still queued; a call in flight finishes on its own thread."""
        with self._lock:
            for _, f in self._queued:
                f.cancel()
            self._queued.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

