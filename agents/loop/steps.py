"""Env calls (steps, resets) on daemon threads, so a call that never returns (a hung tool, a sandbox that
stopped answering) costs its episode and nothing else.

A stuck thread cannot be stopped in Python; when the loop stops waiting on a call (`release`: it runs long,
or its episode's deadline passed) the thread is left to finish or hang on its own and a new one takes its
place, so the run keeps its `workers` calls at a time. The threads are daemons: a hung call never blocks
the process from exiting (a `ThreadPoolExecutor` joins its threads at exit)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

# How long the loop waits on one env call before it goes on without it (with `env_threads` 0 steps are waited
# for, so that the batches stay those of stepping inline; a call past this holds up no other episode).
INLINE_WAIT_S = 1.0


class EnvSteps:
    """`workers` daemon threads running env calls; `submit` returns the call's future."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"env step workers must be at least 1, got {workers}")
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._released: set[Future] = set()
        self.workers = workers
        self.released = 0  # calls whose thread was replaced, over the runner's life
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, daemon=True, name="sleuth-env").start()

    def submit(self, call: Callable[[], Any]) -> Future:
        fut: Future = Future()
        self._jobs.put((fut, call))
        return fut

    def release(self, fut: Future) -> None:
        """Stop counting `fut`'s call against the width: if it is still running, a new thread takes its place now
        and its own retires when (if ever) the call returns, its outcome still set on `fut`."""
        with self._lock:
            if fut.done() or fut in self._released:
                return
            self._released.add(fut)
            self.released += 1
        self._spawn()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, call = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                outcome, error = call(), None
            except BaseException as e:  # handed to whoever waits on the future
                outcome, error = None, e
            with self._lock:  # the outcome and the retiring together: `release` sees either both or neither
                if error is None:
                    fut.set_result(outcome)
                else:
                    fut.set_exception(error)
                if fut in self._released:  # replaced already: this thread retires
                    self._released.discard(fut)
                    return

    def close(self) -> None:
        """Stop the idle threads (a stuck one stays with its call: it is a daemon)."""
        for _ in range(self.workers):
            self._jobs.put(None)


def in_background(call: Callable[[], Any]) -> Future:
    """`call()` on a daemon thread of its own (left behind if it never returns)."""
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(call())
        except BaseException as e:  # handed to whoever waits on the future
            fut.set_exception(e)

    threading.Thread(target=run, daemon=True, name="sleuth-env-reset").start()
    return fut
