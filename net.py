"""Networking that every layer may use (it imports nothing of sleuth): a free local port (torch.distributed's
rendezvous, a server), waiting until a server answers `/health`, a request-body limit for sleuth's ASGI
servers, and running those servers (retrieval, verifier, env) in a background thread or as a `sleuth serve`
subprocess (the tests, benchmarks and notebooks do)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    """Poll `url/health` every 50 ms with one client (a fresh connection per poll costs a core's share)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1) as client:
        while time.monotonic() < deadline:
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
