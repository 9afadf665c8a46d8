"""The retriever interface every index (BM25, dense, hybrid, a remote server) implements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple, Protocol

from sleuth.envs.retrieval.corpus import Doc, load_corpus, write_corpus


class Hit(NamedTuple):  # a tuple: thousands are made per batch of queries, a frozen dataclass is 5x slower
    id: str
    score: float


class Retriever(Protocol):
    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]: ...

    def get(self, doc_id: str) -> Doc | None: ...


class DocStore:
    """The documents of an index, by id and by row."""

    def __init__(self, docs: list[Doc]):
        self.docs = docs
        self.by_id = {d.id: d for d in docs}

    def get(self, doc_id: str) -> Doc | None:
        return self.by_id.get(doc_id)

    def save(self, out: Path) -> None:
        write_corpus(self.docs, out / "docs.jsonl")

    @classmethod
    def load(cls, out: Path) -> DocStore:
        return cls(load_corpus(out / "docs.jsonl"))


def write_meta(out: Path, **meta) -> None:
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def read_meta(out: Path) -> dict:
    path = out / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"{out} is not a sleuth index (no meta.json)")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is damaged ({e}): build the index again") from None
    if not isinstance(meta, dict) or meta.get("kind") not in ("bm25", "dense", "hybrid"):
        raise ValueError(f"{path} names no index kind (bm25, dense, hybrid): not a sleuth index, or a damaged one")
    return meta
