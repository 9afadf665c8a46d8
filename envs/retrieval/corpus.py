"""Corpora for retrieval: `Doc`s read from JSONL (field names configurable), and the corpora the QA
tasks search over (every HotpotQA / MuSiQue paragraph, deduplicated; the 2WikiMultihopQA passages)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sleuth.tasks.base import Task
from sleuth.tasks.qa import qa_docs


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        yield from (line for line in f if line.strip())


def load_corpus(path: str | Path, id_field: str = "id", title_field: str = "title",
                text_field: str = "text") -> list[Doc]:
    """One Doc per JSONL line (.jsonl or .jsonl.gz). A list-valued text (e.g. SciFact's `abstract`) is joined
    with spaces; a missing id becomes the line number; a duplicate id is an error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus not found: {path}")
    docs, seen = [], set()
    for i, line in enumerate(_lines(path)):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i + 1}: not valid JSON ({e.msg})") from e
        if text_field not in rec:
            raise ValueError(f"{path}:{i + 1}: no {text_field!r} field (set the text field name)")
        text = rec[text_field]
        text = " ".join(text) if isinstance(text, list) else str(text)
        doc_id = str(rec.get(id_field, i))
        if doc_id in seen:
            raise ValueError(f"{path}:{i + 1}: duplicate id {doc_id!r}")
        seen.add(doc_id)
        docs.append(Doc(doc_id, str(rec.get(title_field, "")), text))
    if not docs:
        raise ValueError(f"corpus {path} holds no documents (one JSON object a line)")
    return docs


def write_corpus(docs: Iterable[Doc], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d.to_dict(), ensure_ascii=False) + "\n")


def corpus_from_tasks(tasks: Iterable[Task]) -> list[Doc]:
    """Every candidate paragraph of QA tasks (`qa_docs`), deduplicated. The id is the title, so a
    task's gold supporting titles are its gold ids; a second, different paragraph under a title already
    taken (MuSiQue splits articles into several) gets the id "title #2", and so on."""
    docs: dict[str, Doc] = {}
    seen: set[tuple[str, str]] = set()
    for t in tasks:
        for d in qa_docs(t, missing_ok=True).docs:
            key = (d.title, d.text)
            if key in seen:
                continue
            seen.add(key)
            doc_id, n = d.title, 1
            while doc_id in docs:
                n += 1
                doc_id = f"{d.title} #{n}"
            docs[doc_id] = Doc(doc_id, d.title, d.text)
    return list(docs.values())
