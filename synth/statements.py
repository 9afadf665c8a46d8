"""Problem statements for synthesised SWE tasks, written from the failing behaviour only: the failing
tests' names, the assertion or exception message, and the test-side lines of the traceback. Library
frames are left out (they would point at the mutated line), and `leaks` checks that neither the buggy
nor the fixed line appears anywhere in the text."""

from __future__ import annotations

import re
from typing import Any

from sleuth.verifiers.swe import is_test_path

MAX_LISTED = 10
MAX_SHOWN = 2


def problem_statement(name: str, version: str, failing: list[str], failures: dict[str, dict[str, Any]]) -> str:
    n = len(failing)
    listed = "\n".join(f"- `{t}`" for t in failing[:MAX_LISTED])
    if n > MAX_LISTED:
        listed += f"\n- … and {n - MAX_LISTED} more"
    parts = [f"{n} test{'s' if n != 1 else ''} of {name} {version}'s own test suite "
             f"{'fail' if n != 1 else 'fails'} with the current code:\n\n{listed}"]
    for test in failing[:MAX_SHOWN]:
        excerpt = failure_excerpt(failures.get(test, {}))
        if excerpt:
            parts.append(f"`pytest {test}` reports:\n\n```\n{excerpt}\n```")
    parts.append("The tests are right and the library code is wrong. Find the bug and fix it so that these "
                 "tests pass without breaking the other tests.")
    return "\n\n".join(parts)


def failure_excerpt(failure: dict[str, Any], max_lines: int = 14) -> str:
    """Test-side traceback lines and the error message of one failure."""
    lines: list[str] = []
    for frame in failure.get("frames", []):
        path = str(frame.get("path", ""))
        if not path or not is_test_path(path):
            continue
        lines.append(f"{path}:{frame.get('lineno', '?')}: {frame.get('where', '')}".rstrip(": "))
        lines.extend(x for x in frame.get("lines", []) if not x.lstrip().startswith("E "))
    message = str(failure.get("message", "")).strip()
    if message:
        msg_lines = message.splitlines()[:6]
        lines.extend(f"E   {x}" for x in msg_lines)
    return normalise("\n".join(lines[-max_lines:]))


def normalise(text: str) -> str:
    """Drop what differs between runs (object addresses) and the sandbox's mount point."""
    return re.sub(r"\b0x[0-9a-fA-F]{6,}\b", "0x…", text.replace("/work/repo/", ""))


def leaks(statement: str, code_lines: list[str]) -> bool:
    """Does the statement quote any of the given source lines (stripped, ignoring trivial ones)?"""
    for line in code_lines:
        s = line.strip()
        if len(s) >= 8 and s in statement:
            return True
    return False
