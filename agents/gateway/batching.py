"""Batching for agents that call one at a time. The agent loop hands the engine every ready episode at once;
agents behind the gateway each send their own call when they are ready, so with a model in this process (one
call slot) the first call to arrive would go alone and the rest wait for the next engine call, and the
sessions drift apart into half-full batches. `Coalescer` holds a call until every open session has one queued,
or for at most its window (small beside a generation), then sends them together. The window adapts: a call
that waited for nobody halves it (down to `MIN_WINDOW_S`: sessions that call one after another do not pay the
full window each time), a batch that others joined restores it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from sleuth.agents.policies.base import Request
from sleuth.agents.policies.requests import RequestQueue, Sampled

MIN_WINDOW_S = 0.002


class Coalescer:
    def __init__(self, queue: RequestQueue, window_s: float, open_sessions: Callable[[], int]):
        self.queue, self.window_s, self.open_sessions = queue, window_s, open_sessions
        self.window = window_s  # the current one
        self._cond = threading.Condition()
        self._held: list[tuple[Request, Future[Sampled]]] = []
        self._leader = False  # a caller is already holding the batch open

    def submit(self, requests: list[Request]) -> list[Future[Sampled]]:
        futures: list[Future[Sampled]] = [Future() for _ in requests]
        with self._cond:
            self._held += zip(requests, futures, strict=True)
            self._cond.notify_all()
            if self._leader:
                return futures
            self._leader = True
            deadline = time.monotonic() + self.window
            while len(self._held) < self.open_sessions() and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            batch, self._held, self._leader = self._held, [], False
            joined = len(batch) > len(requests)
            self.window = self.window_s if joined else max(MIN_WINDOW_S, self.window / 2)
        for (_, mine), inner in zip(batch, self.queue.submit([r for r, _ in batch]), strict=True):
            inner.add_done_callback(lambda done, mine=mine: _copy(done, mine))
        return futures


def _copy(done: Future[Sampled], into: Future[Sampled]) -> None:
    if done.cancelled():
        into.cancel()
    elif done.exception() is not None:
        into.set_exception(done.exception())
    else:
        into.set_result(done.result())
