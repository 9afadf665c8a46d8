"""`RemoteEnv` (and `AsyncRemoteEnv`): a gymnasium.Env whose episodes run on an env server (`sleuth serve env`), so envs too
heavy for the trainer's machine run elsewhere. `url` may list several servers (comma-separated): each
RemoteEnv takes the next one, round robin, so the agent loop spreads its episodes over them.

Faults: requests time out (never a hang) and a dead or failing server raises `RemoteEnvError`, which the
agent loop turns into a truncated trajectory with the reason recorded. Opening a session is retried (it is
idempotent); a step is not (it may have happened)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import gymnasium
import httpx

from sleuth.envs.base import TextSpace

_next_server = itertools.count()
_lock = threading.Lock()


class RemoteEnvError(RuntimeError):
    pass


class RemoteEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2, **env_kwargs: Any):
        urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not urls:
            raise ValueError("RemoteEnv needs a server url")
        with _lock:
            self.url = urls[next(_next_server) % len(urls)]
        self.env_kwargs = env_kwargs  # e.g. harness="text": built on the server
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self.session_id: str | None = None
        self.observation_space = TextSpace(max_length=1 << 20)
        self.action_space = TextSpace(max_length=1 << 20)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, retry: bool = False) -> dict[str, Any]:
        attempts = self.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                resp = self._http.request(method, path, json=body)
            except httpx.TransportError as e:
                if attempt + 1 < attempts:
                    time.sleep(0.2 * 2**attempt)
                    continue
                raise RemoteEnvError(f"env server {self.url} unreachable: {type(e).__name__}: {e}") from e
            if resp.status_code == 429 and attempt + 1 < attempts:
                time.sleep(0.5 * 2**attempt)
                continue
            if resp.status_code >= 400:
                try:
                    detail = resp.json().get("detail")
                except ValueError:
                    detail = resp.text[:300]
                raise RemoteEnvError(f"env server {self.url}{path} answered {resp.status_code}: {detail}")
            return resp.json()
        raise RemoteEnvError(f"env server {self.url} kept refusing {path}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            raise ValueError("RemoteEnv.reset needs options={'task': Task}")
        if self.session_id is None:
            self.session_id = self._call("POST", "/sessions", {"kwargs": self.env_kwargs}, retry=True)["session_id"]
        payload = task.to_dict() if hasattr(task, "to_dict") else dict(task)
        out = self._call("POST", f"/sessions/{self.session_id}/reset", {"task": payload, "seed": seed})
        return out["observation"], out["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise RuntimeError("call reset() before step()")
        out = self._call("POST", f"/sessions/{self.session_id}/step", {"action": action})
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out["info"]

    def close(self) -> None:
        if self.session_id is not None:
            try:
                self._http.delete(f"/sessions/{self.session_id}")
            except httpx.HTTPError:
                pass  # the server may be gone; its reaper closes the session
            self.session_id = None
        self._http.close()


class AsyncRemoteEnv:
    """The same protocol for asyncio code: `await env.reset(options={"task": t})`, `await env.step(a)`,
    `await env.aclose()`. Not a gymnasium.Env (gymnasium's API is synchronous)."""

    def __init__(self, url: str, timeout: float = 60.0, **env_kwargs: Any):
        urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not urls:
            raise ValueError("AsyncRemoteEnv needs a server url")
        with _lock:
            self.url = urls[next(_next_server) % len(urls)]
        self.env_kwargs = env_kwargs
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)
        self.session_id: str | None = None

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = await self._http.request(method, path, json=body)
        except httpx.TransportError as e:
            raise RemoteEnvError(f"env server {self.url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise RemoteEnvError(f"env server {self.url}{path} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task = (options or {}).get("task")
        if task is None:
            raise ValueError("AsyncRemoteEnv.reset needs options={'task': Task}")
        if self.session_id is None:
            self.session_id = (await self._call("POST", "/sessions", {"kwargs": self.env_kwargs}))["session_id"]
        payload = task.to_dict() if hasattr(task, "to_dict") else dict(task)
        out = await self._call("POST", f"/sessions/{self.session_id}/reset", {"task": payload, "seed": seed})
        return out["observation"], out["info"]

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise RuntimeError("call reset() before step()")
        out = await self._call("POST", f"/sessions/{self.session_id}/step", {"action": action})
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out["info"]

    async def aclose(self) -> None:
        if self.session_id is not None:
            try:
                await self._http.delete(f"/sessions/{self.session_id}")
            except httpx.HTTPError:
                pass
            self.session_id = None
        await self._http.aclose()
