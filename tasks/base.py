"""`Task`: one unit of data an environment is reset with. Pure data; runs nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput


class TaskError(BadInput):
    """A task whose fields have the wrong types."""


@dataclass
class Task:
    """A question (or problem) with its gold answer and whatever the env needs to build the episode.

    `payload` holds data-set specific material (documents, tests, repository state); `answer` is the
    canonical gold answer and `aliases` any other accepted answers.
    """

    id: str
    question: str
    answer: str = ""
    aliases: list[str] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)
    split: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        """Bad task data is refused here, naming the field, instead of failing later inside a verifier."""
        if isinstance(self.id, int) and not isinstance(self.id, bool):
            self.id = str(self.id)  # numeric ids (MBPP's task_id) are ids all the same
        for name in ("id", "question", "answer", "split", "source"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TaskError(f"task field {name!r} must be a string, got {type(value).__name__} {value!r:.60}")
        if not isinstance(self.aliases, list) or not all(isinstance(a, str) for a in self.aliases):
            raise TaskError(f"task field 'aliases' must be a list of strings, got {self.aliases!r:.80}")
        if not isinstance(self.payload, dict):
            raise TaskError(f"task field 'payload' must be a mapping, got {type(self.payload).__name__}")

    @property
    def answers(self) -> list[str]:
        """Every accepted answer, the canonical one first."""
        return [self.answer, *[a for a in self.aliases if a != self.answer]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        if not isinstance(d, dict):
            raise TaskError(f"a task must be a JSON object, got {type(d).__name__}")
        if "id" not in d or "question" not in d:
            raise TaskError(f"a task needs 'id' and 'question'; got fields {sorted(d)}")
        known = {k: d[k] for k in TASK_FIELDS if k in d}
        return cls(**known)


TASK_FIELDS = frozenset(f.name for f in fields(Task))


def normalise_question(text: str) -> str:
    """A question as held-out checks compare them: lower-cased, punctuation and spacing collapsed."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def write_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")


def read_tasks(path: str | Path) -> Iterator[Task]:
    """The tasks of a Task JSONL file; a broken line or a bad field names the file and the record."""
    from sleuth.tasks.records import read_jsonl

    for i, record in enumerate(read_jsonl(path)):
        try:
            task = Task.from_dict(record)
        except TaskError as e:
            raise TaskError(f"{path} record {i + 1}: {e}") from None
        extra = sorted(set(record) - TASK_FIELDS)
        if extra:  # a data set's own layout read as Tasks would lose those fields (documents, labels) silently
            raise TaskError(f"{path} record {i + 1} has fields a Task does not ({', '.join(extra[:6])}): a Task "
                            f"JSONL holds {', '.join(sorted(TASK_FIELDS))}; for a file in a data set's own layout "
                            f"name the source, e.g. hotpotqa:{path}")
        yield task


def tasks_to_dataset(tasks: Iterable[Task]):
    """A `datasets.Dataset` with one row per task; `payload` is stored as a JSON string so that
    heterogeneous payloads never fight Arrow's schema inference."""
    import datasets

    rows = [{**t.to_dict(), "payload": json.dumps(t.payload, ensure_ascii=False)} for t in tasks]
    return datasets.Dataset.from_list(rows)


def dataset_to_tasks(ds) -> list[Task]:
    """Inverse of `tasks_to_dataset`."""
    out = []
    for row in ds:
        payload = row.get("payload") or {}
        if isinstance(payload, str):
            payload = json.loads(payload)
        out.append(Task.from_dict({**row, "payload": payload}))
    return out
