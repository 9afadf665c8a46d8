"""Argument helpers shared by the `sleuth` subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def fail(message: str) -> int:
    """Say what went wrong on stderr, in one line; the exit status of a refused command."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def command(sub: argparse._SubParsersAction, name: str, fn: Callable[[argparse.Namespace], int], help: str,
            example: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The one way a subcommand is made: its parser, the function it runs, and a runnable example at the end of its
    `--help` (a test parses every example). Each `cli/` module adds its commands with this in its `register(sub)`."""
    parser = sub.add_parser(name, help=help, epilog=f"example:\n  {example}",
                            formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    parser.set_defaults(fn=fn)
    return parser


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable subcommand's parser by its words ("serve tinker")."""
    out = {}
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found = subcommands(sub, f"{prefix}{name} ")
                out.update(found or {f"{prefix}{name}": sub})
    return out
