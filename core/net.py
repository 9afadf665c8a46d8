"""Networking that every layer may use (it imports nothing of sleuth): a free local port (torch.distributed's
rendezvous, a server), waiting until a server answers `/health`, retries with backoff for transient HTTP
failures (counted per kind of server), a request-body limit for sleuth's ASGI servers, and running those
servers (retrieval, verifier, env) in a background thread or as a `sleuth serve` subprocess (the tests,
benchmarks and notebooks do)."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

import httpx

from sleuth.core.errors import InfraFailure

log = logging.getLogger(__name__)

# The kinds of server whose retries are counted: env servers, rollout (inference) servers, verifier servers,
# retrieval servers, teachers; and sessions an env server refused at capacity (waited for, then retried).
RETRY_KINDS = ("env", "rollout", "verifier", "retrieval", "teacher", "env_session")
# Answers that say "not now" rather than "no": rate limited, or a proxy / server briefly unable to answer.
RETRY_STATUS = frozenset({429, 502, 503, 504})
# Failures of the connection, not of the request: refused, reset, closed before an answer, timed out.
# (httpx.UnsupportedProtocol and ProxyError are TransportErrors too, but retrying cannot fix them.)
TRANSIENT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
MAX_DELAY_S = 30.0  # the longest single wait, Retry-After included: a retry loop stays bounded in time

_retries = dict.fromkeys(RETRY_KINDS, 0)
_retries_lock = threading.Lock()


class RetriesExhausted(httpx.TransportError, InfraFailure):
    """A transient failure that lasted through every retry. An httpx.TransportError, so code that catches
    those keeps working; the message names what was sent, the last error and the number of tries."""

    def __init__(self, what: str, tries: int, last: Exception):
        super().__init__(f"{what}: {type(last).__name__}: {last or 'no detail'} (gave up after {tries} tries)")
        self.tries, self.last = tries, last


def retry_counts() -> dict[str, int]:
    """Retries made so far in this process, per kind of server (every kind of RETRY_KINDS, 0 if none)."""
    with _retries_lock:
        return dict(_retries)


def count_retry(kind: str) -> None:
    """Count one retry under `kind` made without `send_with_retries` (a request sent to another server)."""
    _check_kind(kind, 0)
    with _retries_lock:
        _retries[kind] += 1


def retry_after_s(resp: httpx.Response) -> float | None:
    """The wait a 429/503 asks for in its Retry-After header (seconds or an HTTP date), if any."""
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _delay(attempt: int, backoff_s: float, resp: httpx.Response | None) -> float:
    """Exponential backoff with jitter (half fixed, half random, so clients that failed together do not
    retry together), or the server's Retry-After; at most MAX_DELAY_S."""
    asked = retry_after_s(resp) if resp is not None else None
    if asked is not None:
        return min(asked, MAX_DELAY_S)
    base = min(backoff_s * 2**attempt, MAX_DELAY_S)
    return base / 2 + random.uniform(0, base / 2)


def _check_kind(kind: str, retries: int) -> None:
    if kind not in _retries:
        raise ValueError(f"unknown retry kind {kind!r}: one of {', '.join(RETRY_KINDS)}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")


def _retry_wait(kind: str, what: str, attempt: int, retries: int, backoff_s: float,
                resp: httpx.Response | None, error: Exception | None) -> float | None:
    """After try `attempt` (from 0) got `resp` or failed with `error`: None when `resp` is the answer to
    return, else the seconds to wait before the next try (the retry is counted). Raises RetriesExhausted
    when the last try failed to connect."""
    if error is None and resp is not None and (resp.status_code not in RETRY_STATUS or attempt == retries):
        return None
    if error is not None and attempt == retries:
        raise RetriesExhausted(what, attempt + 1, error) from error
    wait = _delay(attempt, backoff_s, resp)
    reason = f"{type(error).__name__}: {error}" if error is not None else f"answered {resp.status_code}"
    log.info("%s: %s; retry %d of %d in %.2f s", what, reason, attempt + 1, retries, wait)
    count_retry(kind)
    return wait


# Hand-written rather than tenacity or stamina: the core's only HTTP dependency is httpx, the loop is a few
# lines, and it needs Retry-After and the per-kind counter; httpx's own `HTTPTransport(retries=)` retries
# connection failures only, without backoff.
def send_with_retries(send: Callable[[], httpx.Response], *, kind: str, what: str, retries: int,
                      backoff_s: float) -> httpx.Response:
    """Call `send` (one HTTP request) until it gets an answer that is not 429/502/503/504, retrying
    connection failures and those answers up to `retries` times with backoff. Only for requests that may
    be repeated (idempotent, or made so). Each retry is counted under `kind` (see `retry_counts`).
    When retries run out: the last such answer is returned (the caller reports its status as before), and
    a last connection failure is raised as `RetriesExhausted`. `what` names the request in messages."""
    _check_kind(kind, retries)
    for attempt in range(retries + 1):
        try:
            resp, error = send(), None
        except TRANSIENT_ERRORS as e:
            resp, error = None, e
        wait = _retry_wait(kind, what, attempt, retries, backoff_s, resp, error)
        if wait is None:
            return resp
        if resp is not None:
            resp.close()
        time.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")


async def asend_with_retries(send: Callable[[], Awaitable[httpx.Response]], *, kind: str, what: str, retries: int,
                             backoff_s: float) -> httpx.Response:
    """`send_with_retries` for asyncio code: `send` returns an awaitable (an httpx.AsyncClient call)."""
    _check_kind(kind, retries)
    for attempt in range(retries + 1):
        try:
            resp, error = await send(), None
        except TRANSIENT_ERRORS as e:
            resp, error = None, e
        wait = _retry_wait(kind, what, attempt, retries, backoff_s, resp, error)
        if wait is None:
            return resp
        if resp is not None:
            await resp.aclose()
        await asyncio.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll `url/health` every 50 ms with one client (a fresh connection per poll costs a core's share).
    With `proc` (the server's process), a process that exits stops the wait at once."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server for {url} exited with status {proc.returncode} before answering")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy within {timeout_s} s")


@contextlib.contextmanager
def in_thread(app) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a daemon thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(5)


@contextlib.contextmanager
def subprocess_server(serve_args: Sequence[str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """`sleuth serve <serve_args> --port P` in its own process group; yields (url, process). The whole
    group is killed on exit."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sleuth.cli", "serve", *serve_args, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def limit_body(app, max_bytes: int) -> None:
    """Answer 413 to any request whose body is over `max_bytes`: at once when it declares its length, and
    as soon as the bytes read pass the limit when it does not (a chunked body is never read whole)."""
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    too_large = {"detail": f"request body over {max_bytes} bytes"}

    class BodyLimit:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http":
                return await self.inner(scope, receive, send)
            size = dict(scope["headers"]).get(b"content-length")
            if size is not None and (not size.isdigit() or int(size) > max_bytes):
                return await JSONResponse(too_large, status_code=413)(scope, receive, send)
            read = 0

            async def limited():
                nonlocal read
                message = await receive()
                if message["type"] == "http.request":
                    read += len(message.get("body", b""))
                    if read > max_bytes:  # the handler reading the body gets a 413, not the rest of the stream
                        raise HTTPException(413, too_large["detail"])
                return message

            return await self.inner(scope, limited, send)

    app.add_middleware(BodyLimit)
