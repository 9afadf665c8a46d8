"""Sessions on a server that holds only so many at once (an OpenEnv server takes `max_concurrent_envs`, one by
default, and refuses the next WebSocket with CAPACITY_REACHED; `sleuth serve env` takes `--max-sessions` and
answers 429): the episodes of this process queue for a free one instead of failing.

The limit is learnt from the refusals (openenv-core 0.3.0 keeps it inside the app; another client's sessions
count against it too): a refusal while this process holds k sessions means the server takes k, and the next
episodes wait until one of those k ends. A refusal while this process holds none (another client fills the
server) is waited out by polling with backoff. Every refusal is counted under "env_session" in
`net.retry_counts()` (`sleuth eval`'s summary shows it) and the first one per server is reported as a warning."""

from __future__ import annotations

import threading
import time
import warnings

from sleuth.core.errors import InfraFailure
from sleuth.core.net import count_retry

# How long a reset waits for a session before its episode fails as an env failure (the agent loop's episode
# timeout, when shorter, gives up on it first: the env is closed and the wait abandoned).
SESSION_WAIT_S = 1800.0
POLL_S = (0.5, 1.0, 2.0, 5.0)  # waits between tries while another client holds every session


class SessionsBusy(InfraFailure):
    """No session came free within the wait allowed."""


class SessionGate:
    """The sessions this process holds on one server (`held`: opened; `pending`: being opened) and how many the
    server takes (None: not refused yet)."""

    _gates: dict[str, SessionGate] = {}
    _gates_lock = threading.Lock()

    def __init__(self, url: str):
        self.url = url
        self.held = 0
        self.pending = 0
        self.waiting = 0  # envs waiting for a slot: an env between episodes gives its session up for them
        self.limit: int | None = None
        self._cond = threading.Condition()

    @classmethod
    def of(cls, url: str) -> SessionGate:
        """The one gate of `url` in this process (every env on that server shares it)."""
        with cls._gates_lock:
            return cls._gates.setdefault(url.rstrip("/"), cls(url.rstrip("/")))

    def acquire(self, deadline: float, abandoned: threading.Event) -> None:
        """Wait until this process may try one more session (or `deadline` passes, or the caller is abandoned)."""
        with self._cond:
            self.waiting += 1
            try:
                while self.limit is not None and self.held + self.pending >= self.limit:
                    left = deadline - time.monotonic()
                    if left <= 0 or abandoned.is_set():
                        raise SessionsBusy(f"{self.url} holds {self.limit} session(s) at once and none came free "
                                           "in time")
                    self._cond.wait(min(left, 1.0))
            finally:
                self.waiting -= 1
            self.pending += 1

    def opened(self) -> None:
        with self._cond:
            self.pending -= 1
            self.held += 1

    def failed(self) -> None:
        """The try failed otherwise than by a refusal: its slot goes back."""
        with self._cond:
            self.pending -= 1
            self._cond.notify()

    def release(self) -> None:
        with self._cond:
            self.held -= 1
            self._cond.notify()

    def refused(self) -> int:
        """The server refused the try: learn the limit from the sessions open now (tries still in flight do not
        count: they may be refused too). Returns them (0: another client fills the server; poll)."""
        count_retry("env_session")
        with self._cond:
            self.pending -= 1
            others = self.held
            first = self.limit is None
            if others:
                self.limit = others if self.limit is None else min(self.limit, others)
            self._cond.notify()
        if first:
            warnings.warn(f"{self.url} refused a session while this process held {others}: episodes wait for a free "
                          f"one (the server takes {others or 'none now'}; counted under env_session retries)",
                          stacklevel=3)
        return others


def open_session(gate: SessionGate, connect, is_refusal, deadline: float, abandoned: threading.Event):
    """`connect()` once a slot is free; on a refusal (`is_refusal(error)`), wait and try again until `deadline`.
    Returns what `connect` returned; the session counts as held until `gate.release()`."""
    polls = 0
    while True:
        gate.acquire(deadline, abandoned)
        try:
            out = connect()
        except Exception as e:
            if not is_refusal(e):
                gate.failed()
                raise
            if gate.refused() == 0:  # someone else's sessions: nothing of ours will free one, so poll
                pause = POLL_S[min(polls, len(POLL_S) - 1)]
                polls += 1
                if time.monotonic() + pause > deadline or abandoned.wait(pause):
                    raise SessionsBusy(f"{gate.url} refused every session for the time allowed: {e}") from None
            continue
        gate.opened()
        return out
