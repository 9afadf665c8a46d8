"""`RemoteEnv` (and `AsyncRemoteEnv`): a gymnasium.Env whose episodes run on an env server (`sleuth serve env`),
so envs too heavy for the trainer's machine run elsewhere. `url` may list several servers (comma-separated): each
RemoteEnv takes the next one, round robin, so the agent loop spreads its episodes over them.

`tasks=[...]` works as for the built-in envs: a reset without `options={"task": ...}` draws one of them
(with the env's seeded generator, here) and sends it to the server. Without either, the reset sends only its
seed (or none) and the env on the server takes it as it would in process (a family env's seed is its episode: a
row, a game seed). `env_id` names the env a server of a whole family (`sleuth serve env --env FAMILY:*`) builds;
every other keyword builds the env on the server (e.g. `harness="text"`).

Faults: requests time out (never a hang); connection failures and 429/502/503/504 answers are retried
with backoff (`retries` times, counted under "env" in `net.retry_counts()`), then a dead or failing
server raises `RemoteEnvError`, which the agent loop turns into a failed trajectory with the reason
recorded. Every request is safe to repeat: opening a session (an unused one is reaped), a reset (it starts
the same episode again) and a step, which carries a number the server answers a repeat of with the
step's first answer instead of stepping again."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import gymnasium
import httpx
from gymnasium.utils import seeding

from sleuth.core.errors import InfraFailure
from sleuth.core.net import RetriesExhausted, asend_with_retries, send_with_retries
from sleuth.envs.base import TextSpace
from sleuth.envs.sessions import SESSION_WAIT_S, SessionGate, SessionsBusy, open_session

# The longest action a step takes: the env server refuses a longer one (422), and a client's action space says so.
MAX_ACTION_CHARS = 1_000_000
_next_server = itertools.count()
_lock = threading.Lock()


class RemoteEnvError(InfraFailure):
    def __init__(self, message: str, status: int | None = None, detail: str | None = None):
        super().__init__(message)
        self.status = status  # the server's HTTP answer, where it gave one
        self.detail = detail  # what the server said, where it said something


def _pick_url(url: str, cls: str) -> str:
    """One of the comma-separated `url`s, round robin over the envs made in this process."""
    urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"{cls} needs a server url")
    with _lock:
        return urls[next(_next_server) % len(urls)]


def _reset_body(options: dict[str, Any] | None, tasks: list[Any] | None, rng: Any, seed: int | None
                ) -> dict[str, Any]:
    """What a reset sends: options["task"], else one of `tasks` drawn with `rng` (as ToolEnv draws), else no task:
    the seed alone, which the server's env takes as `reset(seed=...)` does in process."""
    task = (options or {}).get("task")
    if task is None and tasks:
        task = tasks[int(rng.integers(len(tasks)))]
    if task is None:
        return {"task": None, "seed": seed}
    return {"task": task.to_dict() if hasattr(task, "to_dict") else dict(task), "seed": seed}


def _create_body(env_kwargs: dict[str, Any], env_id: str | None) -> dict[str, Any]:
    """What opening a session sends: the env's keywords (e.g. harness="text") and, for a FAMILY:* server, its id."""
    return {"kwargs": env_kwargs, **({"env": env_id} if env_id else {})}


def _unreachable(url: str, path: str, e: httpx.TransportError) -> RemoteEnvError:
    detail = str(e) if isinstance(e, RetriesExhausted) else f"{path}: {type(e).__name__}: {e}"
    return RemoteEnvError(f"env server {url} unreachable: {detail}")


