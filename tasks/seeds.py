"""`seeds:A-B`: the tasks of an env that makes its own episodes (reasoning-gym, GEM, TextArena, OpenEnv envs):
one task per episode seed, no data file. `seeds:test`, `seeds:dev` and `seeds:train` are three disjoint ranges,
so an evaluation on the default seeds and a training run on the default ones never share an episode (the
held-out check compares task ids, `seed-N`)."""

from __future__ import annotations

import re

from sleuth.tasks.base import Task

# Named ranges, half-open: evaluation from 0 (`--limit 3` plays seeds 0, 1, 2), training far above it.
SEED_SPLITS: dict[str, range] = {
    "test": range(0, 10_000),
    "dev": range(500_000, 510_000),
    "train": range(1_000_000, 1_010_000),
}
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def seed_range(split: str) -> range:
    """`test` / `dev` / `train`, `A-B` (both ends included) or a single seed `A`."""
    if split in SEED_SPLITS:
        return SEED_SPLITS[split]
    m = _RANGE.match(split.strip())
    if not m:
        raise ValueError(f"seeds:{split} is neither a seed range A-B (e.g. seeds:0-99) nor one of "
                         f"{', '.join(f'seeds:{s}' for s in SEED_SPLITS)}")
    low, high = int(m[1]), int(m[2] if m[2] is not None else m[1])
    if high < low:
        raise ValueError(f"seeds:{split}: the range ends before it starts")
    return range(low, high + 1)


def seed_task(seed: int, split: str = "") -> Task:
    """The task of episode `seed`: no question or answer of its own (the env makes them from the seed)."""
    return Task(id=f"seed-{seed}", question="", payload={"seed": seed}, split=split, source="seeds")


def load_seeds(path: object, split: str) -> list[Task]:
    """The `seeds` task source's loader (`load_tasks("seeds:0-9")`); `path` is unused (no files)."""
    return [seed_task(s, split) for s in seed_range(split)]


def task_seed(task: Task) -> int:
    """The episode seed a task names: a `seeds:` task's own, else one derived from its id (stable across runs),
    so a task file of plain ids also plays fixed episodes."""
    seed = task.payload.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    import zlib

    return zlib.crc32(task.id.encode("utf-8"))
