"""The one root of the failures sleuth foresees, in three branches, each with the exit status the `sleuth` command
ends with (`cli.main` catches the root; a failure it does not foresee exits 1 with its type named).

- `BadInput` (exit 2): what the user gave is wrong (a config key, a file, a name, a run directory another
  process owns); the message says what to change. Also a `ValueError`, so code that validates input catches it.
- `InfraFailure` (exit 75, sysexits' EX_TEMPFAIL: a scheduler may requeue): a server, a worker, a sandbox or the
  network failed; never scored as an answer; the same command run again may succeed. Also a `RuntimeError`.
- `TrainingError` (exit 1): a run that cannot go on (every episode of a step failed, no complete checkpoint);
  the checkpoints so far stay. Also a `RuntimeError`.
"""

from __future__ import annotations


class SleuthError(Exception):
    """A failure sleuth foresees: its message is one line that says what to do."""

    exit_code = 1


class BadInput(SleuthError, ValueError):
    """The user's input (config, file, name, argument) is wrong."""

    exit_code = 2


class ConfigError(BadInput):
    """A config (a YAML file, a `--set` override, a judge file) that cannot be run as written."""


class InfraFailure(SleuthError, RuntimeError):
    """Infrastructure failed (a server, worker, sandbox, network): retry, never score."""

    exit_code = 75


class TrainingError(SleuthError, RuntimeError):
    """A training run that cannot go on; its checkpoints so far stay."""

    exit_code = 1


def one_line(text: str, width: int | None = None) -> str:
    """The first line of an error's text, cut at `width` characters (an episode's error may hold a whole body)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if width is None or len(line) <= width else line[:width - 1] + "…"
