"""One process owns a run directory at a time (`sleuth eval --out`, `sleuth train --out`, `sleuth sft --out`).

The lock is an advisory `fcntl.flock` on `DIR/.lock`: the kernel drops it when its process ends in any way
(exit, crash, SIGKILL), so a dead run never leaves a directory stuck, and a second process started on the
same directory is refused at once with who holds it. It imports nothing of sleuth, so every layer may use it."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from sleuth.core.errors import BadInput

LOCK_FILE = ".lock"


class RunDirBusyError(BadInput):
    """Another live process owns the run directory."""


class RunDirLock:
    """Held from `acquire` until `release` (or the process ends); re-entrant per process and directory, so
    code that owns a directory may call a helper that takes it again."""

    _held: dict[Path, tuple[int, int]] = {}  # directory → (fd, depth), per process

    def __init__(self, directory: str | Path):
        self.dir = Path(directory).absolute()

    def acquire(self) -> RunDirLock:
        if self.dir in self._held:
            fd, depth = self._held[self.dir]
            self._held[self.dir] = (fd, depth + 1)
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(encoding="utf-8", errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirBusyError(f"{self.dir} is in use by {holder}: wait for it to finish, stop it, "
                                  "or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._held[self.dir] = (fd, 1)
        return self

    def release(self) -> None:
        fd, depth = self._held.get(self.dir, (-1, 0))
        if depth > 1:
            self._held[self.dir] = (fd, depth - 1)
        elif depth == 1:
            del self._held[self.dir]
            os.close(fd)  # closing the descriptor drops the flock; the file stays (unlinking it would race)

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
