"""SWE tasks: records in SWE-bench's field layout, either synthesised here from PyPI packages (`tasks/swe_sets/`,
built by `sleuth tasks build-swe`) or the official SWE-bench Lite instances (`swebench_lite:test`).

`swe:toolz-1.2.0` loads a shipped set, `swe:all` every shipped set, `swe:PATH` a file of records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sleuth.tasks.base import Task

SHIPPED = Path(__file__).with_name("swe_sets")


def swe_task(rec: dict[str, Any], split: str = "") -> Task:
    """The problem statement is the question and the gold patch the answer; the payload is the record
    itself (what the env and the verifier read), less those two."""
    for key in ("instance_id", "problem_statement", "FAIL_TO_PASS"):
        if key not in rec:
            raise ValueError(f"not a SWE task record: no {key!r} field")
    payload = {k: v for k, v in rec.items() if k not in ("problem_statement", "patch")}
    package = rec["sdist"]["name"] if isinstance(rec.get("sdist"), dict) else rec.get("repo", "")
    payload["package"] = package
    return Task(id=rec["instance_id"], question=rec["problem_statement"], answer=rec.get("patch", ""),
                payload=payload, split=split, source=f"swe/{package}")


def _read(path: Path, split: str) -> list[Task]:
    with open(path, encoding="utf-8") as f:
        return [swe_task(json.loads(line), split) for line in f if line.strip()]


def shipped_sets() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.jsonl"))


def load_swe(spec: str = "all") -> list[Task]:
    """`all`, a shipped set's name (e.g. toolz-1.2.0), or a path to a JSONL of records."""
    path = Path(spec)
    if path.suffix == ".jsonl" or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"task file not found: {path}")
        return _read(path, path.stem)
    names = shipped_sets() if spec in ("", "all") else [spec]
    unknown = [n for n in names if not (SHIPPED / f"{n}.jsonl").is_file()]
    if unknown:
        raise FileNotFoundError(f"no shipped SWE task set {unknown[0]!r}; shipped: {', '.join(shipped_sets())} "
                                "(or give a path to records built with `sleuth tasks build-swe`)")
    return [t for n in names for t in _read(SHIPPED / f"{n}.jsonl", n)]


def load_swebench(path: Path, split: str = "test") -> list[Task]:
    """Official SWE-bench (Lite) instances; they score only through the Docker backend."""
    return _read(Path(path), split)
