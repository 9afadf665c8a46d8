"""Command-line values every `sleuth` entry point reads alike (`cli/` and the servers' flags): `KEY=VALUE` pairs
read as YAML, numbers with a floor, and a run directory that can be written."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput


def parse_kv(items: list[str], flag: str = "--env-arg") -> dict[str, Any]:
    """`KEY=VALUE` pairs, each value read as YAML (`3` is an int, `{a: 1}` a mapping)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise BadInput(f"{flag} wants KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise BadInput(f"{flag} {key}: the value {value!r} is not valid YAML "
                           f"({str(e).splitlines()[0]})") from None
    return out


def bounded(kind: Callable[[str], Any], low: float, name: str = "") -> Callable[[str], Any]:
    """An argparse `type` that also refuses values below `low` (a zero concurrency would hang, a negative
    limit would silently drop tasks from the end)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not value >= low:  # also refuses NaN
            raise argparse.ArgumentTypeError(f"must be ≥ {low:g}, got {text}")
        return value

    parse.__name__ = name or kind.__name__
    return parse


def output_dir(text: str) -> str:
    """An argparse `type` for a run directory: not empty, not an existing file."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a directory (got an empty string)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    # an unwritable place fails here, before any work (nothing is created yet)
    parent = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot create {text}: {parent} is not a writable directory")
    return text
