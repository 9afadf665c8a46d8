"""Many sandboxed runs in parallel. Threads suffice: each run is a subprocess and the thread only waits."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class SandboxPool:
    def __init__(self, workers: int | None = None):
        self.workers = workers or max(1, os.cpu_count() or 1)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="sleuth-sandbox")

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """Results in input order."""
        return self._executor.map(fn, items)

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
