"""`sleuth serve NAME`: every server of `servers/catalog.py`, each with `--host`, `--port` and its own flags, built
and run one way (`servers.base`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from sleuth.cli.args import command
from sleuth.core.args import bounded

if TYPE_CHECKING:
    from sleuth.servers.base import ServerSpec


def register(sub: argparse._SubParsersAction) -> None:
    import sleuth.servers.catalog  # noqa: F401  (registers sleuth's servers)
    from sleuth.servers.base import SERVERS

    group = sub.add_parser("serve", help="run a server").add_subparsers(dest="serve_command", required=True)
    for name in SERVERS.names():
        spec = SERVERS.get(name)
        p = command(group, name, _serve(spec), spec.help, spec.example)
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=bounded(int, 0), default=spec.port)
        spec.add_arguments(p)


def _serve(spec: ServerSpec) -> Callable[[argparse.Namespace], int]:
    def cmd(args: argparse.Namespace) -> int:
        from sleuth.servers.base import run

        run(spec.start(args), args.host, args.port)
        return 0

    return cmd
