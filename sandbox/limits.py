"""What a sandboxed run may use, and what came of it."""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall-clock timeout; the whole sandbox is killed after it
    cpu_s: int = 10  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL)
    memory_mb: int = 1024  # RLIMIT_AS per process
    processes: int = 32  # RLIMIT_NPROC of the run's own unprivileged uid
    file_mb: int = 16  # RLIMIT_FSIZE: largest file (stdout and stderr included) a run may write
    open_files: int = 256  # RLIMIT_NOFILE
    output_bytes: int = 16_000  # stdout / stderr kept per stream; the rest is cut with a marker


@dataclass
class RunResult:
    """`status`: ok | error (non-zero exit) | timeout | cpu | memory | output_limit | killed."""

    status: str
    exit_code: int | None
    signal: str | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: str  # "bwrap" or "rlimits" (no namespaces: say so wherever results are reported)
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # what `collect` asked for, as written

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = sorted(self.files)  # names only: contents may be binary
        return d


def classify(exit_code: int | None, timed_out: bool, stderr: str) -> tuple[str, str | None]:
    """Map an exit to (status, signal name). bwrap reports a child killed by signal N as exit 128 + N."""
    if timed_out:
        return "timeout", "SIGKILL"
    sig = None
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
    elif exit_code is not None and exit_code > 128 and exit_code - 128 in signal.Signals._value2member_map_:
        sig = exit_code - 128
    name = signal.Signals(sig).name if sig else None
    if "MemoryError" in stderr[-2000:]:
        return "memory", name
    if sig == signal.SIGXCPU:
        return "cpu", name
    if sig == signal.SIGXFSZ or "File too large" in stderr[-2000:]:  # Python ignores SIGXFSZ: EFBIG
        return "output_limit", name
    if sig is not None:
        return "killed", name
    return ("ok" if exit_code == 0 else "error"), None
