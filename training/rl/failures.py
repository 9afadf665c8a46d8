"""When infrastructure failures stop a training run: a step whose every episode failed on every rank (once the
trainer's `rollout.outage_retries` of it failed alike), or `rollout.max_consecutive_failures` failures in a row on a
rank (completion order, across steps; the episodes of an outage's retried attempts are not counted). The decision is
the same on every rank (collectives), and it says in one line what failed last and to `--resume`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import TrainingError
from sleuth.training.rl.update import all_max, all_sum

RESUME = "fix the cause, then rerun with --resume to continue from the last checkpoint"


class EpisodesFailedError(TrainingError):
    """Every episode of a step failed for infrastructure reasons, or `rollout.max_consecutive_failures` of them
    failed in a row: the run stops rather than train on what is left."""


class FailureWatch:
    def __init__(self, max_consecutive: int):
        self.limit = max_consecutive  # 0: never stop for a streak
        self.streak = 0  # failures in a row on this rank (a resumed run counts afresh)
        self.last: tuple[str, str] = ("", "")  # the last failure's stop reason and first line

    def check(self, step: int, seen: Sequence[Trajectory]) -> None:
        """Count the step's episodes (in the order they came back); raise `EpisodesFailedError` to stop."""
        for t in seen:
            self.streak = self.streak + 1 if t.failed else 0
            if t.failed:
                self.last = (t.stop_reason, _first_line(t.error))
        if self.limit and all_max(float(self.streak)) >= self.limit:
            last = next((x for x in _gather(self.last if self.streak >= self.limit else None) if x), ("", ""))
            raise EpisodesFailedError(f"step {step}: {self.limit} episodes in a row failed for infrastructure "
                                      f"reasons (rollout.max_consecutive_failures; the last: {last[0]}: {last[1]}); "
                                      f"{RESUME}")
        if self.all_failed(seen):
            reason, line = self.first_failure(seen)
            raise EpisodesFailedError(f"step {step}: all {int(all_sum(len(seen)))} episodes failed, nothing to train "
                                      f"on (the first: {reason}: {line}); {RESUME}")

    def all_failed(self, seen: Sequence[Trajectory]) -> bool:
        """Whether every episode of the step failed on every rank (and there were some): an outage, not the policy."""
        return all_sum(sum(not t.failed for t in seen)) == 0 and all_sum(len(seen)) > 0

    def first_failure(self, seen: Sequence[Trajectory]) -> tuple[str, str]:
        """The stop reason and first line of the first failed episode of the lowest rank that has one (collective)."""
        failed = [t for t in seen if t.failed]
        return next((x for x in _gather((failed[0].stop_reason, _first_line(failed[0].error)) if failed else None)
                     if x), ("", ""))


def _first_line(error: str | None) -> str:
    return (str(error or "").strip().splitlines() or [""])[0]


def _gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
