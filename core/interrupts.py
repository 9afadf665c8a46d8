"""SIGTERM is handled as SIGINT (Ctrl-C) is: schedulers (SLURM, Kubernetes) send it before they preempt a job, and
a process that dies of it at once skips every `finally`, leaving its env servers, Ray and vLLM servers behind and
its results unflushed. `sleuth` raises it as `Terminated`, a `KeyboardInterrupt`, so the one path Ctrl-C takes
runs for both: cleanups run, and the command exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

A training loop (`sleuth train`, `sleuth sft`) holds the first interruption until its step in flight has
finished (`HoldUntilStepEnd`): it then writes a checkpoint of that step and raises it, so `--resume` continues
exactly. A second signal raises at once, abandoning the step in flight (the last checkpoint stays)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# What `sleuth COMMAND --help` says about a signal (docs/scale.md, "What happens when")
ON_SIGNAL = {
    "train": "SIGTERM (a scheduler's preemption) or Ctrl-C: the step in flight finishes and is checkpointed, the "
             "processes the run started are stopped, and the command exits 143 (SIGTERM) or 130 (Ctrl-C); --resume "
             "continues exactly. A second signal stops at once (the last checkpoint stays).",
    "eval": "SIGTERM (a scheduler's preemption) or Ctrl-C: the episodes in flight are dropped, the finished ones are "
            "kept in --out, the processes eval started are stopped, and it exits 143 (SIGTERM) or 130 (Ctrl-C); the "
            "same command resumes without running them again.",
}
ON_SIGNAL["sft"] = ON_SIGNAL["train"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT raises `KeyboardInterrupt`, so every cleanup Ctrl-C runs runs for it too."""


def interruption(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def exit_code(e: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process its signal ended."""
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


def _raise(signum: int, frame: FrameType | None) -> None:
    raise interruption(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # only it may set signal handlers


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` in the main thread (a SIGTERM ignored by the parent stays
    ignored); the previous handler comes back after, so an in-process caller (a test) keeps its own."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class HoldUntilStepEnd:
    """Within it, the first SIGINT or SIGTERM is held (`signum`) for the training loop to act on at its next step
    boundary (`stop_now`); a second one raises at once. A signal the process ignores stays ignored."""

    def __init__(self, what: str = "the step in flight"):
        self.what = what
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> HoldUntilStepEnd:
        if _in_main_thread():
            for s in SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self.previous[s] = signal.signal(s, self._hold)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise interruption(signum)
        self.signum = signum
        # os.write: a print here could land inside another print of the main thread (a reentrant call)
        os.write(2, f"\n{signal.Signals(signum).name}: stopping once {self.what} has finished and is checkpointed "
                    "(send it again to stop at once, keeping the last checkpoint)\n".encode())

    def stop_now(self, reduce_max: Callable[[float], float]) -> bool:
        """Whether any rank holds a signal (`reduce_max`: the max over the run's ranks, so every rank decides
        alike)."""
        return reduce_max(float(self.signum is not None)) > 0

    def wait(self, seconds: float, reduce_max: Callable[[float], float]) -> bool:
        """Sleep `seconds`, less once a signal is held (a sleep goes on after a handler returns); then `stop_now`."""
        end = time.monotonic() + seconds
        while self.signum is None and time.monotonic() < end:
            time.sleep(min(0.1, max(end - time.monotonic(), 0.0)))
        return self.stop_now(reduce_max)

    def interruption(self) -> KeyboardInterrupt:
        """What to raise once the loop has checkpointed (a rank that got no signal itself raises SIGTERM's)."""
        return interruption(self.signum if self.signum is not None else signal.SIGTERM)