def _answer(url: str, path: str, resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text[:300]
        raise RemoteEnvError(f"env server {url}{path} answered {resp.status_code}: {detail}", resp.status_code,
                             str(detail))
    return resp.json()


def _at_capacity(error: Exception) -> bool:
    return isinstance(error, RemoteEnvError) and error.status == 429


class RemoteEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                 tasks: Sequence[Any] | None = None, env_id: str | None = None, **env_kwargs: Any):
        self.url = _pick_url(url, "RemoteEnv")
        self.tasks = list(tasks) if tasks is not None else None
        self.create_body = _create_body(env_kwargs, env_id)
        self.retries, self.backoff_s = retries, backoff_s
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self.session_id: str | None = None
        self._seq = 0  # the number of the last step sent in this session
        self.gate, self.abandoned = SessionGate.of(self.url), threading.Event()
        self.observation_space = TextSpace(max_length=1 << 20)
        self.action_space = TextSpace(max_length=MAX_ACTION_CHARS)  # what the server takes: a longer one is a 422

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = send_with_retries(lambda: self._http.request(method, path, json=body), kind="env",
                                     what=f"{method} {path}", retries=self.retries, backoff_s=self.backoff_s)
        except httpx.TransportError as e:
            raise _unreachable(self.url, path, e) from e
        return _answer(self.url, path, resp)

    def open(self) -> None:
        """Build the env on the server (a session) now, so that bad env arguments are said before any episode;
        a reset does it otherwise. A server at its session limit (429) is waited for (`envs.sessions`)."""
        if self.session_id is None:
            try:
                self.session_id = open_session(
                    self.gate, lambda: self._call("POST", "/sessions", self.create_body)["session_id"],
                    _at_capacity, time.monotonic() + SESSION_WAIT_S, self.abandoned)
            except SessionsBusy as e:
                raise RemoteEnvError(str(e), 429) from None

    def _end_session(self) -> None:
        if self.session_id is not None:
            try:
                self._http.delete(f"/sessions/{self.session_id}")
            except httpx.HTTPError:
                pass  # the server may be gone; its reaper closes the session
            self.session_id = None
            self.gate.release()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        body = _reset_body(options, self.tasks, self.np_random, seed)
        self.open()
        out = self._call("POST", f"/sessions/{self.session_id}/reset", body)
        return out["observation"], out["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise RuntimeError("call reset() before step()")
        self._seq += 1
        out = self._call("POST", f"/sessions/{self.session_id}/step", {"action": action, "seq": self._seq})
        if (out["terminated"] or out["truncated"]) and self.gate.waiting:  # others wait for a session: free ours
            self._end_session()
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out["info"]

    def close(self) -> None:
        self.abandoned.set()
        self._end_session()
        self._http.close()


class AsyncRemoteEnv:
    """The same protocol for asyncio code: `await env.reset(options={"task": t})`, `await env.step(a)`,
    `await env.aclose()`. Not a gymnasium.Env (gymnasium's API is synchronous)."""

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                 tasks: Sequence[Any] | None = None, env_id: str | None = None, **env_kwargs: Any):
        self.url = _pick_url(url, "AsyncRemoteEnv")
        self.tasks = list(tasks) if tasks is not None else None
        self.create_body = _create_body(env_kwargs, env_id)
        self.retries, self.backoff_s = retries, backoff_s
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)
        self.session_id: str | None = None
        self._seq = 0
        self.np_random, _ = seeding.np_random()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = await asend_with_retries(lambda: self._http.request(method, path, json=body), kind="env",
                                            what=f"{method} {path}", retries=self.retries, backoff_s=self.backoff_s)
        except httpx.TransportError as e:
            raise _unreachable(self.url, path, e) from e
        return _answer(self.url, path, resp)

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        body = _reset_body(options, self.tasks, self.np_random, seed)
        if self.session_id is None:
            self.session_id = (await self._call("POST", "/sessions", self.create_body))["session_id"]
        out = await self._call("POST", f"/sessions/{self.session_id}/reset", body)
        return out["observation"], out["info"]

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise RuntimeError("call reset() before step()")
        self._seq += 1
        out = await self._call("POST", f"/sessions/{self.session_id}/step", {"action": action, "seq": self._seq})
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out["info"]

    async def aclose(self) -> None:
        if self.session_id is not None:
            try:
                await self._http.delete(f"/sessions/{self.session_id}")
            except httpx.HTTPError:
                pass
            self.session_id = None
        await self._http.aclose()
