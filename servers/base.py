"""One way to start, stop and health-check a server: each is a `ServerSpec` in `SERVERS` (`servers/catalog.py`: its
name under `sleuth serve`, its flags, and the `build` in its module that makes what it serves); `run` serves it
on uvicorn and releases what it holds when it stops; every server answers `GET /health` (a test starts each and
asks). Tests and notebooks start the same apps in a thread with `sleuth.core.net.in_thread`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sleuth.core.errors import BadInput
from sleuth.core.registry import Registry


@dataclass
class Server:
    """What one `sleuth serve` command serves: an ASGI app that answers `GET /health`, the line printed once it
    listens, and what to release when it stops (a vLLM sampler, Ray workers)."""

    app: Any
    banner: str
    close: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class ServerSpec:
    """A server under `sleuth serve NAME`: `add_arguments` adds its own flags (beside `--host` and `--port`);
    `build` ("module:function", imported when the server starts, so a server's dependencies load only for it) makes
    the `Server` from them before the port opens, raising `BadInput` for what cannot be served."""

    name: str
    help: str
    example: str
    port: int
    add_arguments: Callable[[argparse.ArgumentParser], None]
    build: str

    def start(self, args: argparse.Namespace) -> Server:
        from sleuth.core.registry import import_target

        try:
            build = import_target(self.build)
        except ImportError as e:  # an extra the server needs (openenv-core, the tinker SDK's types) is missing
            raise BadInput(f"sleuth serve {self.name} needs a package that is not installed ({e}); "
                           f"install its extra, e.g. pip install 'sleuth[{self.name}]'") from None
        return build(args)


SERVERS: Registry[ServerSpec] = Registry("server", group="sleuth.servers")


def run(server: Server, host: str, port: int) -> None:
    """Serve until interrupted, then release what the server holds."""
    import uvicorn

    print(server.banner.format(url=f"http://{host}:{port}"), flush=True)
    try:
        uvicorn.run(server.app, host=host, port=port, log_level="warning")
    finally:
        server.close()
