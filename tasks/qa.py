"""QA tasks with documents: the typed document set (`QADocs`, read through `qa_docs`) and the loaders for the
multi-hop QA data sets (HotpotQA distractor, MuSiQue) into `Task`s.

A QA task's payload holds its candidate documents (`docs`: a list of {"title", "text"}) and the titles of the
gold supporting documents (`supporting`); `QADocs.to_payload` writes that layout and `qa_docs` reads it, so the
payload stays plain JSON on disk and code reads typed fields. Files are JSONL, parquet or a saved `datasets`
directory (`tasks.records`); a hub name is passed through to `load_dataset` where a hub is reachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sleuth.tasks.base import Task, TaskError


class NoDocuments(TaskError):
    """A task read as a QA task with documents has none."""


@dataclass(frozen=True)
class Document:
    """One candidate document of a QA task (a HotpotQA or MuSiQue paragraph)."""

    title: str
    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.title, str) or not isinstance(self.text, str):
            raise TypeError(f"a document's title and text are strings, got {self.title!r:.40} / {self.text!r:.40}")

    def to_dict(self) -> dict[str, str]:
        return {"title": self.title, "text": self.text}


@dataclass(frozen=True)
class QADocs:
    """A QA task's documents, in the order the task lists them, and the titles of its gold supporting ones."""

    docs: tuple[Document, ...] = ()
    supporting: tuple[str, ...] = ()

    @property
    def titles(self) -> tuple[str, ...]:
        return tuple(d.title for d in self.docs)

    def gold(self) -> list[int]:
        """The positions of the supporting documents, in list order."""
        gold = set(self.supporting)
        return [i for i, d in enumerate(self.docs) if d.title in gold]

    def to_payload(self) -> dict[str, Any]:
        """The payload keys of this layout, as plain JSON."""
        return {"docs": [d.to_dict() for d in self.docs], "supporting": list(self.supporting)}


def qa_docs(task: Task, *, missing_ok: bool = False) -> QADocs:
    """The task's document set. A task without documents raises `NoDocuments` unless `missing_ok`, which
    gives what the payload has (no documents; its gold titles if it names any: a Search task needs only those).
    A payload in another layout raises `TaskError` naming the task."""
    raw_docs, raw_gold = task.payload.get("docs"), task.payload.get("supporting") or []
    if not raw_docs and not missing_ok:
        raise NoDocuments(f"task {task.id} has no payload['docs'] (a list of {{'title', 'text'}} documents)")
    try:
        docs = tuple(Document(d["title"], d["text"]) for d in raw_docs or [])
    except (KeyError, TypeError) as e:
        raise TaskError(f"task {task.id}: payload['docs'] must be a list of {{'title', 'text'}} objects "
                        f"({type(e).__name__}: {e})") from None
    if not isinstance(raw_gold, list) or not all(isinstance(t, str) for t in raw_gold):
        raise TaskError(f"task {task.id}: payload['supporting'] must be a list of titles, got {raw_gold!r:.80}")
    return QADocs(docs, tuple(raw_gold))


def _load_records(path_or_name: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    from sleuth.tasks.records import read_records

    return read_records(path_or_name, split)


def hotpotqa_task(rec: dict[str, Any], split: str = "") -> Task:
    """One HotpotQA record (Hugging Face `hotpot_qa/distractor` layout) as a Task."""
    ctx = rec["context"]
    docs = tuple(Document(t, "".join(s).strip()) for t, s in zip(ctx["title"], ctx["sentences"], strict=True))
    supporting = tuple(dict.fromkeys(rec["supporting_facts"]["title"]))
    return Task(
        id=str(rec["id"]),
        question=rec["question"],
        answer=rec["answer"],
        payload={**QADocs(docs, supporting).to_payload(), "type": rec.get("type"), "level": rec.get("level")},
        split=split,
        source="hotpotqa",
    )


def musique_task(rec: dict[str, Any], split: str = "") -> Task:
    """One MuSiQue-Ans record as a Task (answer aliases kept as accepted answers)."""
    paras = sorted(rec["paragraphs"], key=lambda p: p["idx"])
    docs = tuple(Document(p["title"], p["paragraph_text"].strip()) for p in paras)
    supporting = tuple(p["title"] for p in paras if p["is_supporting"])
    return Task(
        id=str(rec["id"]),
        question=rec["question"],
        answer=rec["answer"],
        aliases=list(rec.get("answer_aliases") or []),
        payload={**QADocs(docs, supporting).to_payload(), "answerable": rec.get("answerable", True)},
        split=split,
        source="musique",
    )


def _convert(path: str | Path, split: str, to_task, kind: str) -> list[Task]:
    out = []
    for i, rec in enumerate(_load_records(path, split)):
        try:
            out.append(to_task(rec, split))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"record {i} of {path} is not in the {kind} layout ({type(e).__name__}: {e})") from e
    return out


def load_hotpotqa(path: str | Path, split: str = "") -> list[Task]:
    return _convert(path, split, hotpotqa_task, "HotpotQA")


def load_musique(path: str | Path, split: str = "") -> list[Task]:
    return _convert(path, split, musique_task, "MuSiQue")
