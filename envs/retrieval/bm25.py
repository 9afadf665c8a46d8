"""BM25 with two backends behind one interface, fed the same tokens (`text.tokenize`):

- `bm25s` (default): scores precomputed into a sparse matrix at index time, so a query is a sparse
  row sum — orders of magnitude faster than scoring every document per query.
- `rank_bm25`: the reference implementation (BM25Okapi), scoring every document for every query.

Where their scores differ: rank-bm25's BM25Okapi uses Robertson's idf, log((N - n + 0.5) / (n + 0.5)),
and replaces a negative idf (a term in more than half the documents) by epsilon × the mean idf; the
default bm25s method is Lucene's, idf = log(1 + (N - n + 0.5) / (n + 0.5)), always positive. bm25s also
drops the constant (k1 + 1) factor of the term weight, as Lucene does (rankings are unaffected). With
`method="robertson"`, bm25s scores × (k1 + 1) equal rank-bm25's wherever no term is that frequent (tested).
Defaults k1 = 0.9, b = 0.4 are Lucene's/Pyserini's, which BEIR's BM25 numbers used.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from sleuth.envs.retrieval.base import DocStore, Hit, read_meta, write_meta
from sleuth.envs.retrieval.corpus import Doc
from sleuth.envs.retrieval.text import tokenize, tokenize_many

BACKENDS = ("bm25s", "rank_bm25")


class BM25Index:
    def __init__(self, docs: list[Doc], backend: str = "bm25s", k1: float = 0.9, b: float = 0.4,
                 method: str = "lucene", progress: bool = False, _engine=None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown BM25 backend {backend!r}; known: {', '.join(BACKENDS)}")
        self.store = DocStore(docs)
        self.backend, self.k1, self.b, self.method = backend, k1, b, method
        self.engine = _engine if _engine is not None else self._build(progress)
        self._ids = [d.id for d in docs]

    def _build(self, progress: bool):
        corpus_tokens = tokenize_many([f"{d.title} {d.text}" for d in self.store.docs])
        if self.backend == "rank_bm25":
            from rank_bm25 import BM25Okapi

            return BM25Okapi(corpus_tokens, k1=self.k1, b=self.b)
        import bm25s

        engine = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        engine.index(corpus_tokens, show_progress=progress)
        return engine

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for one query."""
        toks = tokenize(query)
        if self.backend == "rank_bm25":
            return np.asarray(self.engine.get_scores(toks), dtype=np.float32)
        toks = [t for t in toks if t in self.engine.vocab_dict]
        return self.engine.get_scores(toks) if toks else np.zeros(len(self.store.docs), np.float32)

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        k = max(0, min(k, len(self.store.docs)))
        ids = self._ids
        out = []
        for q in queries:
            s = self.scores(q)
            top = np.argpartition(-s, k - 1)[:k] if 0 < k < len(s) else np.arange(len(s))[:k]
            top = top[np.argsort(-s[top], kind="stable")]
            top = top[s[top] > 0]  # a document sharing no term with the query is not a hit
            out.append(list(map(Hit, [ids[i] for i in top.tolist()], s[top].tolist())))
        return out

    def get(self, doc_id: str) -> Doc | None:
        return self.store.get(doc_id)

    def save(self, out: str | Path) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.store.save(out)
        if self.backend == "bm25s":
            self.engine.save(str(out / "bm25s"), show_progress=False)
        else:  # rank-bm25 has no format of its own; the pickle is ours, written and read only by us
            (out / "rank_bm25.pkl").write_bytes(pickle.dumps(self.engine))
        write_meta(out, kind="bm25", backend=self.backend, k1=self.k1, b=self.b, method=self.method,
                   n_docs=len(self.store.docs))

    @classmethod
    def load(cls, out: str | Path) -> BM25Index:
        out = Path(out)
        meta = read_meta(out)
        store = DocStore.load(out)
        if meta["backend"] == "bm25s":
            import bm25s

            engine = bm25s.BM25.load(str(out / "bm25s"), show_progress=False)
        else:
            engine = pickle.loads((out / "rank_bm25.pkl").read_bytes())
        return cls(store.docs, meta["backend"], meta["k1"], meta["b"], meta["method"], _engine=engine)
