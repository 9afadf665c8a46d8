"""Argument helpers shared by the `sleuth` subcommands."""

from __future__ import annotations

import sys
from typing import Any


def parse_kv(items: list[str], flag: str = "--env-arg") -> dict[str, Any]:
    """`KEY=VALUE` pairs, each value read as YAML (`3` is an int, `{a: 1}` a mapping)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"error: {flag} wants KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def fail(message: str) -> int:
    """Say what went wrong on stderr, in one line; the exit status of a refused command."""
    print(f"error: {message}", file=sys.stderr)
    return 2
