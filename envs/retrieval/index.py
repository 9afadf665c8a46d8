"""Build, persist and reload any index by kind; indexes reload without re-encoding."""

from __future__ import annotations

from pathlib import Path

from sleuth.envs.retrieval.base import Retriever, read_meta
from sleuth.envs.retrieval.bm25 import BM25Index
from sleuth.envs.retrieval.corpus import Doc
from sleuth.envs.retrieval.dense import DenseIndex
from sleuth.envs.retrieval.hybrid import HybridIndex

KINDS = ("bm25", "dense", "hybrid")


def build_index(docs: list[Doc], kind: str = "bm25", backend: str = "bm25s", progress: bool = True) -> Retriever:
    if kind == "bm25":
        return BM25Index(docs, backend=backend, progress=progress)
    if kind == "dense":
        return DenseIndex(docs, progress=progress)
    if kind == "hybrid":
        return HybridIndex.build(docs, progress=progress, backend=backend)
    raise ValueError(f"unknown index kind {kind!r}; known: {', '.join(KINDS)}")


def load_index(path: str | Path) -> Retriever:
    kind = read_meta(Path(path))["kind"]
    return {"bm25": BM25Index, "dense": DenseIndex, "hybrid": HybridIndex}[kind].load(path)
