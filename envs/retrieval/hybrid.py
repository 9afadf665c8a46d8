"""Hybrid retrieval by reciprocal-rank fusion (Cormack et al., 2009): score(d) = Σ_r 1 / (c + rank_r(d)),
over the BM25 and dense rankings, each taken to `depth`; c = 60 as in the paper."""

from __future__ import annotations

from pathlib import Path

from sleuth.envs.retrieval.base import Hit, read_meta, write_meta
from sleuth.envs.retrieval.bm25 import BM25Index
from sleuth.envs.retrieval.corpus import Doc
from sleuth.envs.retrieval.dense import DenseIndex


def rrf(rankings: list[list[Hit]], k: int, c: float = 60.0) -> list[Hit]:
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.id] = fused.get(hit.id, 0.0) + 1.0 / (c + rank)
    best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [Hit(doc_id, score) for doc_id, score in best]


class HybridIndex:
    def __init__(self, bm25: BM25Index, dense: DenseIndex, depth: int = 100, c: float = 60.0):
        self.bm25, self.dense, self.depth, self.c = bm25, dense, depth, c

    @classmethod
    def build(cls, docs: list[Doc], progress: bool = False, **bm25_kwargs) -> HybridIndex:
        return cls(BM25Index(docs, progress=progress, **bm25_kwargs), DenseIndex(docs, progress=progress))

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        depth = max(k, self.depth)
        lexical, dense = self.bm25.search(queries, depth), self.dense.search(queries, depth)
        return [rrf([a, b], k, self.c) for a, b in zip(lexical, dense, strict=True)]

    def get(self, doc_id: str) -> Doc | None:
        return self.bm25.get(doc_id)

    def save(self, out: str | Path) -> None:
        out = Path(out)
        self.bm25.save(out / "bm25")
        self.dense.save(out / "dense")
        write_meta(out, kind="hybrid", depth=self.depth, c=self.c, n_docs=len(self.bm25.store.docs))

    @classmethod
    def load(cls, out: str | Path) -> HybridIndex:
        out = Path(out)
        meta = read_meta(out)
        return cls(BM25Index.load(out / "bm25"), DenseIndex.load(out / "dense"), meta["depth"], meta["c"])
