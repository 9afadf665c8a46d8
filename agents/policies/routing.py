"""`RoutedPolicy`: several servers of the same model (data-parallel engines) behind one `Policy`.

A task sticks to the server it was first sent to, so its group's shared prompt and every turn of its
episodes hit that server's prefix cache; a task not seen before goes to the server with the fewest
requests outstanding. Requests without a task (direct `generate` calls) go to the least-loaded server
each time. The servers' own schedulers batch what they receive.

Each server retries its own transient failures (`OpenAICompletionsPolicy`); requests that a server still
could not take (`ServerUnreachable`) go once to the least-loaded other server, their tasks' home moving
there (a completion is stateless: only that server's prefix cache is lost). Counted as "rollout" retries."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Protocol

from sleuth.agents.policies.base import Generation, Policy, Request, SamplingParams
from sleuth.agents.policies.openai_http import ServerUnreachable
from sleuth.core.net import count_retry


class ServerPolicy(Policy, Protocol):
    """A policy behind a connection that is closed when done (`OpenAICompletionsPolicy`)."""

    def close(self) -> None: ...


class RoutedPolicy:
    def __init__(self, servers: Sequence[ServerPolicy], name: str | None = None):
        if not servers:
            raise ValueError("RoutedPolicy needs at least one server")
        self.servers = list(servers)
        self.name = name or "+".join(s.name for s in self.servers)
        self.tokenizer: Any = self.servers[0].tokenizer
        limits = [s.max_context for s in self.servers if s.max_context is not None]
        self.max_context = min(limits) if limits else None
        self.parallel_calls = sum(s.parallel_calls for s in self.servers)
        self.version = 0
        self.outstanding = [0] * len(self.servers)  # requests sent and not yet answered, per server
        self.home: dict[str, int] = {}  # task id → its server
        self.gone: set[int] = set()  # servers that said they will not come back (`ServerUnreachable.permanent`)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(len(self.servers), thread_name_prefix="sleuth-route")

    def route(self, request: Request) -> int:
        """The server for `request` (counted as outstanding there until `_done`)."""
        with self._lock:
            key = request.task.id if request.task is not None else None
            server = self.home.get(key) if key is not None else None
            if server is None or server in self.gone:
                server = min(self._candidates(), key=lambda i: (self.outstanding[i], i))
                if key is not None:
                    self.home[key] = server
            self.outstanding[server] += 1
            return server

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        parts: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            parts.setdefault(self.route(r), []).append(i)
        out: list[Generation | None] = [None] * len(requests)

        def on(server: int, idx: list[int]) -> list[Generation]:
            try:
                return self.servers[server].generate([requests[i] for i in idx], sampling)
            finally:
                with self._lock:
                    self.outstanding[server] -= len(idx)

        def call(server: int, idx: list[int]) -> None:
            try:
                gens = on(server, idx)
            except ServerUnreachable as e:
                if e.permanent:
                    with self._lock:
                        self.gone.add(server)
                other = self._move([requests[i] for i in idx], server)
                if other is None:
                    raise
                gens = on(other, idx)
            for i, g in zip(idx, gens, strict=True):
                out[i] = g

        futures = [self._pool.submit(call, s, idx) for s, idx in parts.items()]
        wait(futures)  # every part ends (and is uncounted) before a failure is raised
        for f in futures:
            f.result()  # a failed server fails the call, as one server would
        return out  # type: ignore[return-value]  # every slot filled above

    def _move(self, requests: list[Request], failed: int) -> int | None:
        """The least-loaded server other than `failed` (None if there is none), now home to the tasks of
        `requests` and counting them as outstanding."""
        with self._lock:
            others = [i for i in self._candidates() if i != failed]
            if not others:
                return None
            server = min(others, key=lambda i: (self.outstanding[i], i))
            for r in requests:
                if r.task is not None and self.home.get(r.task.id) == failed:
                    self.home[r.task.id] = server
            self.outstanding[server] += len(requests)
        count_retry("rollout")
        return server

    def _candidates(self) -> list[int]:
        """The servers new work may go to: all but the gone ones (all of them when every one is gone, so the
        call fails with the servers' own error)."""
        return [i for i in range(len(self.servers)) if i not in self.gone] or list(range(len(self.servers)))

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for s in self.servers:
            s.close()
